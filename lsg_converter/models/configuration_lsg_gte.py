"""Configuration of LSG-GTE (gte-*-en-v1.5, gte-multilingual checkpoints): GteConfig plus the LSG keys (see
lsg_model.LSGConfigMixin). transformers has GTE from 5.18."""

from transformers import GteConfig

from .lsg_defaults import ROTARY_DEFAULTS
from .lsg_model import ROTARY_ENCODER_HEADS, LSGConfigMixin
from .lsg_transformers import convert_weights_as


class LSGGteConfig(LSGConfigMixin, GteConfig):
    """GteConfig with the LSG keys."""

    model_type = "lsg-gte"
    lsg_heads = ROTARY_ENCODER_HEADS
    lsg_defaults = ROTARY_DEFAULTS


convert_weights_as(LSGGteConfig.model_type, "gte")  # the hub checkpoints' own weight names
