"""Configuration of LSG-NomicBERT (nomic-embed-text checkpoints): NomicBertConfig plus the LSG keys (see
lsg_model.LSGConfigMixin)."""

from transformers import NomicBertConfig

from .lsg_defaults import ROTARY_DEFAULTS
from .lsg_model import ROTARY_ENCODER_HEADS, LSGConfigMixin
from .lsg_transformers import convert_weights_as


class LSGNomicBertConfig(LSGConfigMixin, NomicBertConfig):
    """NomicBertConfig with the LSG keys."""

    model_type = "lsg-nomic_bert"
    lsg_heads = ROTARY_ENCODER_HEADS
    lsg_defaults = ROTARY_DEFAULTS


convert_weights_as(LSGNomicBertConfig.model_type, "nomic_bert")  # nomic-embed-text's own weight names
