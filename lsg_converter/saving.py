"""Save a converted model into a folder, atomically: weights, config with auto_map, remote code,
tokenizer, model card and sentence-transformers pipeline, with the file modes the user's umask gives."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from huggingface_hub import ModelCard
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .errors import (
    OutputExistsError,
    OutputNotReplaceableError,
    OutputNotWritableError,
    OutputOverlapsSourceError,
    listed,
)
from .sbert import pipeline_of, write_pipeline

try:  # what safetensors raises for a failed write (no space left on device), where it has a name
    from safetensors import SafetensorError
except ImportError:  # older safetensors: its errors are OSErrors
    SafetensorError = OSError

logger = logging.get_logger(__name__)


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
    so an interrupted save leaves nothing behind. With `overwrite=True` an earlier conversion's output
    (a folder holding a model's config.json) is replaced: moved aside, the new folder moved in, then
    removed; any failure puts it back. A file, or a folder of anything else, is never replaced (see
    `check_output_folder`). The folder and its files get the permissions the user's umask gives new
    ones (0755 and 0644 under umask 022), the weights included.
    """
    target = check_output_folder(save_path, overwrite, source=getattr(model.config, "_name_or_path", None))
    if tokenizer is None and pipeline_of(model) is not None:
        logger.warning(
            f"The sentence-transformers pipeline is saved to {target} without a tokenizer (the source's does not "
            "fit the model): SentenceTransformer cannot load it until one is saved beside it "
            "(tokenizer.save_pretrained(folder) with a tokenizer whose special ids match the config's)."
        )
    with staged_folder(target, overwrite) as staging:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if card is not None:
            card.save(staging / "README.md")
        write_pipeline(model, staging)
    return target


@contextlib.contextmanager
def staged_folder(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """A staging folder beside `target` (a checked output, see `check_output_folder`) to write into; when
    the block ends, its files get the folder's mode and it takes the place of `target`, which is checked
    again (it may have changed since) and replaced atomically (see `_move_into_place`). An OS or
    safetensors error is an `OutputNotWritableError` (one line); whatever happens, nothing half-written
    is left and an earlier output is either replaced or as it was."""
    staging = None
    try:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.parent / f".{target.name}.{secrets.token_hex(4)}.partial"
            staging.mkdir()  # mode 0777 minus the umask
            yield staging
            _give_files_the_folder_mode(staging)
        except (OSError, SafetensorError) as error:
            kept = " and what was there is as it was" if target.exists() else ""
            raise OutputNotWritableError(
                f"Cannot write {target}: {_reason(error)}. Nothing was written there{kept}: free space or choose "
                "another folder (save_path=)."
            ) from error
        _check_replaceable(target, overwrite)
        _move_into_place(staging, target)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename `staging` to `target`. An existing `target` is moved aside first (refused, as it was, if it
    cannot be: a mount point, for one), then removed once the new folder is in place; if the new folder
    cannot be moved in (an error or a Ctrl-C), the old one is moved back."""
    aside = None
    if target.exists():
        aside = target.parent / f".{target.name}.{secrets.token_hex(4)}.replaced"
        try:
            target.rename(aside)
        except OSError as error:
            raise OutputNotWritableError(
                f"Cannot replace {target}: it cannot be moved aside ({_reason(error)}; a mount point cannot be), so it "
                "is left as it was and nothing was saved. Choose another save_path=, a new folder inside it for one."
            ) from error
    try:
        staging.rename(target)
    except BaseException as error:
        back = "" if aside is None else _moved_back(aside, target)
        if not isinstance(error, OSError):
            raise
        raise OutputNotWritableError(
            f"Cannot write {target}: moving the new folder into place failed ({_reason(error)}){back}. Choose "
            "another save_path=."
        ) from error
    if aside is not None:
        try:
            shutil.rmtree(aside)
        except OSError as error:
            logger.warning(
                f"Saved to {target}, but the folder it replaced, moved to {aside}, cannot be removed ({_reason(error)}): "
                "delete it."
            )


def _moved_back(aside: Path, target: Path) -> str:
    """Move the earlier output at `aside` back to `target`; what became of it, as the end of a sentence."""
    try:
        aside.rename(target)
    except OSError as error:
        return f"; the previous output cannot be moved back ({_reason(error)}): it is at {aside}"
    return "; the previous output is back in place"


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
    * OutputNotReplaceableError if it is a file, or a folder that holds anything but no model's
      config.json (overwrite or not: no conversion wrote it, it is the user's);
    * OutputExistsError if it holds a model (an earlier conversion's output) and `overwrite` is False;
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
    _check_replaceable(target, overwrite)
    _check_writable(target)
    return target


def _check_replaceable(target: Path, overwrite: bool) -> None:
    """Whether what is at `target` may be written over: nothing, an empty folder, or, with `overwrite`, a
    folder holding a model's config.json (an earlier conversion's output). See `check_output_folder`."""
    if not target.exists():
        return
    if not target.is_dir():
        raise OutputNotReplaceableError(
            f"{target} is a file, not a model folder: it is never replaced, overwrite or not. Choose another save_path=."
        )
    try:
        entries = sorted(path.name for path in target.iterdir())
    except OSError as error:
        raise OutputNotWritableError(f"Cannot read {target} ({_reason(error)}): choose another save_path=.") from error
    if not entries:
        return
    if not _holds_a_model(target):
        raise OutputNotReplaceableError(
            f"{target} holds {listed(entries)} and no model's config.json: only an earlier conversion's output is "
            "replaced, overwrite or not. Choose another save_path= (a new or empty folder)."
        )
    if not overwrite:
        raise OutputExistsError(f"{target} already holds a model: choose another path or pass overwrite=True to replace it.")


def _holds_a_model(folder: Path) -> bool:
    """Whether `folder` has a model's config.json (a JSON object naming its model_type), as every saved model does."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model_type"), str)


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
