"""Configuration of LSG-MPNet: MPNetConfig plus the LSG keys (see lsg_model.LSGConfigMixin) and
``global_token_position``, the position of the global tokens in MPNet's relative position bias."""

from transformers import MPNetConfig

from .lsg_defaults import RELATIVE_POSITION_DEFAULTS
from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGMPNetConfig(LSGConfigMixin, MPNetConfig):
    """MPNetConfig with the LSG keys."""

    model_type = "lsg-mpnet"
    lsg_heads = ENCODER_HEADS
    lsg_defaults = RELATIVE_POSITION_DEFAULTS
