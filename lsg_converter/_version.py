"""The package's version, in a module of its own so that any module can name it without importing the package root."""

__version__ = "0.5.0"
