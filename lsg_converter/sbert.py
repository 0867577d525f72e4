"""sentence-transformers sources stay sentence-transformers models: their module pipeline travels with the conversion.

A sentence-transformers checkpoint is a transformers model at its root plus ``modules.json`` (the
pipeline: Transformer -> Pooling -> Dense -> Normalize ...), one folder per module and
``sentence_bert_config.json``. The converter reads the pipeline (`carried_pipeline`) and attaches it to
the converted model (`attach_pipeline`); `save_converted` writes it beside the weights (`write_pipeline`) with
``max_seq_length`` set to the new length, so that ``SentenceTransformer(folder, trust_remote_code=True)``
builds the source's pipeline on the LSG model. sentence-transformers passes ``trust_remote_code`` on
to the model, config and tokenizer it loads, so the folder needs nothing more.

Named ``sbert`` (the project's old name) so that the module never shadows the ``sentence_transformers`` package.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from huggingface_hub import is_offline_mode, snapshot_download
from transformers import PreTrainedModel
from transformers.utils import cached_file, logging

from .checkpoint import tensor_names
from .errors import CorruptCheckpointError, one_line
from .sources import hub_errors, local_source

logger = logging.get_logger(__name__)

MODULES_FILE = "modules.json"
TRANSFORMER_SETTINGS_FILE = "sentence_bert_config.json"
PACKAGE_SETTINGS_FILE = "config_sentence_transformers.json"
PIPELINE_ATTRIBUTE = "sentence_transformers_pipeline"
TRANSFORMER_TYPE = "sentence_transformers.models.Transformer"
# module classes that read text with a model of their own: only the first module (the converted model) may
MODEL_MODULES = ("Transformer", "MLMTransformer", "CLIPModel", "Router", "Asym")
MODULE_KEYS = {"idx", "name", "path", "type"}  # of each modules.json entry
# Model types whose encoder sentence-transformers loads with a transformers class of its own choosing
# (T5EncoderModel for any T5Config, its subclasses included), never with a folder's remote code: it would
# run a converted folder as the dense source model. Their pipeline reads the model with `LSG_MODULE_TYPE`
# (lsg_sentence_transformer.py, written beside it), which loads the folder's LSG encoder.
OWN_ENCODER_CLASS_TYPES = ("t5", "mt5", "umt5")
LSG_MODULE_FILE = Path(__file__).with_name("lsg_sentence_transformer.py")
LSG_MODULE_TYPE = "lsg_sentence_transformer.LSGTransformer"


@dataclass(frozen=True)
class SentencePipeline:
    """The sentence-transformers pipeline of a source, as the converted model's folder will hold it.

    Attributes:
        folder: local folder holding the source's module folders (the source itself, or its Hub snapshot).
        modules: the ``modules.json`` entries carried over; the first (the converted model) at path "".
        transformer_settings: the source's ``sentence_bert_config.json`` ({} when it has none).
        package_settings: the source's ``config_sentence_transformers.json`` (prompts, similarity
            function, ...), None when it has none.
        max_seq_length: the converted model's length, written as ``max_seq_length``.
    """

    folder: Path
    modules: tuple[dict[str, Any], ...]
    transformer_settings: dict[str, Any]
    package_settings: dict[str, Any] | None
    max_seq_length: int

    @property
    def module_names(self) -> list[str]:
        """Class names of the modules in order, e.g. ["Transformer", "Pooling", "Normalize"]."""
        return [module["type"].rpartition(".")[2] for module in self.modules]


def carried_pipeline(
    model: PreTrainedModel, source: str, token: str | bool | None, max_seq_length: int
) -> SentencePipeline | None:
    """The sentence-transformers pipeline of `source` that `model` (the LSG model to build, or its dry run
    on the meta device) carries over: None for a plain transformers source. `attach_pipeline` then gives
    it to the converted model, for `write_pipeline` to save.

    A local folder is read as it is (the Hub is never asked); for a Hub id, ``modules.json`` is resolved
    as transformers resolves ``config.json`` and the module folders come from the same snapshot.
    Every file of the modules carried over is read (CorruptCheckpointError for one that cannot be, as
    for ``modules.json``), so the pipeline written loads. Logs the modules carried over; warns about each
    module that cannot be carried, and leaves it out.
    Only the bare model (which outputs the token states the pipeline pools) carries the pipeline: for
    a head (a classifier...), which sentence-transformers would load without its head, a warning says
    that the pipeline is left out and the model is a transformers one. A T5 encoder's pipeline reads it
    with `LSG_MODULE_TYPE`.
    """
    if model.base_model is not model:
        _leave_pipeline_out(model, source, token)
        return None
    pipeline = _read_pipeline(source, token, max_seq_length)
    if pipeline is None:
        return None
    if model.config.model_type.removeprefix("lsg-") in OWN_ENCODER_CLASS_TYPES:
        pipeline = replace(pipeline, modules=({**pipeline.modules[0], "type": LSG_MODULE_TYPE}, *pipeline.modules[1:]))
    logger.info(
        f"{source} is a sentence-transformers model: its pipeline ({' -> '.join(pipeline.module_names)}) "
        f"is carried over with max_seq_length {max_seq_length}; save_converted writes it."
    )
    return pipeline


def attach_pipeline(model: PreTrainedModel, pipeline: SentencePipeline | None) -> None:
    """Give `model` the pipeline (`carried_pipeline`) as ``model.sentence_transformers_pipeline``."""
    setattr(model, PIPELINE_ATTRIBUTE, pipeline)


def _leave_pipeline_out(model: PreTrainedModel, source: str, token: str | bool | None) -> None:
    """Warn when `source` has a pipeline that `model`, a head, leaves out."""
    if has_pipeline(source, token):
        logger.warning(
            f"{source} is a sentence-transformers model, but {type(model).__name__} is no bare model: its "
            "sentence-transformers pipeline would load the model without its head, so it is left out; "
            "load the converted model with transformers."
        )


def has_pipeline(source: str, token: str | bool | None) -> bool:
    """Whether `source` (a folder or a Hub id) is a sentence-transformers model: it has a ``modules.json``."""
    return _resolve(source, local_source(source), MODULES_FILE, token) is not None


def pipeline_of(model: PreTrainedModel) -> SentencePipeline | None:
    """The sentence-transformers pipeline the converter attached to `model` (None for other models)."""
    return getattr(model, PIPELINE_ATTRIBUTE, None)


def write_pipeline(model: PreTrainedModel, folder: str | os.PathLike) -> None:
    """Write `model`'s sentence-transformers files into `folder`, where the model is saved: modules.json,
    each module's folder as in the source, sentence_bert_config.json (max_seq_length = the new length)
    and config_sentence_transformers.json. Nothing for a model without a pipeline."""
    pipeline = pipeline_of(model)
    if pipeline is None:
        return
    folder = Path(folder)
    _write_json(folder / MODULES_FILE, list(pipeline.modules))
    if pipeline.modules[0]["type"] == LSG_MODULE_TYPE:
        shutil.copyfile(LSG_MODULE_FILE, folder / LSG_MODULE_FILE.name)
    for module in pipeline.modules[1:]:
        module_folder = pipeline.folder / module["path"]
        if module_folder.is_dir():  # Normalize has no files
            shutil.copytree(module_folder, folder / module["path"], dirs_exist_ok=True)
    _write_json(
        folder / TRANSFORMER_SETTINGS_FILE,
        {**pipeline.transformer_settings, "max_seq_length": pipeline.max_seq_length},
    )
    if pipeline.package_settings is not None:
        _write_json(folder / PACKAGE_SETTINGS_FILE, pipeline.package_settings)


def _read_pipeline(source: str, token: str | bool | None, max_seq_length: int) -> SentencePipeline | None:
    local_folder = local_source(source)
    modules_file = _resolve(source, local_folder, MODULES_FILE, token)
    if modules_file is None:
        return None
    source_modules = _read_json(modules_file, list)
    if not source_modules or not all(map(_is_module_entry, source_modules)):
        raise CorruptCheckpointError(
            f"{modules_file} lists no sentence-transformers modules (each with {', '.join(sorted(MODULE_KEYS))}): "
            "fix or restore the file."
        )
    folder = modules_file.parent
    if local_folder is None:
        folder = _hub_snapshot(source, folder.name, [module["path"] for module in source_modules], token)
    modules = [_as_model_module(source_modules[0])] + [
        module for module in source_modules[1:] if _can_carry(module)
    ]
    for index, module in enumerate(modules):
        module["idx"] = index
        if index and (folder / module["path"]).is_dir():
            _check_module_files(folder / module["path"])
    return SentencePipeline(
        folder=folder,
        modules=tuple(modules),
        transformer_settings=_read_json(folder / TRANSFORMER_SETTINGS_FILE) or {},
        package_settings=_read_json(folder / PACKAGE_SETTINGS_FILE),
        max_seq_length=max_seq_length,
    )


def _check_module_files(module_folder: Path) -> None:
    """CorruptCheckpointError naming the first file of `module_folder` (a module carried over) that cannot
    be read: JSON that does not parse, weights whose header or length is wrong (`checkpoint.tensor_names`).
    sentence-transformers reads them all when it loads the pipeline."""
    for path in sorted(module_folder.rglob("*")):
        if path.suffix == ".json":
            _read_json(path, (dict, list))
        elif path.suffix in (".safetensors", ".bin"):
            tensor_names([path])


def _is_module_entry(module: Any) -> bool:
    """Whether `module` is a modules.json entry: idx, name, path and type, the last two strings."""
    return (
        isinstance(module, dict)
        and MODULE_KEYS <= module.keys()
        and isinstance(module["path"], str)
        and isinstance(module["type"], str)
    )


def _resolve(source: str, local_folder: Path | None, name: str, token: str | bool | None) -> Path | None:
    """`name` in `local_folder` (the source on disk, see `sources.local_source`), else in the Hub repository
    `source` (None when it has none)."""
    if local_folder is not None:
        path = local_folder / name
        return path if path.is_file() else None
    resolved = cached_file(
        source, name, token=token,
        _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
    )
    return Path(resolved) if resolved else None


def _hub_snapshot(repo_id: str, revision: str, module_paths: list[str], token: str | bool | None) -> Path:
    """The snapshot folder of `repo_id` at `revision` with its sentence-transformers files downloaded; with
    HF_HUB_OFFLINE=1, the cached one (huggingface_hub 1.26 to 2.1 would still ask the Hub for the files of a commit)."""
    patterns = [TRANSFORMER_SETTINGS_FILE, PACKAGE_SETTINGS_FILE] + [f"{path}/*" for path in module_paths if path]
    with hub_errors(f"download the sentence-transformers modules of {repo_id!r}", "check the network and token="):
        return Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=patterns, token=token, local_files_only=is_offline_mode()
            )
        )


def _as_model_module(module: dict[str, Any]) -> dict[str, Any]:
    """The first module: the converted model, saved at the folder's root."""
    module = {**module, "path": ""}
    if not module["type"].startswith("sentence_transformers."):
        logger.warning(
            f"The sentence-transformers module {module['name']} ({module['type']}) runs code of its own, which is "
            f"not carried over: the converted pipeline reads the model with {TRANSFORMER_TYPE}."
        )
        module["type"] = TRANSFORMER_TYPE
    return module


def _can_carry(module: dict[str, Any]) -> bool:
    """Whether a module after the first can be copied as it is; warns (saying why) when not."""
    path = PurePosixPath(module["path"])
    if not module["type"].startswith("sentence_transformers."):
        reason = "its code is not part of sentence-transformers"
    elif module["type"].rpartition(".")[2] in MODEL_MODULES:
        reason = "it reads text with a model of its own, which is not converted"
    elif not path.parts or path.is_absolute() or ".." in path.parts:
        reason = f"its path {str(path)!r} is no folder of its own inside the model"
    else:
        return True
    logger.warning(
        f"The sentence-transformers module {module['name']} ({module['type']}) cannot be carried over ({reason}): "
        "the converted pipeline leaves it out."
    )
    return False


def _read_json(path: Path, kind: type | tuple[type, ...] = dict) -> Any:
    """The JSON object (or list, with `kind=list`; either, with `kind=(dict, list)`) in `path`, None when there is no such file;
    CorruptCheckpointError when it cannot be read or holds something else."""
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CorruptCheckpointError(f"Cannot read {path} ({one_line(error, 200)}): fix or restore the file.") from error
    if not isinstance(content, kind):
        raise CorruptCheckpointError(f"{path} holds no JSON {'list' if kind is list else 'object'}: fix or restore the file.")
    return content


def _write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
