"""Where LSG joins an architecture: the one description of its modules that the model and the converter read.

Each architecture's model mixin states an `LSGLayout` (``lsg_layout``); the LSG model reads it to find
where the global tokens live, join and leave, and the converter reads it to find the position tables
it lengthens and the rows the global tokens start from. `adopt` is how LSG puts its own modules in
those places.

This file travels with saved models as remote code: it imports torch only (nothing of this folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class LSGLayout:
    """The places of an architecture's modules, as names relative to the base model (``model.base_model``).

    Attributes:
        embeddings: the module that holds the global token table (``global_embeddings``, where the 2023
            reference stored it) and, in decoders, receives the past length.
        prepend_before: the module whose input (the summed embeddings) gets the global tokens in front:
            the first of these names the model holds (DeBERTa: its projection where the embeddings are
            narrower than the layers, else its LayerNorm); the embedding normalisation, or the first
            layer in a model without one (Pegasus).
        encoder: the module whose output drops the global tokens again.
        decoder: the decoder of an encoder-decoder model (skipped where the model has none).
        positions_after_padding: positions start after the padding id (RoBERTa's convention), so the
            position table holds ``pad_token_id + 1`` rows that no token reaches.
        position_tables: the position embedding modules, the first one giving the global tokens their
            positions (a decoder-only head holds only the decoder's, a model without absolute positions,
            DeBERTa-v3, none).
        sinusoidal_positions: the layout of fixed sinusoidal position tables, which the converter
            regenerates at the new length instead of tiling them: "halves" (Pegasus: sines, then
            cosines) or "interleaved" (DistilBERT: sine, cosine, ...); None for learned tables.
        sinusoidal_switch: the config key that makes the tables sinusoidal (DistilBERT's
            ``sinusoidal_pos_embds``: learned otherwise); None where `sinusoidal_positions` always holds.
        token_type_table: the token type embedding module added to the global tokens, if any.
        rotary_embeddings: the rotary position modules, called with the states and their position ids (GTE,
            NomicBERT, EuroBERT): the global tokens get position 0 there, in front of the tokens' own.
        pretrained_length: the tokens a model reads whose config names no ``max_position_embeddings``
            (T5: relative positions without a table, pretrained on 512); a converted model's config
            names its length.
    """

    embeddings: str = "embeddings"
    prepend_before: tuple[str, ...] = ("embeddings.LayerNorm",)
    encoder: str = "encoder"
    decoder: str = "decoder"
    positions_after_padding: bool = False
    position_tables: tuple[str, ...] = ("embeddings.position_embeddings",)
    sinusoidal_positions: str | None = None
    sinusoidal_switch: str | None = None
    token_type_table: str | None = None
    rotary_embeddings: tuple[str, ...] = ()
    pretrained_length: int | None = None

    def prepend_point(self, base: nn.Module) -> nn.Module:
        """The module of `base` whose input gets the global tokens in front (see `prepend_before`)."""
        modules = dict(base.named_modules())
        found = next((modules[name] for name in self.prepend_before if name in modules), None)
        if found is None:
            raise LookupError(f"{type(base).__name__} holds none of {', '.join(self.prepend_before)}.")
        return found

    def sinusoid_layout(self, config: Any) -> str | None:
        """The layout of the sinusoidal position tables of a model with `config`; None where they are learned."""
        if self.sinusoidal_switch is not None and not getattr(config, self.sinusoidal_switch, False):
            return None
        return self.sinusoidal_positions

    def max_input_length(self, config: Any) -> int:
        """Tokens a model reads: the rows of its position table (max_position_embeddings), less the
        padding rows that positions start after in RoBERTa's convention (`positions_after_padding`);
        `pretrained_length` where the config names no max_position_embeddings."""
        rows = getattr(config, "max_position_embeddings", None)
        if rows is None:
            return self.pretrained_length
        padding_rows = config.pad_token_id + 1 if self.positions_after_padding else 0
        return rows - padding_rows


# The layout of the encoder-decoder models (BART, mBART, Pegasus): the global tokens live in the encoder.
ENCODER_DECODER_POSITIONS = ("encoder.embed_positions", "decoder.embed_positions")
# Where a BERT-like encoder with rotary positions (NomicBERT, GTE) keeps its modules: no encoder module (the
# layers are the base model's), no position table, the global tokens at position 0 of its rotary module.
ROTARY_BERT_LAYOUT = LSGLayout(
    encoder="",
    position_tables=(),
    token_type_table="embeddings.token_type_embeddings",
    rotary_embeddings=("rotary_emb",),
)


def adopt(module: nn.Module, new_class: type[nn.Module]) -> nn.Module:
    """An instance of `new_class` (a subclass of the module's class) that holds `module`'s state as it is:
    its submodules, parameters, buffers and hooks under their names, so checkpoints load as they are.
    How LSG puts its modules in a model (lsg_attention_layers.adopted, lsg_global_tokens.adopt_step)."""
    adopted = new_class.__new__(new_class)
    adopted.__dict__.update(module.__dict__)
    return adopted
