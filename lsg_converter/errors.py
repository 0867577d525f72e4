"""The library's exceptions. Each message says what to do; the CLI prints it on one line."""


class LSGError(Exception):
    """Base class of every error lsg_converter raises on purpose."""

    exit_code = 1


class SourceNotFoundError(LSGError):
    """The model to convert cannot be found or read."""

    exit_code = 2


class UnsupportedModelError(LSGError):
    """The source's model type or head cannot be converted."""

    exit_code = 3


class InvalidSettingsError(LSGError):
    """A conversion setting (length, block sizes, sparsity type, ...) cannot work."""

    exit_code = 4


class OutputExistsError(LSGError):
    """The output folder exists and is not empty, and overwriting was not asked for."""

    exit_code = 5


class CorruptCheckpointError(LSGError):
    """The source's files exist but cannot be read (truncated or corrupt weights, broken config)."""

    exit_code = 6


class HubError(LSGError):
    """The Hugging Face Hub is unreachable or refuses the token or the repository."""

    exit_code = 7
