"""Conversion: load a source checkpoint -> LSG config -> copy weights -> global tokens -> extend positions."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .architectures import find_architecture, max_length_of
from .checkpoint import tensor_names, weight_files
from .errors import InvalidSettingsError, UnknownSettingError, is_count
from .global_tokens import fill_global_tokens
from .head_choice import choose_head
from .loading import drop_source_lengths, kept_weights, load_model, load_tokenizer, new_weights, report_loading
from .lsg_config import check_setting_names, is_lsg_config, pooler_setting, resolve_settings, unknown_setting_error
from .memory import check_conversion_memory, running_out_of_memory_refused
from .models.lsg_defaults import MAX_GLOBAL_TOKENS, SEQ2SEQ_DEFAULTS
from .models.lsg_model import KEPT_WEIGHTS_KEY
from .positions import (
    POSITION_TILINGS,
    PRETRAINED_POSITIONS_KEY,
    extend_positions,
    move_longrope_threshold,
    pretrained_positions,
)
from .sbert import attach_pipeline, carried_pipeline
from .sources import load_source_config, local_source, look_up_source

logger = logging.get_logger(__name__)


class LSGConverter:
    """Converts a pretrained encoder or encoder-decoder checkpoint (BERT, ..., BART, T5: docs/architectures.md)
    into an LSG model reading `max_sequence_length` tokens.

    Default settings (chosen on all-MiniLM-L6-v2 and Shakespeare, see docs/benchmarks.md, "Extrapolation
    quality"): those of `lsg_defaults.CONVERSION_DEFAULTS` (local attention only, one global token: [CLS]
    at position 0), ``block_size`` from `lsg_defaults.conversion_block_size` (a third of the source's body
    positions) and ``position_tiling="body"``. Each block then sees its previous, own and next block:
    exactly the body of one training window, with the positions that window had, plus the global [CLS].
    Any LSG setting passed to `convert_from_pretrained` replaces these.

    Args:
        max_sequence_length: length the converted model accepts; learned position embeddings are
            extended to it (see `position_tiling`), sinusoidal ones regenerated.
        position_tiling: how learned positions beyond the source's table are filled. ``"body"``
            (default): the source table stays as it is, then its body rows (1 to P - 2 of a P-row
            table: the positions text takes between [CLS] and the last [SEP] of a full window)
            repeat, so every stretch of P - 2 tokens reads like the body of one training window.
            ``"table"``: the whole table repeats (the 2023 reference; body tokens then also take the
            [CLS] and [SEP] positions). An LSG source keeps its longer table and continues the tiling
            of the P rows it was pretrained with (``config.pretrained_positions``, see
            `positions.pretrained_positions`), as a direct conversion of its source would.
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
        skip_memory_check: convert even where the memory the conversion needs (estimated before anything
            is allocated, see `memory.conversion_memory`) exceeds what the system has available, which is
            otherwise refused (InsufficientMemoryError).

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
        skip_memory_check: bool = False,
        **unknown: Any,
    ) -> None:
        if unknown:
            name, value = next(iter(unknown.items()))
            valid = [parameter for parameter in inspect.signature(LSGConverter).parameters if parameter != "unknown"]
            if name in SEQ2SEQ_DEFAULTS:
                raise UnknownSettingError(
                    f"LSGConverter() got {name}={value!r}, an LSG setting: pass it to convert_from_pretrained() instead."
                )
            raise unknown_setting_error("LSGConverter()", name, value, valid, "no argument of LSGConverter()")
        if not is_count(max_sequence_length):
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
        self.skip_memory_check = skip_memory_check

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
            own, or None if the source has none that fits the model, see `loading.load_tokenizer`). A
            sentence-transformers source converted to the bare model keeps its pipeline (modules.json,
            Pooling, Dense, Normalize...) as ``model.sentence_transformers_pipeline``, which
            `save_converted` writes.

        Everything is checked before the weights are loaded: an unknown keyword (UnknownSettingError,
        naming the closest valid one), a setting that cannot work or a max length below the source's
        own (InvalidSettingsError), a source setting LSG does not implement (InvalidSettingsError), a
        folder without weights (SourceNotFoundError), a pickle torch's safe loader blocks
        (UnsafeCheckpointError), a length whose model needs more memory than the system has available
        (InsufficientMemoryError, unless skip_memory_check).

        The model holds the source's weights and nothing random unless `architecture` asks for a head
        the source does not have (a warning then names the newly initialised weights). Without
        `architecture`, the head is the source config's first architecture when the weights hold it,
        else the head the weights hold (the bare model if none). The pooler is kept where the source
        has one and absent where it has none. Source tensors the LSG class does not use (a ColBERT
        projection) are kept in the model under their own names, with a warning naming them.
        """
        folder = local_source(model_name_or_path)  # a folder on disk is read from there, "~" expanded
        source = str(folder if folder is not None else model_name_or_path)
        record = look_up_source(source, token)  # a Hub id: its record (one request), from which files are chosen
        source_config = load_source_config(source, token, record)
        arch = find_architecture(source_config.model_type)
        is_lsg = is_lsg_config(source_config)
        check_setting_names(arch, source_config, lsg_kwargs)
        lsg_kwargs = resolve_settings(arch, source_config, lsg_kwargs, self.max_sequence_length, architecture)
        files = weight_files(source, token, record)
        settings = {**pooler_setting(arch, tensor_names(files)), **lsg_kwargs}
        run = choose_head(arch, source, source_config, settings, architecture, token)
        lsg_class, config = run.lsg_class, run.config
        if not self.skip_memory_check:
            check_conversion_memory(run.model, arch, self.max_sequence_length)
        pipeline = carried_pipeline(run.model, source, token, self.max_sequence_length)
        positions = max_length_of(run.model)
        kept = kept_weights(files, run.unexpected, lsg_class)
        if kept:
            setattr(config, KEPT_WEIGHTS_KEY, {**(getattr(config, KEPT_WEIGHTS_KEY, None) or {}), **kept})

        tokenizer = load_tokenizer(source, token, source_config, record)
        with torch.random.fork_rng(devices=[]), running_out_of_memory_refused(self.max_sequence_length):
            torch.manual_seed(self.seed)
            model, loading_info = load_model(
                lsg_class, source, config, token, source_labels=source_config.num_labels
            )
            report_loading(model, loading_info, kept)
            model.lsg_new_weights = new_weights(loading_info)  # the card says they are random
            config = model.config
            refresh = is_lsg and not self.resize_lsg and (self.keep_first_global_token or self.reinit_global_tokens)
            keep_first = refresh and self.keep_first_global_token
            if model.lsg_global_embeddings is None:
                logger.info(f"{lsg_class.__name__} is the source's dense decoder: only its positions are extended.")
            elif not is_lsg or refresh:
                fill_global_tokens(
                    model,
                    arch,
                    tokenizer,
                    keep_first=keep_first,
                    random_init=self.random_global_init,
                    positional_stride=self.global_positional_stride,
                    use_token_ids=self.use_token_ids,
                )
            else:
                logger.info("The source is an LSG model: its global tokens are kept.")
            pretrained = pretrained_positions(model, arch, positions, is_lsg)
            added_rows = extend_positions(model, arch, self.max_sequence_length, self.position_tiling, pretrained)

        # BART counts its 2 offset rows outside max_position_embeddings, RoBERTa inside: keep the source's
        # way; a config without the key (T5's) reads the positions it was pretrained on.
        source_length = getattr(config, "max_position_embeddings", positions)
        config.max_position_embeddings = source_length + added_rows
        move_longrope_threshold(config, source_length, added_rows)
        setattr(config, PRETRAINED_POSITIONS_KEY, pretrained)
        config._name_or_path = source
        attach_pipeline(model, pipeline)
        if tokenizer is not None:
            drop_source_lengths(tokenizer)
            tokenizer.model_max_length = self.max_sequence_length
            tokenizer.init_kwargs["model_max_length"] = self.max_sequence_length
        logger.info(
            f"Converted {source} to {lsg_class.__name__} reading {self.max_sequence_length} tokens "
            f"(block {config.block_size}, sparse {config.sparse_block_size}, factor {config.sparsity_factor}, "
            f"{config.sparsity_type}, {config.num_global_tokens} global tokens)."
        )
        return model.eval(), tokenizer
