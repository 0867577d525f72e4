"""The library's exceptions and the helpers that write their messages. Each message says what to do;
the CLI prints it on one line.

`exit_code` is the status `lsg-convert` exits with when the error stops it.
"""

from __future__ import annotations

import importlib.util
from typing import Iterable


def one_line(error: BaseException | str, limit: int | None = None) -> str:
    """The text of `error` on one line (white space folded), cut to `limit` characters."""
    return " ".join(str(error).split())[:limit]


def listed(names: Iterable[str], shown: int = 8) -> str:
    """'a, b, c' or 'a, b, ... and 5 more'."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def is_count(value: object) -> bool:
    """Whether `value` is a whole number of at least 1 (a bool is not, though Python counts it an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class LSGError(Exception):
    """Base class of every error lsg_converter raises on purpose."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.exit_code = exit_code


class InvalidSettingsError(LSGError, ValueError, exit_code=2):
    """A conversion setting (length, block sizes, sparsity type, ...) cannot work, or the source has a
    setting LSG cannot carry. Exit code 2, as for any other command-line mistake."""


class UnknownSettingError(InvalidSettingsError, TypeError, exit_code=2):
    """A keyword argument that no conversion setting or config key has (a misspelling)."""


class UnsupportedModelError(LSGError, exit_code=3):
    """The source's model type or head cannot be converted."""


class SourceNotFoundError(LSGError, exit_code=4):
    """The model to convert cannot be found or read."""


class OutputExistsError(LSGError, exit_code=5):
    """The output folder exists and is not empty, and overwriting was not asked for."""


class OutputOverlapsSourceError(OutputExistsError, exit_code=5):
    """The output folder is the source folder, holds it or lies inside it: saving there, overwriting or
    not, would delete or mix with the source's files, so it is refused."""


class OutputNotReplaceableError(OutputExistsError, exit_code=5):
    """The output path is a file, or a folder that holds no model's config.json (no conversion wrote it):
    it is never replaced, overwrite or not, so that a user's own files are never deleted."""


class CorruptCheckpointError(LSGError, exit_code=6):
    """The source's files exist but cannot be read (truncated or corrupt weights, broken config)."""


class UnsafeCheckpointError(CorruptCheckpointError, exit_code=6):
    """The source's pytorch_model.bin calls something that torch's weights_only loader blocks: it is
    refused rather than loaded unsafely (convert it to safetensors where the source is trusted)."""


class HubError(LSGError, exit_code=7):
    """The Hugging Face Hub is unreachable or refuses the token or the repository."""


class MissingDependencyError(LSGError, ImportError, exit_code=8):
    """A package the run needs is not installed: the message names the one to install."""


class OutputNotWritableError(LSGError, exit_code=9):
    """The output folder cannot be written (permissions, a read-only file system, no space left, a
    file where a folder must be): nothing is left there."""


class TrainingTextsError(LSGError, ValueError, exit_code=10):
    """The texts given to adapt a model to long documents cannot train it (none, or none long enough)."""


class InsufficientMemoryError(LSGError, MemoryError, exit_code=11):
    """The conversion needs more memory than the system has available: refused before anything is allocated
    (an estimate, which skip_memory_check=True / --skip-memory-check passes over), or run out of."""


def pip_name(module: str) -> str:
    """The package pip installs for the top-level module `module` ("sentence_transformers" ->
    "sentence-transformers")."""
    return module.split(".")[0].replace("_", "-")


def require(module: str, purpose: str) -> None:
    """Raise `MissingDependencyError` if `module` cannot be imported; `purpose` says what needs it."""
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"{purpose} needs the package {pip_name(module)}, which is not installed: pip install {pip_name(module)}",
            name=module,
        )


def missing_package(error: ImportError) -> MissingDependencyError:
    """`error` (an import that failed) as a `MissingDependencyError` naming the package to install."""
    if not error.name:
        return MissingDependencyError(f"{one_line(error)}: reinstall or upgrade the package that raised it")
    package = pip_name(error.name)
    return MissingDependencyError(
        f"{one_line(error)}: the package {package} is missing or too old: pip install -U {package}", name=error.name
    )
