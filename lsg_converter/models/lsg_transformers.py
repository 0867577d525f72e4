"""What LSG's remote code relies on in torch and transformers beyond their public API, in one place.

LSG models subclass transformers' modeling classes, so a transformers release can break them the way
transformers 4.41 broke the 2023 reference; torch may rename its private modules and ops as freely.
Adapting to a release starts here: the rest of the remote code reaches every such name through this
module. tests/test_private_names.py lists each private one (a leading underscore) with what LSG does with
it, and fails where another file of this folder names a private torch or transformers name, unless it
defines one that the table lists as overridden (a class attribute or method an LSG class must define),
and where a name in the table is gone from the installed releases.

* Forward arguments read by name. transformers 5.24 renamed ``past_key_values`` to ``cache`` (the
  model's and the layers' forward) and ``past_key_values_length`` to ``cache_length`` (the
  embeddings'): `forward_cache` finds the cache by its type, whatever the argument is called, and
  `past_length` / `with_past_length` know both names of the embeddings' argument.
* Private names reached (called, read, written or imported), each through one function or name here:
  ``torch._check`` (`shape_check`), ``torch._inductor.compile_fx.compile_fx`` (`inductor_compile`),
  ``torch._dynamo.exc.TorchDynamoException`` (`compile_error`), the CPU flash kernel
  ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` (`CPU_FLASH_ATTENTION`) and its backward
  (`CPU_FLASH_ATTENTION_BACKWARD`), ``torch.autograd._unsafe_preserve_version_counter`` (`unchanged_version`); a config's
  ``_attn_implementation`` and ``_attn_implementation_internal`` (`attn_implementation`,
  `store_attn_implementation`), a model's ``_init_weights`` (`init_weights`) and ``_auto_class``
  (`clear_auto_class`), a model class's ``_supports_sdpa`` / ``_supports_flex_attn``
  (`dense_implementations`); ``_relative_position_bucket`` of T5's, mT5's and UMT5's attention modules (a
  static method with the bucket settings as arguments in T5 and mT5, a method reading them from the
  module in UMT5), through `relative_position_buckets`.
* Private names overridden (lsg_model): ``_supports_sdpa`` / ``_supports_flex_attn`` /
  ``_supports_flash_attn`` / ``_supports_attention_backend``, ``_can_set_attn_implementation``.
* Public names whose behaviour LSG relies on: ``transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS``
  (transformers' own attention functions, by name) and ``transformers.utils.is_torch_flex_attn_available``,
  imported here; ``can_record_outputs`` and ``OutputRecorder.target_class`` / ``layer_name`` (which
  layers the output recorder hooks); ``get_correct_attn_implementation``, ``set_attn_implementation``,
  ``post_init`` and ``register_for_auto_class``, overridden or called in lsg_model.
* Private registry written: ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY``, where
  ``capture_outputs`` looks up which layers a model records (its class's ``_can_record_outputs``) by
  the name of the class it was built as; `record_outputs_like_source` enters an LSG step class made
  from a built model (lsg_global_tokens).
* Module paths: each ``modeling_lsg_<arch>.py`` subclasses the classes of
  ``transformers.models.<arch>.modeling_<arch>``; MPNet and DeBERTa-v2 also subclass modules inside
  them (their attention, encoder, layers), whose forward signatures they follow.

`TESTED_TRANSFORMERS` is the range this code was tested with; a model meeting another transformers
says so once (`warn_if_untested_transformers`), and an import that a release removed fails with one
line naming both versions (`transformers_names`).

This file travels with saved models as remote code: it imports torch and transformers only (nothing of this
folder).
"""

from __future__ import annotations

import inspect
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import transformers
import torch
from transformers import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torch_flex_attn_available, logging
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "CPU_FLASH_ATTENTION",
    "CPU_FLASH_ATTENTION_BACKWARD",
    "LSG_CODE_VERSION",
    "TESTED_TRANSFORMERS",
    "attn_implementation",
    "clear_auto_class",
    "compile_error",
    "convert_weights_as",
    "dense_implementations",
    "forward_cache",
    "inductor_compile",
    "init_weights",
    "is_torch_flex_attn_available",
    "past_length",
    "record_outputs_like_source",
    "relative_position_buckets",
    "shape_check",
    "store_attn_implementation",
    "unchanged_version",
    "transformers_names",
    "warn_if_untested_transformers",
    "with_past_length",
]

logger = logging.get_logger(__name__)

LSG_CODE_VERSION = "0.5.0"  # the lsg-converter release this code comes from (its _version.py)
TESTED_TRANSFORMERS = ("5.13.0", "5.24.0")  # the oldest and the newest transformers CI ran this code with

# The embeddings' argument that counts the cached tokens of a decoding step, newest name first.
PAST_LENGTH_ARGUMENTS = ("cache_length", "past_key_values_length")

# The CPU flash kernel, which also returns each query's log-sum-exp (absent from older torch builds)
CPU_FLASH_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
CPU_FLASH_ATTENTION_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

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


def unchanged_version(tensor: torch.Tensor) -> Any:
    """A context in which changing `tensor` in place does not count as a change for autograd (its version
    counter is restored on exit): for rows a kernel's backward never reads into a gradient."""
    return torch.autograd._unsafe_preserve_version_counter(tensor)


def shape_check(condition: Any) -> None:
    """Raise where `condition` is false; under torch.compile and torch.export, a condition on symbolic sizes
    becomes a fact the compiled graph relies on (``torch._check``; dynamo traces through this function)."""
    torch._check(condition)


def inductor_compile(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """`graph` compiled by inductor, torch.compile's default backend (``torch._inductor.compile_fx.compile_fx``,
    imported at the first compile): what a torch.compile backend of its own calls to count its compiles."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(graph, example_inputs)


def compile_error() -> type[Exception]:
    """The class of the errors a failed torch.compile raises, inductor's included
    (``torch._dynamo.exc.TorchDynamoException``; read when one is caught, as dynamo is loaded by then)."""
    return torch._dynamo.exc.TorchDynamoException


def convert_weights_as(lsg_model_type: str, source_model_type: str) -> None:
    """Have transformers rename the weights of a checkpoint for `lsg_model_type` as it renames those of
    `source_model_type` (its checkpoint conversion mapping: NomicBERT's and GTE's hub checkpoints keep their
    original names, ``emb_ln``, ``attn.Wqkv``, which transformers turns into its modules' when it loads them,
    and back when it saves), when it loads and saves a model of that type, remote code included. Does nothing
    where transformers has no mapping for the source type."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping

    mapping = get_checkpoint_conversion_mapping(source_model_type)
    if mapping is not None:
        register_checkpoint_conversion_mapping(lsg_model_type, mapping, overwrite=True)


def attn_implementation(config: Any) -> str | None:
    """The attention implementation transformers' layers dispatch on (a config's ``_attn_implementation``)."""
    return config._attn_implementation


def store_attn_implementation(config: Any, value: str | None) -> None:
    """Set the value behind a config's ``_attn_implementation`` without its setter."""
    config._attn_implementation_internal = value


def dense_implementations(model_class: type) -> tuple[str, ...]:
    """The attention implementations transformers' `model_class` runs: eager, and sdpa and flex_attention
    where its ``_supports_sdpa`` / ``_supports_flex_attn`` say so (T5 before transformers 5.2x writes its
    attention by hand: eager only)."""
    flags = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}
    return ("eager", *(name for name, flag in flags.items() if getattr(model_class, flag, False)))


def init_weights(model: Any, module: torch.nn.Module) -> None:
    """Draw the weights of `module`, one module of `model`, as `model` draws its own (``_init_weights``)."""
    model._init_weights(module)


def clear_auto_class(cls: type) -> None:
    """Leave the model class `cls` unregistered for remote-code saving, where it would inherit the Auto class
    of a registered parent (``_auto_class``)."""
    cls._auto_class = None


def record_outputs_like_source(model_class: type) -> None:
    """Have transformers' output recorder (``capture_outputs``) record, for a model whose class LSG made
    after it was built (a step class adopting it, lsg_global_tokens), the outputs its class's
    ``_can_record_outputs`` names: transformers looks them up under the name of the model's class
    (``str(type(model))``), entered when a model is built, in 5.13 as in 5.24."""
    dict.__setitem__(_CAN_RECORD_REGISTRY, str(model_class), model_class._can_record_outputs)
