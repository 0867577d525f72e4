"""How LSG reaches the self-attention layers of a model: by transformers' dispatch, or by a module swap.

An architecture states it once, in its mixin's ``lsg_attention`` (see lsg_model.LSGModelMixin):

* `DispatchedAttention` (the default): the layers call transformers' attention interface
  (``ALL_ATTENTION_FUNCTIONS``) with ``self.config._attn_implementation`` (BERT, BART, ...); an LSG
  layer's ``config`` is the model's seen through a `lsg_attention.DispatchConfig`, which names the LSG
  attention registered for the backend the model's config names
  (`lsg_attention.registered_attention_forward`), and the layer holds the role that makes that function
  run LSG attention for it (`lsg_attention.SelfAttentionRole`, with the model's settings).
* `SwappedAttention`: the layers compute attention by hand (MPNet, DeBERTa-v2): every module of the
  named classes is replaced, before the weights load, by a module built from it that keeps its
  parameters under their names (checkpoints load as they are); the attention module calls
  `swapped_attention_forward` itself (MPNet also swaps its encoder, whose relative position bias
  becomes per-block position terms). `adopted` builds such a replacement from a subclass.

Either way the attention's LSG settings are the model's, resolved once when it is built (`LSGSettings`),
never read from the config at a call; the backend is, at each call (`DispatchConfig`).

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_attention,
lsg_defaults, lsg_layout, lsg_rotary, lsg_settings and lsg_transformers only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from torch import nn

from .lsg_attention import DispatchConfig, SelfAttentionRole, lsg_attention_forward, lsg_backend
from .lsg_defaults import PRETRAINED_POSITIONS_KEY
from .lsg_layout import adopt
from .lsg_rotary import GlobalDistanceClamp
from .lsg_settings import LSGSettings
from .lsg_transformers import attn_implementation


class AttentionReach(Protocol):
    """How LSG reaches the self-attention layers under a model's recorder (see `recorded_modules`)."""

    def apply(self, recorder: nn.Module, config: Any, settings: LSGSettings) -> None:
        """Make the self-attention layers under `recorder` run LSG attention with `settings` for the
        model's `config`."""


@dataclass(frozen=True)
class DispatchedAttention:
    """The layers that `recorder` records as ``attentions`` reach LSG attention by transformers' dispatch:
    each holds its `SelfAttentionRole` as ``lsg_role`` (causal in a decoder-only LSG model's causal layers)
    and, as ``config``, the model's `config` seen through one `DispatchConfig`, which names the LSG
    attention registered for the model's backend."""

    def apply(self, recorder: nn.Module, config: Any, settings: LSGSettings) -> None:
        dispatch = DispatchConfig(config)
        for module in recorded_modules(recorder, "attentions"):
            module.lsg_role = self.role(module, config, settings)
            module.config = dispatch

    def role(self, module: nn.Module, config: Any, settings: LSGSettings) -> SelfAttentionRole:
        """The role of one attention layer: LSG attention with the model's `settings`."""
        return SelfAttentionRole(settings, bool(getattr(config, "is_decoder", False) and getattr(module, "is_causal", False)))


@dataclass(frozen=True)
class RotaryAttention(DispatchedAttention):
    """`DispatchedAttention` in an encoder with rotary positions: where the config's ``clamp_global_distances``
    is on (the default), the layers that read every block's global tokens (`reads_far_global_tokens`) clamp
    the global tokens' distances to the positions the source was trained on (``pretrained_positions``, else
    ``max_position_embeddings``), rotating with the buffer `frequencies` of the recorder's module
    `rotary_module` (`lsg_rotary.GlobalDistanceClamp`)."""

    rotary_module: str = "rotary_emb"
    frequencies: str = "inv_freq"

    def apply(self, recorder: nn.Module, config: Any, settings: LSGSettings) -> None:
        super().apply(recorder, config, settings)
        if not getattr(config, "clamp_global_distances", True):
            return
        trained = getattr(config, PRETRAINED_POSITIONS_KEY, None) or config.max_position_embeddings
        clamp = GlobalDistanceClamp(recorder, self.rotary_module, self.frequencies, trained)
        for module in recorded_modules(recorder, "attentions"):
            if self.reads_far_global_tokens(module):
                module.lsg_role = dataclasses.replace(module.lsg_role, global_clamp=clamp)

    def reads_far_global_tokens(self, module: nn.Module) -> bool:
        """Whether the attention layer `module` reads the global tokens from every block (every layer; not
        ModernBERT's sliding-window layers, which read them within their window only)."""
        return True


Replacement = Callable[[nn.Module, Any], nn.Module]  # (source module, model config) -> the module in its place


@dataclass(frozen=True, init=False)
class SwappedAttention:
    """For each (source class, replacement) pair, in order, every module of the source class under the
    recorder is replaced by ``replacement(source_module, config)``.

    The replacement takes the source module's place (same name) and its parameters (same names, so a
    checkpoint of the source architecture loads as it is). An attention replacement computes queries,
    keys and values itself, calls `swapped_attention_forward` (the backend of the model's config, read
    at each call, so ``set_attn_implementation`` reaches it) and returns what the source module returned.
    """

    swaps: tuple[tuple[type[nn.Module], Replacement], ...]

    def __init__(self, *swaps: tuple[type[nn.Module], Replacement]) -> None:
        object.__setattr__(self, "swaps", swaps)

    def apply(self, recorder: nn.Module, config: Any, settings: LSGSettings) -> None:
        """Swap the modules; each replacement holds the model's `settings` as ``lsg_settings``."""
        for source, replacement in self.swaps:
            swapped = [name for name, module in recorder.named_modules() if isinstance(module, source)]
            for name in swapped:
                module = replacement(recorder.get_submodule(name), config)
                module.lsg_settings = settings
                recorder.set_submodule(name, module)


def adopted(subclass: type[nn.Module]) -> Replacement:
    """The replacement that turns a module into an instance of `subclass` (a subclass of the module's
    class that overrides what LSG changes, as transformers' modular files inherit and override): a new
    module holding the source module's submodules, parameters and buffers as they are, and the model's
    config as ``config``."""
    parent = subclass.__mro__[1]

    def replace(source: nn.Module, config: Any) -> nn.Module:
        if not isinstance(source, parent):
            raise TypeError(f"{subclass.__name__} adopts a {parent.__name__}, not a {type(source).__name__}.")
        module = adopt(source, subclass)
        module.config = config
        return module

    return replace


def swapped_attention_forward(
    module: nn.Module, query, key, value, attention_mask, scaling: float, **kwargs: Any
) -> tuple[Any, Any]:
    """What a swapped attention module calls with its queries, keys and values (B, H, N, D): LSG attention
    with the module's ``lsg_settings`` (the model's), the backend the model's config names (read at each
    call) and, in training, DropKey at the rate of the module's ``dropout`` (a Dropout module or a rate);
    `kwargs` go on to `lsg_attention.lsg_attention_forward` (position_terms=, output_attentions=).
    Returns (output (B, N, H, D), weights or None)."""
    return lsg_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        module.lsg_settings,
        dropout=getattr(module.dropout, "p", module.dropout) if module.training else 0.0,  # a module or a rate (T5)
        scaling=scaling,
        backend=lsg_backend(attn_implementation(module.config)),
        **kwargs,
    )


def projected_self_attention(
    module: nn.Module, hidden_states: Any, attention_mask: Any, head_size: int, scaling: float, **kwargs: Any
) -> tuple[Any, Any]:
    """The self-attention of a swapped module that holds its projections as linear layers ``q``, ``k``,
    ``v`` and ``o`` (MPNet's, T5's): (B, L, E) -> (output (B, L, E), weights or None); `kwargs` go on to
    `swapped_attention_forward` (position_terms=, output_attentions=)."""
    shape = (*hidden_states.shape[:-1], -1, head_size)  # (B, L, H, D)
    query, key, value = (layer(hidden_states).view(shape).transpose(1, 2) for layer in (module.q, module.k, module.v))
    output, weights = swapped_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    return module.o(output.flatten(-2)), weights  # output: (B, L, H, D) -> (B, L, H * D) -> (B, L, E)


def recorded_modules(recorder: nn.Module, output: str, declared: dict[str, Any] | None = None) -> list[nn.Module]:
    """The modules whose outputs `recorder` records as `output` ("hidden_states", "attentions", ...):
    the model whose forward transformers' ``capture_outputs`` decorates (the base model, or the encoder
    of an encoder-decoder model) records them with hooks on the modules its ``_can_record_outputs`` names;
    a model that builds its outputs by hand (MPNet) has them `declared` by its LSG mixin instead."""
    recorded = (declared or recorder.can_record_outputs)[output]  # a module class, or transformers' recorder spec naming one
    module_class = getattr(recorded, "target_class", recorded)
    name_part = getattr(recorded, "layer_name", None) or ""
    return [module for name, module in recorder.named_modules() if isinstance(module, module_class) and name_part in name]
