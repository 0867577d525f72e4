"""Conversion: load a source checkpoint -> LSG config -> copy weights -> global tokens -> extend positions."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import logging as pylogging
import os
import pickle
import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch import nn
from huggingface_hub import is_offline_mode
from safetensors import SafetensorError
import transformers
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import cached_file, logging

from .architectures import CAUSAL_HEAD_SUFFIXES, Architecture, find_architecture
from .checkpoint import read_tensors, tensor_names, weight_files
from .errors import (
    CorruptCheckpointError,
    InvalidSettingsError,
    OutputExistsError,
    SourceNotFoundError,
    UnknownSettingError,
    one_line,
)
from .hub import hub_errors, hub_model_info, is_hub_id, local_source
from .models.lsg_attention import uses_sparse_keys
from .models.lsg_model import (
    KEPT_WEIGHTS_KEY,
    MAX_GLOBAL_TOKENS,
    POOLER_KEY,
    SEQ2SEQ_DEFAULTS,
    is_reference_config,
    validate_lsg_settings,
)
from .sbert import carry_pipeline, write_pipeline

logger = logging.get_logger(__name__)

# How the learned positions reach the new length (see LSGConverter).
POSITION_TILINGS = ("body", "table")
# LSG settings a conversion uses unless told otherwise; block_size is derived from the source (see
# `window_block_size`), the other keys keep the config defaults (those of the 2023 reference).
CONVERSION_DEFAULTS: dict[str, Any] = {"sparsity_type": "none", "num_global_tokens": 1}
# tokenizer_config.json keys that transformers copies from tokenizer.json's truncation and padding
TOKENIZER_LENGTH_SETTINGS = ("max_length", "stride", "truncation_strategy", "pad_to_multiple_of")


class LSGConverter:
    """Converts a pretrained BERT-family checkpoint into an LSG model reading `max_sequence_length` tokens.

    Default settings (chosen on all-MiniLM-L6-v2 and Shakespeare, see the README's "Extrapolation
    quality"): local attention only (``sparsity_type="none"``), one global token ([CLS] at position 0),
    ``block_size`` = a third of the source's body positions (170 for a 512-position model) and
    ``position_tiling="body"``. Each block then sees its previous, own and next block: 510 tokens,
    exactly the body of one training window, with the positions that window had, plus the global
    [CLS]. Any LSG setting passed to `convert_from_pretrained` replaces these.

    Args:
        max_sequence_length: length the converted model accepts; learned position embeddings are
            extended to it (see `position_tiling`), sinusoidal ones regenerated.
        position_tiling: how learned positions beyond the source's table are filled. ``"body"``
            (default): the source table stays as it is, then its body rows (1 to P - 2 of a P-row
            table: the positions text takes between [CLS] and the last [SEP] of a full window)
            repeat, so every stretch of P - 2 tokens reads like the body of one training window.
            ``"table"``: the whole table repeats (the 2023 reference; body tokens then also take the
            [CLS] and [SEP] positions).
        random_global_init: draw the global tokens from the word-embedding distribution instead of
            [CLS]/[MASK] + positions.
        global_positional_stride: stride between the source positions given to successive global tokens.
        keep_first_global_token: when the source is already LSG, keep its global token 0 and initialise
            the others afresh (as the 2023 reference does).
        resize_lsg: when the source is already LSG, only resize the positions (keep all global tokens).
        reinit_global_tokens: when the source is already LSG, initialise all its global tokens afresh.
            By default an LSG source (ours or a 2023 reference checkpoint) keeps its global tokens, so
            that upgrading or resizing it keeps its outputs.
        use_token_ids: add the token-type-0 embedding to the global tokens, where the model has one.
        seed: seed of every random draw of the conversion (the global RNG is left untouched).

    Any other keyword argument raises UnknownSettingError (a TypeError) naming the closest valid one.

    Example:
        >>> model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained(
        ...     "bert-base-uncased", block_size=128, sparse_block_size=128, sparsity_factor=2)
    """

    def __init__(
        self,
        max_sequence_length: int = 4096,
        position_tiling: str = "body",
        random_global_init: bool = False,
        global_positional_stride: int = 64,
        keep_first_global_token: bool = False,
        resize_lsg: bool = False,
        reinit_global_tokens: bool = False,
        use_token_ids: bool = True,
        seed: int = 123,
        **unknown: Any,
    ) -> None:
        if unknown:
            name, value = next(iter(unknown.items()))
            valid = [parameter for parameter in inspect.signature(LSGConverter).parameters if parameter != "unknown"]
            if name in SEQ2SEQ_DEFAULTS:
                raise UnknownSettingError(
                    f"LSGConverter() got {name}={value!r}, an LSG setting: pass it to convert_from_pretrained() instead."
                )
            raise _unknown_setting_error("LSGConverter()", name, value, valid, "no argument of LSGConverter()")
        if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, int) or max_sequence_length < 1:
            raise InvalidSettingsError(
                f"max_sequence_length={max_sequence_length!r} is not a positive integer: use a whole number of tokens."
            )
        if position_tiling not in POSITION_TILINGS:
            raise InvalidSettingsError(
                f"position_tiling={position_tiling!r} is unknown: use one of {', '.join(POSITION_TILINGS)}."
            )
        if global_positional_stride < 1 or MAX_GLOBAL_TOKENS % global_positional_stride:
            raise InvalidSettingsError(
                f"global_positional_stride={global_positional_stride} does not divide {MAX_GLOBAL_TOKENS}: "
                f"use a power of 2 up to {MAX_GLOBAL_TOKENS}."
            )
        self.max_sequence_length = max_sequence_length
        self.position_tiling = position_tiling
        self.random_global_init = random_global_init
        self.global_positional_stride = global_positional_stride
        self.keep_first_global_token = keep_first_global_token
        self.resize_lsg = resize_lsg
        self.reinit_global_tokens = reinit_global_tokens
        self.use_token_ids = use_token_ids
        self.seed = seed

    def convert_from_pretrained(
        self,
        model_name_or_path: str | os.PathLike,
        architecture: str | None = None,
        token: str | bool | None = None,
        **lsg_kwargs: Any,
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
        """Load `model_name_or_path` (a Hub id or a folder) and return the LSG model and its tokenizer.

        Args:
            model_name_or_path: source checkpoint: a plain model or an LSG one (ours or the 2023 reference's).
            architecture: head to build ("BertForMaskedLM"); default: the one the source holds (see below).
            token: Hugging Face Hub token for private sources.
            **lsg_kwargs: LSG settings (block_size, sparse_block_size, sparsity_factor, sparsity_type,
                num_global_tokens, pool_with_global, mask_first_token, lsh_num_pre_rounds, adaptive),
                or any other config key to override.
        Returns:
            (model in eval mode, tokenizer with model_max_length set and no truncation or padding of its
            own, or None if the source has none). A sentence-transformers source's pipeline (modules.json,
            Pooling, Dense, Normalize...) travels as ``model.sentence_transformers_pipeline``, which
            `save_converted` writes.

        Everything is checked before the weights are loaded: an unknown keyword (UnknownSettingError,
        naming the closest valid one), a setting that cannot work or a max length below the source's
        own (InvalidSettingsError), a source setting LSG does not implement (InvalidSettingsError), a
        folder without weights (SourceNotFoundError), a pickle torch's safe loader blocks
        (UnsafeCheckpointError).

        The model holds the source's weights and nothing random unless `architecture` asks for a head
        the source does not have (a warning then names the newly initialised weights). Without
        `architecture`, the head is the source config's first architecture when the weights hold it,
        else the head the weights hold (the bare model if none). The pooler is kept where the source
        has one and absent where it has none. Source tensors the LSG class does not use (a ColBERT
        projection) are kept in the model under their own names, with a warning naming them.
        """
        folder = local_source(model_name_or_path)  # a folder on disk is read from there, "~" expanded
        source = str(folder if folder is not None else model_name_or_path)
        source_config = _load_config(source, token)
        arch = find_architecture(source_config.model_type)
        is_lsg = _is_lsg_config(source_config)
        _check_setting_names(arch, source_config, lsg_kwargs)
        _build_lsg_config(arch, source_config, arch.lsg_class(arch.base_head), lsg_kwargs)  # refuse bad settings now
        files = weight_files(source, token)
        settings = {**_pooler_setting(arch, tensor_names(files)), **lsg_kwargs}
        run = _choose_head(arch, source, source_config, settings, architecture, token)
        lsg_class, config = run.lsg_class, run.config
        positions = arch.position_rows(run.model.base_model).shape[0]
        if self.max_sequence_length < positions:
            raise InvalidSettingsError(
                f"max_sequence_length={self.max_sequence_length} is below the {positions} positions the source "
                f"already reads: use max_sequence_length= of at least {positions}."
            )
        if not is_lsg and "block_size" not in lsg_kwargs:
            config.block_size = window_block_size(positions, config)
        try:
            validate_lsg_settings(config, self.max_sequence_length)
        except ValueError as error:
            raise InvalidSettingsError(str(error)) from error
        kept = _kept_weights(files, run.unexpected, lsg_class)
        if kept:
            setattr(config, KEPT_WEIGHTS_KEY, {**(getattr(config, KEPT_WEIGHTS_KEY, None) or {}), **kept})

        tokenizer = _load_tokenizer(source, token)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model, loading_info = _load_model(lsg_class, source, config, token)
            _report_loading(model, loading_info, kept)
            config = model.config
            base = model.base_model
            refresh = is_lsg and not self.resize_lsg and (self.keep_first_global_token or self.reinit_global_tokens)
            keep_first = refresh and self.keep_first_global_token
            if model.lsg_global_embeddings is None:
                logger.info(f"{lsg_class.__name__} is the source's dense decoder: only its positions are extended.")
            elif not is_lsg or refresh:
                self._init_global_tokens(model, arch, tokenizer, keep_first=keep_first)
            else:
                logger.info("The source is an LSG model: its global tokens are kept.")
            # an LSG source's table is already tiled: repeat it whole
            tiling = "table" if is_lsg else self.position_tiling
            added_rows = _extend_positions(base, arch, self.max_sequence_length, tiling)

        # BART counts its 2 offset rows outside max_position_embeddings, RoBERTa inside: keep the source's way.
        config.max_position_embeddings += added_rows
        config._name_or_path = source
        carry_pipeline(model, source, token, self.max_sequence_length)
        if tokenizer is not None:
            _drop_source_lengths(tokenizer)
            tokenizer.model_max_length = self.max_sequence_length
            tokenizer.init_kwargs["model_max_length"] = self.max_sequence_length
        logger.info(
            f"Converted {source} to {lsg_class.__name__} reading {self.max_sequence_length} tokens "
            f"(block {config.block_size}, sparse {config.sparse_block_size}, factor {config.sparsity_factor}, "
            f"{config.sparsity_type}, {config.num_global_tokens} global tokens)."
        )
        return model.eval(), tokenizer

    def _init_global_tokens(
        self,
        model: PreTrainedModel,
        arch: Architecture,
        tokenizer: PreTrainedTokenizerBase | None,
        keep_first: bool,
    ) -> None:
        """Global 0 = [CLS]/<s> + position 0; global k = [MASK] + a strided source position (+ type 0)."""
        base = model.base_model
        words = base.get_submodule(arch.word_embeddings).weight.detach()
        positions = _strided_positions(arch.position_rows(base), self.global_positional_stride)
        first_id, mask_id = _global_token_ids(tokenizer, model.config)
        if self.random_global_init:
            word_part = torch.distributions.MultivariateNormal(words.mean(0).float(), torch.cov(words.T.float()))
            word_part = word_part.sample((MAX_GLOBAL_TOKENS,)).to(words.dtype)
        else:
            word_part = words[mask_id].expand(MAX_GLOBAL_TOKENS, -1).clone()
        word_part[0] = words[first_id]
        global_tokens = word_part + positions
        if self.use_token_ids and arch.token_type_table is not None:
            global_tokens += base.get_submodule(arch.token_type_table).weight.detach()[0]
        weight = model.lsg_global_embeddings.weight
        with torch.no_grad():
            start = 1 if keep_first else 0
            weight[start:] = global_tokens[start:].to(weight.dtype)


def save_converted(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    save_path: str | os.PathLike,
    overwrite: bool = False,
    card: Any = None,
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


def _load_config(source: str, token: str | bool | None) -> Any:
    """The source's config. A source that exists on disk is read from disk and nothing else; any other
    is a Hub id, looked up on the Hub first (one quick request) unless HF_HUB_OFFLINE=1 is set, then
    read through the Hugging Face cache."""
    folder = local_source(source)
    if folder is not None:
        return _load_local_config(source, folder)
    if not is_hub_id(source):
        raise SourceNotFoundError(f"No folder at {source!r}: give an existing model folder or a Hub model id.")
    offline = is_offline_mode()
    if not offline:
        hub_model_info(source, token)  # not on the Hub: SourceNotFoundError; Hub unreachable: HubError
    try:
        with hub_errors(f"download the configuration of {source!r}", "check the network and try again"):
            return AutoConfig.from_pretrained(source, token=token)
    except (OSError, ValueError) as error:
        if offline:
            raise SourceNotFoundError(
                f"No folder {source!r} here, and no copy of it in the Hugging Face cache (HF_HUB_OFFLINE=1 is "
                "set, so the Hub is not asked): give an existing model folder, or unset HF_HUB_OFFLINE to download it."
            ) from error
        raise SourceNotFoundError(
            f"The Hub's {source!r} holds no model configuration ({one_line(error, 200)}): give a model's Hub id or folder."
        ) from error


def _load_local_config(source: str, folder: Path) -> Any:
    """The config of the model saved in `folder`; SourceNotFoundError when the folder holds no model."""
    config_file = folder / "config.json"
    if not folder.is_dir():
        raise SourceNotFoundError(f"{source} is a file: give the folder the model was saved to.")
    if not config_file.is_file():
        raise SourceNotFoundError(
            f"{source} holds no model (no config.json): give the folder a model was saved to, or a Hub model id."
        )
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
        model_type = values.get("model_type") if isinstance(values, dict) else None
        if not model_type or not isinstance(model_type, str):
            raise SourceNotFoundError(
                f"{source} holds no model: its config.json describes none (it was not written by "
                "save_pretrained); give the folder a model was saved to."
            )
        find_architecture(model_type)  # an unsupported model is refused as such, not as unreadable
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"Cannot read {source}/config.json ({one_line(error, 200)}): fix or restore the file."
        ) from error


def _load_model(
    lsg_class: type, source: str, config: Any, token: str | bool | None, device_map: str | None = None
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """`lsg_class` loaded from `source` with `config`, and transformers' loading info (missing and
    unexpected keys). The load report is not logged: `_report_loading` says what matters."""
    try:
        with _load_report_hidden():
            return lsg_class.from_pretrained(
                source, config=config, token=token, device_map=device_map, output_loading_info=True
            )
    except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"Cannot read the weights of {source!r} ({one_line(error, 200)}): the file is truncated "
            "or corrupt, or does not match its config.json; download or save the model again."
        ) from error


def _load_tokenizer(source: str, token: str | bool | None) -> PreTrainedTokenizerBase | None:
    """The source's tokenizer; None, with a warning, when it has none or it cannot be read."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, token=token)
    except (OSError, ValueError, TypeError) as error:
        logger.warning(f"No tokenizer could be loaded from {source} ({one_line(error, 200)}): none is returned.")
        return None
    # transformers 5 also builds a tokenizer (of special tokens only) where there are no tokenizer files
    file_names = {"tokenizer_config.json", "tokenizer.json", *getattr(tokenizer, "vocab_files_names", {}).values()}
    resolved = (
        cached_file(
            source, name, token=token,
            _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
        )
        for name in file_names
    )
    if not any(resolved):
        logger.warning(f"{source} has no tokenizer files ({', '.join(sorted(file_names))}): no tokenizer is returned.")
        return None
    return tokenizer


def _drop_source_lengths(tokenizer: PreTrainedTokenizerBase) -> None:
    """Forget the truncation and padding the source's tokenizer.json sets (all-MiniLM-L6-v2: 128 tokens),
    so that the converted tokenizer cuts and pads only when asked, up to model_max_length."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    for key in TOKENIZER_LENGTH_SETTINGS:
        tokenizer.init_kwargs.pop(key, None)


@dataclass
class _DryRun:
    """A head loaded on the meta device (no weights read into memory): what it would hold and lack."""

    lsg_class: type
    config: Any
    model: PreTrainedModel  # on the meta device: shapes only
    missing: list[str]  # weights the source lacks (newly initialised), the global token table aside
    unexpected: set[str]  # source tensors the class does not hold


def _dry_run(
    arch: Architecture, source: str, source_config: Any, settings: dict[str, Any], lsg_class: type, token: Any
) -> _DryRun:
    config = _build_lsg_config(arch, source_config, lsg_class, settings)
    with _loading_messages_hidden():
        model, info = _load_model(lsg_class, source, config, token, device_map="meta")
    return _DryRun(lsg_class, config, model, _new_weights(info), set(info["unexpected_keys"]))


def _new_weights(loading_info: dict[str, Any]) -> list[str]:
    """The weights a load initialised afresh, but the global token table (the converter fills it)."""
    return sorted(key for key in loading_info["missing_keys"] if "global_embeddings." not in key)


def _choose_head(
    arch: Architecture,
    source: str,
    source_config: Any,
    settings: dict[str, Any],
    architecture: str | None,
    token: Any,
) -> _DryRun:
    """The head to build, tried on the meta device: `architecture` when asked for; else the source
    config's first architecture if the weights hold it; else the head whose weights the source holds
    (of those, the one that leaves the fewest source tensors unused; the bare model if none)."""
    def attempt(head: str) -> _DryRun:
        return _dry_run(arch, source, source_config, settings, arch.lsg_class(head), token)

    if architecture:
        return attempt(architecture)
    heads = arch.heads
    named = (source_config.architectures or [None])[0]
    if named in heads or named in heads.values():
        run = attempt(named)
        if not run.missing:
            return run
        reason = f"config.json names {named}, but the weights lack {_listed(run.missing)}"
        advice = f"pass architecture={named!r} to build it with those weights newly initialised"
    elif named:
        reason = f"The source's architecture {named!r} is no {arch.model_type} head"
        advice = f"pass architecture= with one of {', '.join(sorted(heads))} to build another head"
    else:
        reason, advice = "config.json names no architecture", ""
    is_decoder = bool(getattr(source_config, "is_decoder", False))
    candidates = [arch.default_head, *(head for head in heads if head != arch.default_head)]
    runs = []
    for head in candidates:
        if head == named or head.endswith(CAUSAL_HEAD_SUFFIXES) != is_decoder:
            continue
        try:
            runs.append(attempt(head))
        except CorruptCheckpointError:  # the weights do not fit this head (a classifier of another size)
            continue
    supported = [run for run in runs if not run.missing]
    if not supported:
        base = next(run for run in runs if run.lsg_class is arch.lsg_class(arch.base_head))
        raise CorruptCheckpointError(
            f"The weights of {source} lack {_listed(base.missing)}, which every {arch.model_type} model needs: "
            "download or save the model again."
        )
    chosen = min(supported, key=lambda run: len(run.unexpected))  # the first of equals: candidates' order
    message = f"{reason}: its weights are converted as {chosen.lsg_class.__name__}, the head they hold"
    if advice:
        logger.warning(f"{message}; {advice}.")
    else:
        logger.info(f"{message}.")
    return chosen


def _listed(names: Iterable[str], shown: int = 8) -> str:
    """'a, b, c' or 'a, b, ... and 5 more'."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _pooler_setting(arch: Architecture, names: set[str]) -> dict[str, bool]:
    """{add_pooling_layer: whether the source's weights hold a pooler}, for architectures whose bare
    model has an optional pooler (BERT, RoBERTa, ALBERT, ...); {} for the others."""
    base_class = getattr(transformers, arch.base_head)
    if POOLER_KEY not in inspect.signature(base_class.__init__).parameters:
        return {}
    prefix = f"{base_class.base_model_prefix}."
    return {POOLER_KEY: any(name.removeprefix(prefix).startswith("pooler.") for name in names)}


def _kept_weights(files: list[Path], unexpected: set[str], lsg_class: type) -> dict[str, dict[str, Any]]:
    """{name: {shape, dtype}} of the source tensors `lsg_class` does not hold, to keep under their names.

    Names that transformers renamed on loading (legacy LayerNorm gamma/beta) are not in the files:
    a warning names them as dropped."""
    tensors = read_tensors(files, unexpected)
    dropped = sorted(unexpected - set(tensors))
    if dropped:
        logger.warning(
            f"{lsg_class.__name__} does not use the source tensors {_listed(dropped)}, stored under other names: "
            "they are not kept."
        )
    return {
        name: {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}
        for name, tensor in sorted(tensors.items())
    }


def _report_loading(model: PreTrainedModel, loading_info: dict[str, Any], kept: dict[str, Any]) -> None:
    """One line for the newly initialised weights, one for the kept source tensors, one for any dropped."""
    name = type(model).__name__
    new = _new_weights(loading_info)
    if new:
        logger.warning(
            f"{name} is a new head for this source: {_listed(new)} are newly initialised (random); train them before use."
        )
    if kept:
        logger.warning(f"{name} does not use {_listed(kept)} of the source: kept in the model under their own names.")
    unused = sorted(loading_info["unexpected_keys"])
    if unused:
        logger.warning(f"{name} drops the source tensors {_listed(unused)}.")


def _check_setting_names(arch: Architecture, source_config: Any, lsg_kwargs: dict[str, Any]) -> None:
    """UnknownSettingError for a keyword that is neither an LSG setting nor a key of the source's config."""
    valid = {
        *source_config.to_dict(),
        *(field.name for field in dataclasses.fields(source_config)),
        *(name for name, value in vars(PretrainedConfig).items() if isinstance(value, property) and value.fset),
        *arch.config_class().lsg_defaults,
    }
    valid = {name for name in valid if not name.startswith("_")}
    for name, value in lsg_kwargs.items():
        if name not in valid:
            about = f"no LSG setting or key of the source's {type(source_config).__name__}"
            raise _unknown_setting_error("convert_from_pretrained()", name, value, valid, about)


def _unknown_setting_error(where: str, name: str, value: Any, valid: Iterable[str], nothing: str) -> UnknownSettingError:
    """'<where> got an unknown setting name=value: did you mean <closest>=?' (one line); `nothing` says
    what has no such name when no valid name is close ("no argument of LSGConverter()")."""
    closest = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.5)
    hint = f"did you mean {closest[0]}=?" if closest else f"{nothing} is called that."
    return UnknownSettingError(f"{where} got an unknown setting {name}={value!r}: {hint}")


def _is_lsg_config(config: Any) -> bool:
    """Ours (model_type lsg-*) or the 2023 reference's (model_type bert + LSG keys)."""
    return config.model_type.startswith("lsg-") or is_reference_config(config.to_dict())


def _build_lsg_config(arch: Architecture, source_config: Any, lsg_class: type, settings: dict[str, Any]) -> Any:
    """The LSG config of `lsg_class`: the source's keys, the LSG defaults (unless the source is LSG
    already), then `settings`. InvalidSettingsError if they cannot work (see validate_lsg_settings)."""
    head_name = lsg_class.__name__
    values = source_config.to_dict()
    for key in ("transformers_version", "_name_or_path"):  # model_type and auto_map: the LSG config resets them
        values.pop(key, None)
    config_class = arch.config_class()
    if not _is_lsg_config(source_config):
        values.update(config_class.lsg_defaults)
        values.update(CONVERSION_DEFAULTS)
    if head_name.endswith(CAUSAL_HEAD_SUFFIXES):
        values["is_decoder"] = True
    values.update(settings)
    values["architectures"] = [head_name]
    try:
        return config_class(**values)
    except (ValueError, TypeError) as error:
        raise InvalidSettingsError(str(error)) from error


def _global_token_ids(tokenizer: PreTrainedTokenizerBase | None, config: Any) -> tuple[int, int]:
    """(word of global token 0: bos or cls, word of global tokens k > 0: mask).

    Taken from the tokenizer when its ids belong to the model's vocabulary, else from the config, with
    a warning that names what is missing (no tokenizer, a tokenizer of another vocabulary, no mask id).
    """
    problem = "no tokenizer" if tokenizer is None else _foreign_tokenizer(tokenizer, config)
    ids = config if problem else tokenizer
    first_name = next((name for name in ("bos_token_id", "cls_token_id") if getattr(ids, name, None) is not None), None)
    first_id = 0 if first_name is None else getattr(ids, first_name)
    mask_id = getattr(ids, "mask_token_id", None)
    if config.num_global_tokens and (problem or first_name is None or mask_id is None):
        origin = f"the config's ids ({problem})" if problem else "the tokenizer's ids"
        first = f"{first_name} {first_id}" if first_name else "token 0 (no bos_token_id or cls_token_id)"
        others = f"mask_token_id {mask_id}" if mask_id is not None else f"token {first_id} (no mask_token_id)"
        logger.warning(f"Global tokens use {origin}: {first} for global token 0, {others} for the others.")
    return first_id, first_id if mask_id is None else mask_id


def _foreign_tokenizer(tokenizer: PreTrainedTokenizerBase, config: Any) -> str | None:
    """Why `tokenizer`'s ids do not belong to the model of `config` (None when they may): a special
    token id that differs from the config's, or a bos/cls/mask id beyond the embedding table."""
    name = type(tokenizer).__name__
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        theirs, ours = getattr(tokenizer, key, None), getattr(config, key, None)
        if theirs is not None and ours is not None and theirs != ours:
            return f"the source's {name} has {key} {theirs}, the model {ours}"
    vocab_size = getattr(config, "vocab_size", None) or 0
    for key in ("bos_token_id", "cls_token_id", "mask_token_id"):
        theirs = getattr(tokenizer, key, None)
        if theirs is not None and vocab_size and theirs >= vocab_size:
            return f"the source's {name} has {key} {theirs}, beyond the model's {vocab_size} embeddings"
    return None


def _strided_positions(table: torch.Tensor, stride: int) -> torch.Tensor:
    """512 position vectors for the global tokens: global k gets a source position `stride` apart.

    The table is brought to 512 rows (cropped to a multiple of 512 and subsampled, or completed with
    draws from its per-dimension normal), then read column-major with `stride` rows per column:
    global 0 -> position 0, global 1 -> position stride, ..., as the 2023 reference does.
    """
    rows, width = table.shape
    if rows % MAX_GLOBAL_TOKENS:
        if rows > MAX_GLOBAL_TOKENS:
            table = table[: MAX_GLOBAL_TOKENS * (rows // MAX_GLOBAL_TOKENS)]
        else:
            mean, std = table.mean(0, keepdim=True), table.std(0, keepdim=True)
            fill = torch.normal(mean.expand(MAX_GLOBAL_TOKENS - rows, -1), std.expand(MAX_GLOBAL_TOKENS - rows, -1))
            table = torch.cat([table, fill.to(table.dtype)])
    factor = table.shape[0] // MAX_GLOBAL_TOKENS
    table = table[::factor]  # (512, E)
    step = max(stride // factor, 1)
    return table.reshape(-1, step, width).transpose(0, 1).reshape(-1, width)


def window_block_size(source_positions: int, config: Any) -> int:
    """Default block size: a third of the source's body positions, so that a block's local window
    (previous, own and next block) spans one training window's body (170 for 512 positions).

    Rounded down to a multiple of ``sparsity_factor`` when the setting uses sparse keys."""
    block_size = max((source_positions - 2) // 3, 1)
    if uses_sparse_keys(config) and block_size > config.sparsity_factor:
        block_size -= block_size % config.sparsity_factor
    return block_size


def tiled_position_rows(source_positions: int, max_length: int, tiling: str) -> torch.Tensor:
    """Source row of each new position (max_length,): see LSGConverter's `position_tiling`.

    "body": position i < P keeps row i, later ones take 1 + (i - 1) mod (P - 2), so the body rows
    1..P-2 keep their period (P = 512: positions 511, 512, ... take rows 511, 2, 3, ..., 510, 1, 2, ...).
    "table": i mod P.
    """
    positions = torch.arange(max_length)
    body_rows = source_positions - 2
    if tiling == "table" or body_rows < 1:
        return positions % source_positions
    return torch.where(positions < source_positions, positions, 1 + (positions - 1) % body_rows)


def _extend_positions(base: nn.Module, arch: Architecture, max_length: int, tiling: str) -> int:
    """Bring every position table of `base` to `max_length` rows after its offset rows, in place, and
    rebuild the position/token-type buffers beside it. Learned tables are extended with
    `tiled_position_rows` (the offset rows kept once in front), sinusoidal ones regenerated.
    Returns the rows added."""
    added = 0
    for table_name, table in arch.position_tables_in(base).items():
        old = table.weight.detach()
        if arch.sinusoidal_positions:
            extended = _sinusoidal_positions(max_length, old.shape[1]).to(old)
        else:
            learned = old[arch.position_offset :]
            extended = learned[tiled_position_rows(learned.shape[0], max_length, tiling)]
        weight = torch.cat([old[: arch.position_offset], extended])
        table.weight = nn.Parameter(weight, requires_grad=table.weight.requires_grad)
        table.num_embeddings = weight.shape[0]
        added = weight.shape[0] - old.shape[0]
        parent_name = table_name.rpartition(".")[0]
        parent = base.get_submodule(parent_name) if parent_name else base
        for buffer_name in ("position_ids", "token_type_ids"):
            buffer = getattr(parent, buffer_name, None)
            if isinstance(buffer, torch.Tensor):
                values = torch.arange(weight.shape[0]) if buffer_name == "position_ids" else torch.zeros(weight.shape[0])
                parent.register_buffer(buffer_name, values.to(buffer).expand(1, -1), persistent=False)
    return added


def _sinusoidal_positions(rows: int, width: int) -> torch.Tensor:
    """(rows, width) fixed sinusoidal positions, sines in the first half and cosines in the second
    (the non-interleaved layout of Pegasus and Marian): row p, column j < width/2 holds
    sin(p / 10000^(2j/width)), column width/2 + j holds cos of the same angle."""
    sines = (width + 1) // 2
    positions = torch.arange(rows, dtype=torch.float64)[:, None]
    frequencies = 10000 ** (-2 * torch.arange(sines, dtype=torch.float64) / width)
    angles = positions * frequencies
    return torch.cat([angles.sin(), angles[:, : width // 2].cos()], dim=1).float()


class _TransformersMessagesFilter(pylogging.Filter):
    """Drops transformers' load report (the converter reports what it found itself), or every message."""

    def __init__(self, everything: bool) -> None:
        super().__init__()
        self.everything = everything

    def filter(self, record: pylogging.LogRecord) -> bool:
        return not self.everything and "LOAD REPORT" not in record.getMessage()


@contextmanager
def _filtered_loading_messages(everything: bool) -> Iterator[None]:
    loggers = [logging.get_logger(name) for name in ("transformers.modeling_utils", "transformers.core_model_loading")]
    messages_filter = _TransformersMessagesFilter(everything)
    for loading_logger in loggers:
        loading_logger.addFilter(messages_filter)
    try:
        yield
    finally:
        for loading_logger in loggers:
            loading_logger.removeFilter(messages_filter)


def _load_report_hidden() -> Any:
    """Hide transformers' load report: `_report_loading` names the new, kept and dropped weights."""
    return _filtered_loading_messages(everything=False)


@contextmanager
def _loading_messages_hidden() -> Iterator[None]:
    """Hide every loading message and the progress bar: the dry runs that choose the head."""
    bar_was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with _filtered_loading_messages(everything=True):
            yield
    finally:
        if bar_was_enabled:
            logging.enable_progress_bar()
