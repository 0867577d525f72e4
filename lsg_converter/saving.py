"""Save a converted model into a folder, atomically: weights, config with auto_map, remote code,
tokenizer, model card and sentence-transformers pipeline, with the file modes the user's umask gives."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from huggingface_hub import ModelCard
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .errors import OutputExistsError
from .sbert import write_pipeline


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
    target = check_output_folder(save_path, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()  # mode 0777 minus the umask
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if card is not None:
            card.save(staging / "README.md")
        write_pipeline(model, staging)
        _give_files_the_folder_mode(staging)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _give_files_the_folder_mode(folder: Path) -> None:
    """Give every file under `folder` the mode a new file gets under the umask that gave `folder` its
    mode (its read and write bits): some writers (safetensors) create their files 0600."""
    folder_mode = folder.stat().st_mode & 0o777
    for path in folder.rglob("*"):
        path.chmod(folder_mode if path.is_dir() else folder_mode & 0o666)


def check_output_folder(save_path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Resolved `save_path`; OutputExistsError if it holds anything and `overwrite` is False."""
    target = Path(save_path).resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        raise OutputExistsError(f"{target} already exists and is not empty: choose another path or pass overwrite=True.")
    return target
