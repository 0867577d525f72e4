"""What LSG's remote code relies on in transformers beyond its public API, in one place.

LSG models subclass transformers' modeling classes, so a transformers release can break them the way
transformers 4.41 broke the 2023 reference. Adapting to a release starts here: every name below is
one that transformers may rename without notice, and the rest of the remote code reaches it through
this module (ARCHITECTURE.md lists them).

* Forward arguments read by name. transformers 5.24 renamed ``past_key_values`` to ``cache`` (the
  model's and the layers' forward) and ``past_key_values_length`` to ``cache_length`` (the
  embeddings'): `forward_cache` finds the cache by its type, whatever the argument is called, and
  `past_length` / `with_past_length` know both names of the embeddings' argument.
* Private methods called: ``_relative_position_bucket`` of T5's, mT5's and UMT5's attention modules
  (T5's bucket of a relative distance: a static method with the bucket settings as arguments in T5
  and mT5, a method reading them from the module in UMT5), through `relative_position_buckets`.
* Private helpers imported: ``transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS`` (transformers'
  own attention functions, by name), ``transformers.utils.is_torch_flex_attn_available``.
* Private registry written: ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY``, where
  ``capture_outputs`` looks up which layers a model records by the name of the class it was built as;
  `record_outputs_like_source` enters an LSG step class made from a built model (lsg_global_tokens).
* Private class attributes and methods LSG models read or override (lsg_model, lsg_attention_layers):
  ``can_record_outputs`` / ``_can_record_outputs`` and ``OutputRecorder.target_class`` /
  ``layer_name`` (which layers the output recorder hooks), ``_attn_implementation_internal``,
  ``get_correct_attn_implementation`` and ``_can_set_attn_implementation`` (how a model's attention
  implementation is set, checked and switched),
  ``_supports_sdpa`` / ``_supports_flex_attn`` / ``_supports_flash_attn`` /
  ``_supports_attention_backend``, ``_init_weights``, ``_auto_class``, ``post_init``.
* Module paths: each ``modeling_lsg_<arch>.py`` subclasses the classes of
  ``transformers.models.<arch>.modeling_<arch>``; MPNet and DeBERTa-v2 also subclass modules inside
  them (their attention, encoder, layers), whose forward signatures they follow.

`TESTED_TRANSFORMERS` is the range this code was tested with; a model meeting another transformers
says so once (`warn_if_untested_transformers`), and an import that a release removed fails with one
line naming both versions (`transformers_names`).

This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

import inspect
import re
from contextlib import contextmanager
from typing import Any, Iterator

import transformers
import torch
from transformers import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torch_flex_attn_available, logging
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "LSG_CODE_VERSION",
    "TESTED_TRANSFORMERS",
    "forward_cache",
    "is_torch_flex_attn_available",
    "past_length",
    "record_outputs_like_source",
    "relative_position_buckets",
    "transformers_names",
    "warn_if_untested_transformers",
    "with_past_length",
]

logger = logging.get_logger(__name__)

LSG_CODE_VERSION = "0.5.0"  # the lsg-converter release this code comes from (its _version.py)
TESTED_TRANSFORMERS = ("5.13.0", "5.24.0")  # the oldest and the newest transformers CI ran this code with

# The embeddings' argument that counts the cached tokens of a decoding step, newest name first.
PAST_LENGTH_ARGUMENTS = ("cache_length", "past_key_values_length")

RESAVE_ADVICE = (
    "re-save it with the newest lsg-converter (`pip install -U lsg-converter`, then "
    "`lsg-convert <model> --max-len <its max length> --save-path <new folder>`: a converted model is "
    "written again with the current code)"
)


def _version(text: str) -> tuple[int, ...]:
    """'5.24.0' or '5.25.0.dev0' -> (5, 24, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def untested_transformers(installed: str = transformers.__version__) -> str | None:
    """Why `installed` is outside `TESTED_TRANSFORMERS`, or None where it is inside."""
    oldest, newest = TESTED_TRANSFORMERS
    if _version(installed) < _version(oldest):
        relation = "older"
    elif _version(installed)[:2] > _version(newest)[:2]:  # a patch release of the newest counts as tested
        relation = "newer"
    else:
        return None
    return (
        f"This LSG model's code (lsg-converter {LSG_CODE_VERSION}) was tested with transformers {oldest} to "
        f"{newest}; transformers {installed} is {relation}"
    )


def warn_if_untested_transformers() -> None:
    """Say once per process, when the installed transformers is outside `TESTED_TRANSFORMERS`, which
    versions the model's code was tested with and how to re-save the model with newer code."""
    reason = untested_transformers()
    if reason is not None:
        logger.warning_once(f"{reason}. If the model fails or its outputs look wrong, {RESAVE_ADVICE}.")


class IncompatibleTransformersError(ImportError):
    """The installed transformers lacks a name this model's code imports."""


@contextmanager
def transformers_names() -> Iterator[None]:
    """Around imports from transformers' modules: a name that the installed release no longer has
    raises `IncompatibleTransformersError`, one line naming both versions and what to do."""
    try:
        yield
    except ImportError as error:
        oldest, newest = TESTED_TRANSFORMERS
        raise IncompatibleTransformersError(
            f"This LSG model's code (lsg-converter {LSG_CODE_VERSION}, tested with transformers {oldest} to "
            f"{newest}) cannot import {error.name or 'a name'} from transformers {transformers.__version__} "
            f"({error}): install transformers=={newest}, or {RESAVE_ADVICE}."
        ) from None


def _arguments(arguments: dict[str, Any]) -> Iterator[Any]:
    """The values of a forward's bound arguments, those caught by its ``**kwargs`` included."""
    for value in arguments.values():
        if isinstance(value, dict):
            yield from value.values()
        else:
            yield value


def forward_cache(arguments: dict[str, Any]) -> Cache | None:
    """The key/value cache among a forward's arguments (by name: a bound signature's arguments, or a
    call's keyword arguments), whatever the transformers release calls it; None without one."""
    return next((value for value in _arguments(arguments) if isinstance(value, Cache)), None)


def past_length(arguments: dict[str, Any]) -> int:
    """The tokens a decoding step's cache holds before it: the cache's length where the forward has the
    cache, else the embeddings' past-length argument; 0 for a forward that starts from nothing."""
    cache = forward_cache(arguments)
    if cache is not None:
        return cache.get_seq_length()
    return next((arguments[name] for name in PAST_LENGTH_ARGUMENTS if arguments.get(name)), 0)


def with_past_length(kwargs: dict[str, Any], length: int) -> dict[str, Any]:
    """The embeddings' keyword arguments, which hold a past-length argument, with it set to `length`."""
    name = next(name for name in PAST_LENGTH_ARGUMENTS if name in kwargs)
    return {**kwargs, name: length}


def relative_position_buckets(attention: Any, relative_position: torch.Tensor) -> torch.Tensor:
    """T5's bucket of each relative position (key - query, int64) in the bidirectional (encoder)
    attention module `attention` of T5, mT5 or UMT5: transformers' ``_relative_position_bucket``."""
    bucket = attention._relative_position_bucket
    if "num_buckets" in inspect.signature(bucket).parameters:  # T5, mT5: a static method
        return bucket(
            relative_position,
            bidirectional=True,
            num_buckets=attention.relative_attention_num_buckets,
            max_distance=attention.relative_attention_max_distance,
        )
    return bucket(relative_position)  # UMT5: bidirectional in an encoder module


def record_outputs_like_source(model_class: type) -> None:
    """Have transformers' output recorder (``capture_outputs``) record, for a model whose class LSG made
    after it was built (a step class adopting it, lsg_global_tokens), the outputs its class's
    ``_can_record_outputs`` names: transformers looks them up under the name of the model's class
    (``str(type(model))``), entered when a model is built, in 5.13 as in 5.24."""
    dict.__setitem__(_CAN_RECORD_REGISTRY, str(model_class), model_class._can_record_outputs)
