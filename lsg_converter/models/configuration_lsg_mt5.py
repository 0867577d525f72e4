"""Configuration of LSG-mT5: MT5Config plus the LSG keys, as LSG-T5's (configuration_lsg_t5.py)."""

from transformers import MT5Config

from .configuration_lsg_t5 import T5_DEFAULTS, T5_HEADS, t5_dense_implementations
from .lsg_model import LSGConfigMixin
from .lsg_transformers import transformers_names

with transformers_names():
    from transformers.models.mt5.modeling_mt5 import MT5PreTrainedModel


class LSGMT5Config(LSGConfigMixin, MT5Config):
    """MT5Config with the LSG keys."""

    model_type = "lsg-mt5"
    lsg_heads = T5_HEADS
    lsg_defaults = T5_DEFAULTS
    lsg_dense_implementations = t5_dense_implementations(MT5PreTrainedModel)
