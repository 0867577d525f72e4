"""Save a converted model into a folder, atomically: weights, config with auto_map, remote code,
tokenizer, model card and sentence-transformers pipeline, with the file modes the user's umask gives."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from huggingface_hub import ModelCard
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .errors import OutputExistsError, OutputNotWritableError, OutputOverlapsSourceError
from .sbert import write_pipeline

try:  # what safetensors raises for a failed write (no space left on device), where it has a name
    from safetensors import SafetensorError
except ImportError:  # older safetensors: its errors are OSErrors
    SafetensorError = OSError


def save_converted(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    save_path: str | os.PathLike,
    overwrite: bool = False,
    card: ModelCard | None = None,
) -> Path:
    """Save model (weights, config with auto_map, remote code), tokenizer and model card into `save_path`, atomically.

    `card` is the README.md (a huggingface_hub ModelCard, see `lsg_converter.model_card`: pass it the same
    `save_path=` so that its usage snippet loads this folder); none by default.

    Everything is written to a temporary folder beside `save_path` and renamed into place at the end,
    so an interrupted save leaves nothing behind. An existing non-empty folder is only replaced with
    `overwrite=True`. The folder and its files get the permissions the user's umask gives new ones
    (0755 and 0644 under umask 022), the weights included.
    """
    target = check_output_folder(save_path, overwrite, source=getattr(model.config, "_name_or_path", None))
    with staged_folder(target) as staging:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if card is not None:
            card.save(staging / "README.md")
        write_pipeline(model, staging)
    return target


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A staging folder beside `target` (a checked output, see `check_output_folder`) to write into; when
    the block ends, its files get the folder's mode and it replaces `target`. An OS or safetensors error
    is an `OutputNotWritableError` (one line); whatever happens, nothing half-written is left."""
    staging = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.{secrets.token_hex(4)}.partial"
        staging.mkdir()  # mode 0777 minus the umask
        yield staging
        _give_files_the_folder_mode(staging)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staging.rename(target)
    except (OSError, SafetensorError) as error:
        raise OutputNotWritableError(
            f"Cannot write {target}: {_reason(error)}. Nothing was written there: free space or choose another "
            "folder (save_path=)."
        ) from error
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _reason(error: BaseException) -> str:
    """What an OS error says went wrong, on one line ("No space left on device: '/out/.x.partial'")."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return " ".join(str(error).split())


def _give_files_the_folder_mode(folder: Path) -> None:
    """Give every file under `folder` the mode a new file gets under the umask that gave `folder` its
    mode (its read and write bits): some writers (safetensors) create their files 0600."""
    folder_mode = folder.stat().st_mode & 0o777
    for path in folder.rglob("*"):
        path.chmod(folder_mode if path.is_dir() else folder_mode & 0o666)


def check_output_folder(
    save_path: str | os.PathLike, overwrite: bool = False, source: str | os.PathLike | None = None
) -> Path:
    """Resolved `save_path`, checked before anything is written or loaded:

    * OutputOverlapsSourceError if it is the `source` folder, holds it or lies inside it (overwrite or not);
    * OutputExistsError if it holds anything and `overwrite` is False;
    * OutputNotWritableError if its folder cannot be created or written (the nearest existing folder on
      its path is read-only to this user, or a file stands where a folder must be).
    """
    target = Path(save_path).expanduser().resolve()
    source_folder = Path(source).expanduser() if source else None
    if source_folder is not None and source_folder.is_dir():
        source_folder = source_folder.resolve()
        if target == source_folder or target.is_relative_to(source_folder) or source_folder.is_relative_to(target):
            where = (
                "is the source folder" if target == source_folder
                else "lies inside the source folder" if target.is_relative_to(source_folder)
                else f"holds the source folder {source_folder}"
            )
            raise OutputOverlapsSourceError(
                f"{target} {where}: saving there would delete or mix with the source's files, overwrite or not. "
                "Choose a save_path= outside the source."
            )
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        raise OutputExistsError(f"{target} already exists and is not empty: choose another path or pass overwrite=True.")
    _check_writable(target)
    return target


def _check_writable(target: Path) -> None:
    """OutputNotWritableError unless the folder that will hold `target` can be created and written."""
    existing = target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputNotWritableError(f"Cannot write {target}: {existing} is a file, not a folder. Choose another save_path=.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputNotWritableError(
            f"Cannot write {target}: {existing} is not writable by this user. Choose a folder you can write to (save_path=)."
        )


def weights_size(model: PreTrainedModel) -> tuple[int, int]:
    """(bytes of the model's weights, bytes of them in its position tables), as saved: each tensor once."""
    from .architectures import find_architecture

    tensors = {tensor.data_ptr(): tensor for tensor in model.state_dict().values()}
    tables = find_architecture(model.config.model_type).position_tables_in(model.base_model).values()
    total = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    positions = sum(table.weight.numel() * table.weight.element_size() for table in tables)
    return total, positions


def readable_size(size: int) -> str:
    """'1.6 GB', '87.4 MB', '512 kB': decimal units, as file managers show them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
