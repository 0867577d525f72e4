"""The LSG steps around each forward pass of a model's recorder, and the rewrite of a decoder's encoder mask.

The recorder is the model whose forward transformers' ``capture_outputs`` decorates: the base model
(LSGBertModel, the ``bert`` of LSGBertForMaskedLM), or the encoder of an encoder-decoder model. Its
forward builds the attention masks and records the hidden states, so LSG steps in around it
(`RecorderSteps`): the `ForwardCall` of the global tokens made and held for the pass, the O(n) padding
mask with the global tokens' columns in (`padding_mask_view`), their rows taken out of what it
returns. The bare model runs them in its own ``forward`` (`RecorderForward`); a recorder inside the
model is adopted into a step class with that same ``forward`` (`CarriesGlobalTokens`, and
`CarriesAndDropsGlobalTokens` for an encoder that is its own recorder). An encoder base model reading
a padded batch of very different lengths without gradients runs it as groups of rows (`LengthGroups`).

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_attention,
lsg_global_tokens, lsg_pattern and lsg_transformers only.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .lsg_attention import SelfAttentionRole, padding_rows, plan_padding
from .lsg_global_tokens import DropsGlobalTokens, GlobalTokens, GlobalTokenStep
from .lsg_pattern import tracing
from .lsg_transformers import past_length


def bound_arguments(signature: inspect.Signature, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by name, those its ``**kwargs`` catch included, as keywords of the forward."""
    arguments = signature.bind_partial(*args, **kwargs).arguments
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
            arguments = {**arguments, **arguments.pop(name)}
    return arguments


def user_padding_rows(mask: torch.Tensor) -> torch.Tensor:
    """The user's ``attention_mask`` -> (B, t) (`lsg_attention.padding_rows`), one given as (B, 1, 1, t)
    additive (0 and negative) read as the 1s and 0s it stands for."""
    rows = padding_rows(mask)
    if mask.dim() > 2 and rows.is_floating_point() and bool((rows < 0).any()):
        rows = rows == 0
    return rows


def padding_mask_view(arguments: dict[str, Any], num_global: int) -> torch.Tensor | None:
    """The ``attention_mask`` of the module that builds a model's attention masks (its recorder, see
    `RecorderSteps`): the padding mask as a (B, 1, 1, g + t) bool view, with True columns in front for
    the g global tokens the layers' keys hold (put in front by this pass, or held by the cache of a
    decoding step, whose mask counts the past tokens after them). transformers' mask creation passes it
    through as it is, so the LSG layers get an O(n) mask whatever the backend (for "sdpa" or "eager"
    transformers would build a (B, 1, t, t) matrix). Without a mask, one True broadcast to every key
    stands for it: the LSG layers then know without reading it that no key is masked
    (`lsg_attention.key_padding_mask`). None (the call unchanged) without any input."""
    mask = arguments.get("attention_mask")
    cached = past_length(arguments)  # a decoding step's cache holds the global tokens in front
    if mask is None:
        tokens = next((arguments[name] for name in ("input_ids", "inputs_embeds") if arguments.get(name) is not None), None)
        if tokens is None:
            return None
        keys = tokens.shape[1] + (cached if cached else num_global)
        return torch.ones((), dtype=torch.bool, device=tokens.device).expand(tokens.shape[0], 1, 1, keys)
    return F.pad(user_padding_rows(mask).bool(), (num_global, 0), value=True)[:, None, None, :]


def layer_kinds(recorder: nn.Module) -> list[tuple[Any, bool]]:
    """The kinds of LSG self-attention layer under `recorder`, (settings, causal), in the order of their
    first layer: those of the layers' roles (`lsg_attention.SelfAttentionRole`), and the bidirectional ones
    of the swapped attention modules' ``lsg_settings`` (`lsg_attention_layers.SwappedAttention`)."""
    kinds = []
    for module in recorder.modules():
        role = getattr(module, "lsg_role", None)
        if isinstance(role, SelfAttentionRole):
            kinds.append((role.settings, role.causal))
        elif getattr(module, "lsg_settings", None) is not None:
            kinds.append((module.lsg_settings, False))
    return list(dict.fromkeys(kinds))


class RecorderSteps:
    """The LSG steps around a forward pass of a model's recorder: its `ForwardCall` made
    (`GlobalTokens.open`) and held as the model's `GlobalTokens.call` while the forward runs (the
    enclosing pass's given back after it, returned or raised), the O(n) padding mask with the global
    tokens' columns (`padding_mask_view`), shared by the layers for the pass: what they make from it
    alone is made once, before them, and kept with the mask (`lsg_attention.plan_padding`); after the forward, the
    recorded hidden states replaced by the token rows and a tuple made if the caller asked for one
    (`GlobalTokens.finish`). A bare
    model that holds its layers itself (no encoder module: GTE, NomicBERT, EuroBERT) is its own encoder: its
    output drops the global tokens there too (`drops`; inside a head, `CarriesAndDropsGlobalTokens`).

    The model's ``forward`` runs them (`RecorderForward`), where the model is its own recorder
    (LSGBertModel) as where the recorder is a module inside it, adopted into a step class
    (`CarriesGlobalTokens`: the ``bert`` of LSGBertForMaskedLM, BART's encoder).
    """

    def __init__(self, recorder: nn.Module, global_tokens: GlobalTokens, drops: bool = False) -> None:
        self.signature = inspect.signature(recorder.forward)
        self.global_tokens = global_tokens
        self.drops = drops  # the bare model of an architecture whose layers are its own (no encoder module)
        self.kinds: list[tuple[Any, bool]] | None = None  # (settings, causal) of its LSG layers, found at the first pass

    def run(self, recorder: nn.Module, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`forward` (the recorder's own, bound) called inside the steps: once, or once per group of rows
        of a batch whose lengths differ widely (`LengthGroups`)."""
        kwargs = bound_arguments(self.signature, args, kwargs)
        groups = LengthGroups.of(recorder, kwargs)
        if groups is not None:
            return groups.merge([self._run_once(recorder, forward, groups.inputs(kwargs, group)) for group in groups.rows])
        return self._run_once(recorder, forward, kwargs)

    def _run_once(self, recorder: nn.Module, forward: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """`forward` called once inside the steps, with the keyword arguments `kwargs`."""
        global_tokens = self.global_tokens
        call = global_tokens.open(kwargs)
        mask = padding_mask_view(kwargs, global_tokens.config.num_global_tokens)
        kwargs = {**kwargs, "return_dict": True}  # a ModelOutput, turned into a tuple by `finish`
        if mask is not None:
            kwargs["attention_mask"] = mask
        if not tracing():  # (a compiled graph or an export makes the plan in every layer)
            if self.kinds is None:
                self.kinds = layer_kinds(recorder)
            # what the layers make from the mask alone: made once for the pass (a cached decoding step's layers
            # read the keys of their queries' blocks alone: nothing to plan over the whole history)
            plan_padding(mask, () if past_length(kwargs) else self.kinds)
        enclosing, global_tokens.call = global_tokens.call, call
        try:
            output = forward(**kwargs)
            return global_tokens.finish(global_tokens.drop(output) if self.drops else output)
        finally:
            global_tokens.call = enclosing


class LengthGroups:
    """The rows of a right-padded batch grouped by length, each group to run truncated to its longest row.

    In one pass the projections and feed-forward layers of every layer run over every padded position:
    a batch of one 16,000-token text and three of 500 costs four times the texts run alone, though LSG
    attention leaves the blocks of padding out. Rows are grouped, longest first, while a row is more than
    1 / `SPLIT_RATIO` of its group's longest: rows of similar lengths keep running together.

    The outputs at the real tokens are those of the batch in one pass (trailing padding is masked and
    changes no real token's output under LSG attention); the positions of padding get zeros. Only where
    nothing else could differ: an encoder base model (not a decoder, no cache), in eval mode without
    gradients, keyword inputs of shape (B, T) or (B, T, ...) among `SPLIT_INPUTS`, a (B, T) mask that is
    right-padded, no attention weights asked for and a ModelOutput returned.
    """

    SPLIT_RATIO = 2
    SPLIT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds")
    SEQUENCE_FIELDS = ("last_hidden_state", "hidden_states")  # (B, T, ...) outputs; the others are (B, ...)
    ROW_FIELDS = ("pooler_output",)

    def __init__(self, rows: list[tuple[torch.Tensor, int]], batch: int, length: int) -> None:
        self.rows = rows  # (row indices, the group's length) per group
        self.batch, self.length = batch, length

    @classmethod
    def of(cls, recorder: nn.Module, kwargs: dict[str, Any]) -> LengthGroups | None:
        """The groups of this call, or None where it runs in one pass."""
        config = recorder.config
        mask = kwargs.get("attention_mask")
        if (
            recorder.training
            or torch.is_grad_enabled()
            or tracing()
            or getattr(config, "is_decoder", False)
            or getattr(config, "is_encoder_decoder", False)
            or mask is None
            or mask.dim() != 2
            or mask.shape[0] < 2
            or kwargs.get("output_attentions", getattr(config, "output_attentions", False))
            or kwargs.get("return_dict", getattr(config, "return_dict", True)) is False
            or any(isinstance(value, torch.Tensor) for name, value in kwargs.items() if name not in cls.SPLIT_INPUTS)
            or any(kwargs.get(name) is not None and kwargs[name].shape[:2] != mask.shape for name in cls.SPLIT_INPUTS)
        ):
            return None
        batch, length = mask.shape
        mask = mask.bool()
        lengths = mask.sum(dim=1)
        if not bool((mask == (torch.arange(length, device=mask.device) < lengths[:, None])).all()):
            return None  # padding on the left, or inside the rows
        lengths = lengths.clamp(min=1).tolist()
        groups: list[list[int]] = []
        for row in sorted(range(batch), key=lambda row: -lengths[row]):
            if groups and lengths[row] * cls.SPLIT_RATIO > lengths[groups[-1][0]]:
                groups[-1].append(row)
            else:
                groups.append([row])
        if len(groups) == 1:
            return None
        rows = [(torch.tensor(sorted(group), device=mask.device), lengths[group[0]]) for group in groups]
        return cls(rows, batch, length)

    @staticmethod
    def inputs(kwargs: dict[str, Any], group: tuple[torch.Tensor, int]) -> dict[str, Any]:
        """The call's keyword arguments for one group: its rows, truncated to its length."""
        rows, length = group
        return {name: value[rows, :length] if name in LengthGroups.SPLIT_INPUTS and value is not None else value
                for name, value in kwargs.items()}

    def merge(self, outputs: list[Any]) -> Any:
        """The groups' outputs as the batch's: rows back in place, sequences padded with zeros to T."""
        merged = {}
        for name, first in outputs[0].items():
            parts = [output[name] for output in outputs]
            if name in self.SEQUENCE_FIELDS:
                merged[name] = (self._rows(parts, sequence=True) if isinstance(first, torch.Tensor)
                                else tuple(self._rows(layer, sequence=True) for layer in zip(*parts)))
            elif name in self.ROW_FIELDS:
                merged[name] = self._rows(parts, sequence=False)
            else:
                raise NotImplementedError(f"LengthGroups cannot merge the output {name!r}")
        return type(outputs[0])(**merged)

    def _rows(self, parts: list[torch.Tensor], sequence: bool) -> torch.Tensor:
        """(n_i, L_i, ...) or (n_i, ...) per group -> (B, T, ...) or (B, ...)."""
        first = parts[0]
        shape = (self.batch, self.length, *first.shape[2:]) if sequence else (self.batch, *first.shape[1:])
        merged = first.new_zeros(shape)
        for part, (rows, _) in zip(parts, self.rows):
            if sequence:
                merged[rows, : part.shape[1]] = part
            else:
                merged[rows] = part
        return merged


class RecorderForward:
    """``forward`` of every LSG model (`lsg_model.LSGModelMixin`) and of the recorder inside one
    (`CarriesGlobalTokens`): the Hugging Face class's own forward, run inside the `RecorderSteps` of a
    module that is its model's recorder (its ``lsg_forward_steps``).

    The steps must run when code calls ``model.forward(...)`` directly, skipping the call hooks
    (sentence-transformers does), so they cannot be hooks of the model itself. A class attribute that
    gives, for each model, a functools.partial of `RecorderSteps.run` whose ``__wrapped__`` is the Hugging
    Face forward, rather than a method of the mixin: ``inspect.signature(model.forward)`` (transformers,
    Trainer, sentence-transformers) then reads the parameters of that forward (a method of the mixin
    would show ``*args, **kwargs``), and torch.export reads the code of a function, or a partial of one.
    A model whose recorder is a module inside it (a head) has no steps of its own: its forward is the
    Hugging Face one, and the recorder runs the steps through this same ``forward`` of its step class
    (`CarriesGlobalTokens`).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner = owner  # the mixin or step class: the forward below it in the MRO is the Hugging Face one

    def __get__(self, model: nn.Module | None, model_class: type | None = None) -> Callable[..., Any]:
        forward = super(self.owner, model if model is not None else model_class).forward
        steps = None if model is None else model.lsg_forward_steps
        if steps is None:
            return forward
        run = functools.partial(RecorderSteps.run, steps, model, forward)
        if not torch.compiler.is_compiling():  # dynamo cannot set a partial's attributes; nothing reads them there
            run.__wrapped__ = forward  # what inspect.signature reads
        return run


class CarriesGlobalTokens(GlobalTokenStep):
    """The recorder where it is a module inside the model (the ``bert`` of LSGBertForMaskedLM): its forward
    runs inside its `RecorderSteps` (``lsg_forward_steps``), as the bare model's own forward does.

    transformers' output recorder finds the layers a model records by the class it was built as: the
    step class is entered under its own name with what its source class records
    (`GlobalTokenStep.__init_subclass__`)."""

    label = "{}WithGlobalTokens"
    forward = RecorderForward()
    lsg_forward_steps: RecorderSteps


class CarriesAndDropsGlobalTokens(CarriesGlobalTokens, DropsGlobalTokens):
    """The encoder where it is the recorder (BART's, T5's): its forward runs inside its `RecorderSteps`,
    and its output drops the global tokens inside them (`DropsGlobalTokens`), before the hidden states
    are finished."""

    label = "{}DroppingGlobalTokens"


class SeesGlobalStates(GlobalTokenStep):
    """The decoder of an encoder-decoder model with ``pass_global_tokens_to_decoder``: the encoder output it
    attends to holds the g global states in front, so its ``encoder_attention_mask`` gets their columns
    (`GlobalTokens.covered_encoder_mask`), wherever the caller put it."""

    label = "{}SeeingGlobalTokens"
    lsg_encoder_mask: ArgumentRewrite

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self.lsg_encoder_mask(args, kwargs)
        return super().forward(*args, **kwargs)


class ArgumentRewrite:
    """The arguments of a module's forward with the argument `name` replaced by what `rewrite` makes of
    the call's arguments (a dict by name); None leaves the call as it is. The value goes where the
    caller put the argument (or in as a keyword); the forward's signature is read once."""

    def __init__(self, module: nn.Module, name: str, rewrite: Callable[[dict[str, Any]], Any]) -> None:
        self.signature = inspect.signature(module.forward)
        self.name, self.rewrite = name, rewrite
        self.position = list(self.signature.parameters).index(name)

    def __call__(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        value = self.rewrite(self.signature.bind_partial(*args, **kwargs).arguments)
        if value is None:
            return args, kwargs
        if self.position < len(args):
            return (*args[: self.position], value, *args[self.position + 1 :]), kwargs
        return args, {**kwargs, self.name: value}
