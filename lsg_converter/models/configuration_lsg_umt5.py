"""Configuration of LSG-UMT5: UMT5Config plus the LSG keys, as LSG-T5's (configuration_lsg_t5.py)."""

from transformers import UMT5Config

from .configuration_lsg_t5 import T5_DEFAULTS, T5_HEADS, t5_dense_implementations
from .lsg_model import LSGConfigMixin
from .lsg_transformers import transformers_names

with transformers_names():
    from transformers.models.umt5.modeling_umt5 import UMT5PreTrainedModel


class LSGUMT5Config(LSGConfigMixin, UMT5Config):
    """UMT5Config with the LSG keys."""

    model_type = "lsg-umt5"
    lsg_heads = T5_HEADS
    lsg_defaults = T5_DEFAULTS
    lsg_dense_implementations = t5_dense_implementations(UMT5PreTrainedModel)
