"""The LSG config of a conversion: the source's keys, the LSG defaults and the settings asked for,
with every setting name checked (a misspelling is named with the closest valid one) and the settings
validated once (`resolve_settings`)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Iterable

import transformers
from transformers import PretrainedConfig

from .architectures import Architecture
from .errors import InvalidSettingsError, UnknownSettingError, is_count
from .models.lsg_defaults import CONVERSION_DEFAULTS
from .models.lsg_model import POOLER_KEY, is_reference_config, validate_lsg_settings
from .models.lsg_pattern import uses_sparse_keys
from .positions import PRETRAINED_POSITIONS_KEY, window_block_size


def pooler_setting(arch: Architecture, names: set[str]) -> dict[str, bool]:
    """{add_pooling_layer: whether the source's weights hold a pooler}, for architectures whose bare
    model has an optional pooler (BERT, RoBERTa, ALBERT, ...); {} for the others."""
    base_class = getattr(transformers, arch.base_head)
    if POOLER_KEY not in inspect.signature(base_class.__init__).parameters:
        return {}
    prefix = f"{base_class.base_model_prefix}."
    return {POOLER_KEY: any(name.removeprefix(prefix).startswith("pooler.") for name in names)}


def check_setting_names(arch: Architecture, source_config: Any, lsg_kwargs: dict[str, Any]) -> None:
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
            raise unknown_setting_error("convert_from_pretrained()", name, value, valid, about)


def unknown_setting_error(where: str, name: str, value: Any, valid: Iterable[str], nothing: str) -> UnknownSettingError:
    """'<where> got an unknown setting name=value: did you mean <closest>=?' (one line); `nothing` says
    what has no such name when no valid name is close ("no argument of LSGConverter()")."""
    closest = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.5)
    hint = f"did you mean {closest[0]}=?" if closest else f"{nothing} is called that."
    return UnknownSettingError(f"{where} got an unknown setting {name}={value!r}: {hint}")


def is_lsg_config(config: Any) -> bool:
    """Ours (model_type lsg-*) or the 2023 reference's (model_type bert + LSG keys)."""
    return config.model_type.startswith("lsg-") or is_reference_config(config.to_dict())


def build_lsg_config(arch: Architecture, source_config: Any, lsg_class: type, settings: dict[str, Any]) -> Any:
    """The LSG config of `lsg_class`: the source's keys, the defaults of a conversion (the config's
    ``lsg_defaults``, then `lsg_defaults.CONVERSION_DEFAULTS`; unless the source is LSG already), then
    `settings`. Its LSG settings are not validated here: `resolve_settings` validates them, once per
    conversion; InvalidSettingsError if the config class refuses the values (Pegasus' encoder_layerdrop)."""
    head_name = lsg_class.__name__
    values = source_config.to_dict()
    for key in ("transformers_version", "_name_or_path"):  # model_type and auto_map: the LSG config resets them
        values.pop(key, None)
    config_class = arch.config_class()
    if not is_lsg_config(source_config):
        values.update(config_class.lsg_defaults)
        values.update(CONVERSION_DEFAULTS)
    if arch.is_causal(head_name):
        values["is_decoder"] = True
    values.update(_labels_of(values, settings))
    values.update(settings)
    values["architectures"] = [head_name]
    try:
        return config_class(**values, validate_settings=False)
    except (ValueError, TypeError) as error:
        raise InvalidSettingsError(str(error)) from error


def _labels_of(values: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The source's label maps brought to the ``num_labels`` that `settings` asks for (where they name no
    maps of their own): kept when they have that many labels, else LABEL_0, LABEL_1, ... as transformers
    names them (a config given both a num_labels and maps of another length warns and keeps num_labels)."""
    labels = settings.get("num_labels")
    if labels is None or {"id2label", "label2id"} & settings.keys() or len(values.get("id2label") or {}) == labels:
        return {}
    id2label = {index: f"LABEL_{index}" for index in range(labels)}
    return {"id2label": id2label, "label2id": {label: index for index, label in id2label.items()}}


def resolve_settings(
    arch: Architecture, source_config: Any, lsg_kwargs: dict[str, Any], max_length: int, architecture: str | None = None
) -> dict[str, Any]:
    """The LSG settings of a conversion, resolved and validated once, before anything is loaded (the
    configs the conversion builds after, with these settings, are not validated again): the settings
    asked for, plus block_size's default where the source is not LSG and none was asked for
    (`positions.window_block_size`). InvalidSettingsError if they cannot work at `max_length` tokens in
    the head built (`architecture`, else the one the source's config names: a causal one refuses what
    a decoder cannot run), if `max_length` is below the positions the source reads, or if num_labels is
    no positive whole number."""
    labels = lsg_kwargs.get("num_labels")
    if labels is not None and not is_count(labels):
        raise InvalidSettingsError(
            f"num_labels={labels!r} is no number of labels: use a whole number of at least 1."
        )
    positions = arch.layout.max_input_length(source_config)
    if max_length < positions:
        raise InvalidSettingsError(
            f"max_sequence_length={max_length} is below the {positions} positions the source "
            f"already reads: use max_sequence_length= of at least {positions}."
        )
    named = (source_config.architectures or [None])[0]
    head = architecture or (named if named in arch.heads or named in arch.heads.values() else arch.base_head)
    config = build_lsg_config(arch, source_config, arch.lsg_class(head), lsg_kwargs)
    settings = dict(lsg_kwargs)
    if not is_lsg_config(source_config) and "block_size" not in lsg_kwargs:
        settings["block_size"] = config.block_size = window_block_size(positions, config)
    try:
        validate_lsg_settings(config, max_length)
    except ValueError as error:
        raise InvalidSettingsError(str(error)) from error
    if arch.layout.rotary_embeddings:
        check_rotary_reach(config, getattr(source_config, PRETRAINED_POSITIONS_KEY, None) or positions, max_length)
    return settings


def check_rotary_reach(config: Any, trained_positions: int, max_length: int) -> None:
    """InvalidSettingsError where a query of an encoder with rotary positions would see a local or sparse key
    farther away than any two of the `trained_positions` its source was trained on (trained_positions - 1
    tokens): the rotation of such a distance is one the source never saw. A block's local keys lie up to
    2 x block_size - 1 tokens away, its sparse keys up to sparse_block_size x sparsity_factor tokens beyond,
    and no key lies farther than max_length - 1 tokens from a query of a model that reads `max_length`."""
    sparse = config.sparse_block_size * config.sparsity_factor if uses_sparse_keys(config) else 0
    farthest = min(2 * config.block_size + sparse, max_length) - 1
    if farthest >= trained_positions:
        raise InvalidSettingsError(
            f"block_size={config.block_size}, sparse_block_size={config.sparse_block_size} and sparsity_factor="
            f"{config.sparsity_factor} ({config.sparsity_type}) reach keys {farthest} tokens away, farther than the "
            f"{trained_positions - 1} the source was trained on (rotary positions): use a block_size of at "
            f"most {max((trained_positions - sparse) // 2, 1)}, or fewer sparse keys."
        )
