"""Configuration of LSG-T5 (T5, T5 v1.1, Flan-T5 checkpoints): T5Config plus the LSG keys (see
lsg_model.LSGConfigMixin), ``global_token_position`` (where the global tokens sit in T5's relative
position bias) and ``max_position_embeddings``, the tokens the model reads (T5 has no position table:
a source config names no length, the converted one does)."""

from transformers import T5Config

from .lsg_model import T5_DEFAULTS, T5_HEADS, LSGConfigMixin


class LSGT5Config(LSGConfigMixin, T5Config):
    """T5Config with the LSG keys."""

    model_type = "lsg-t5"
    lsg_heads = T5_HEADS
    lsg_defaults = T5_DEFAULTS
    lsg_decoder_runs_flex = False
    lsg_borrowed_files = ("lsg_t5_bias.py",)
