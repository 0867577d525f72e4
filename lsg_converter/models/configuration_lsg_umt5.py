"""Configuration of LSG-UMT5: UMT5Config plus the LSG keys, as LSG-T5's (configuration_lsg_t5.py)."""

from transformers import UMT5Config

from .configuration_lsg_t5 import T5_DEFAULTS, T5_HEADS
from .lsg_model import LSGConfigMixin


class LSGUMT5Config(LSGConfigMixin, UMT5Config):
    """UMT5Config with the LSG keys."""

    model_type = "lsg-umt5"
    lsg_heads = T5_HEADS
    lsg_defaults = T5_DEFAULTS
    lsg_decoder_runs_flex = False
    lsg_borrowed_files = ("configuration_lsg_t5.py", "lsg_t5_bias.py")
