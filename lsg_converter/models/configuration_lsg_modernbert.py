"""Configuration of LSG-ModernBERT (ModernBERT, gte-modernbert, modernbert-embed checkpoints): ModernBertConfig
plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import ModernBertConfig

from .lsg_defaults import ROTARY_DEFAULTS
from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGModernBertConfig(LSGConfigMixin, ModernBertConfig):
    """ModernBertConfig with the LSG keys: they shape the full-attention layers; the sliding-window layers
    keep the source's window (``local_attention``), see modeling_lsg_modernbert."""

    model_type = "lsg-modernbert"
    lsg_heads = ENCODER_HEADS
    lsg_defaults = ROTARY_DEFAULTS
