"""Configuration of LSG-EuroBERT (EuroBERT checkpoints): EuroBertConfig plus the LSG keys (see
lsg_model.LSGConfigMixin)."""

from transformers import EuroBertConfig

from .lsg_defaults import ROTARY_DEFAULTS
from .lsg_model import ROTARY_ENCODER_HEADS, LSGConfigMixin


class LSGEuroBertConfig(LSGConfigMixin, EuroBertConfig):
    """EuroBertConfig with the LSG keys."""

    model_type = "lsg-eurobert"
    lsg_heads = ROTARY_ENCODER_HEADS
    lsg_defaults = ROTARY_DEFAULTS
