"""The source's weight files, read without loading the model: which files, which tensor names, a few tensors.

The converter reads them before it builds anything: to refuse a folder without weights or a pickle that
torch's safe loader blocks, to see whether the source holds a pooler, and to size the buffers that keep
the source tensors its LSG class does not use.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from huggingface_hub.hf_api import ModelInfo
from safetensors import SafetensorError, safe_open
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, cached_file

from .errors import CorruptCheckpointError, SourceNotFoundError, UnsafeCheckpointError, one_line
from .sources import download_hub_files, hub_file_names

# In the order transformers prefers them.
WEIGHT_FILE_NAMES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
# torch's weights_only unpickler names what it blocked: "Unsupported global: GLOBAL posix.system ..."
BLOCKED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def weight_files(source: str, token: str | bool | None = None, record: ModelInfo | None = None) -> list[Path]:
    """The weight files of `source` (a folder or a Hub id): one file, or the shards its index lists.

    With `record` (the Hub's record of a Hub id, see `sources.look_up_source`) the file is chosen from
    the files the record lists and downloaded with `sources.download_hub_files` (a failing download:
    HubError, in seconds); without it, the first of `WEIGHT_FILE_NAMES` found is taken."""
    names = WEIGHT_FILE_NAMES if record is None else [name for name in WEIGHT_FILE_NAMES if name in hub_file_names(record)]
    try:
        for name in names:
            if record is not None:
                download_hub_files(record, [name], token)
            found = cached_file(source, name, token=token, _raise_exceptions_for_missing_entries=False)
            if found:
                break
        else:
            raise SourceNotFoundError(
                f"{source} has a config.json but no weights ({', '.join(WEIGHT_FILE_NAMES)}): the weights are missing; "
                "download them too, or save the model again with save_pretrained."
            )
        if not name.endswith(".index.json"):
            return [Path(found)]
        shards = sorted(set(json.loads(Path(found).read_text())["weight_map"].values()))
        if record is not None:
            download_hub_files(record, shards, token)
        return [Path(cached_file(source, shard, token=token)) for shard in shards]
    except (OSError, ValueError, KeyError) as error:
        raise CorruptCheckpointError(
            f"Cannot read the weight files of {source!r} ({one_line(error, 300)}): download or save the model again."
        ) from error


def tensor_names(files: list[Path]) -> set[str]:
    """Names of every tensor in `files`, read without loading the tensors (safetensors headers, or
    pickles mapped into memory by torch's weights_only loader)."""
    names: set[str] = set()
    for file in files:
        if file.suffix == ".safetensors":
            with _opened_safetensors(file) as tensors:
                names.update(tensors.keys())
        else:
            names.update(_load_pickle(file))
    return names


def read_tensors(files: list[Path], names: set[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` (those of `files` that hold them) on the CPU."""
    found: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with _opened_safetensors(file) as tensors:
                found.update({name: tensors.get_tensor(name) for name in names & set(tensors.keys())})
        else:
            state = _load_pickle(file)
            found.update({name: state[name] for name in names & set(state)})
    return found


def _opened_safetensors(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as error:
        raise _corrupt(file, error) from error


def _load_pickle(file: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin through torch's weights_only loader (never anything less safe)."""
    try:
        try:
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            return torch.load(file, map_location="cpu", weights_only=True)  # the pre-zip format cannot be mapped
    except pickle.UnpicklingError as error:
        blocked = BLOCKED_GLOBAL.search(str(error))
        if "Weights only load failed" in str(error) and blocked:
            raise UnsafeCheckpointError(
                f"Refused to load {file.name} for safety: its pickle calls {blocked.group(1)}, which torch's safe loader "
                "(weights_only) blocks. In an environment you trust, load it and save it as model.safetensors "
                "(save_pretrained(..., safe_serialization=True)), then convert that folder."
            ) from error
        raise _corrupt(file, error) from error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise _corrupt(file, error) from error


def _corrupt(file: Path, error: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Cannot read the weights in {file} ({one_line(error, 200)}): the file is truncated or corrupt; "
        "download or save the model again."
    )
