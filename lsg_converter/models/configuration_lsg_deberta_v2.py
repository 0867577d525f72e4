"""Configuration of LSG-DeBERTa-v2 (DeBERTa-v2 and v3 checkpoints): DebertaV2Config plus the LSG keys
(see lsg_model.LSGConfigMixin) and ``global_token_position``, the position of the global tokens in
DeBERTa's relative positions."""

from typing import Any

from transformers import DebertaV2Config

from .lsg_defaults import RELATIVE_POSITION_DEFAULTS
from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGDebertaV2Config(LSGConfigMixin, DebertaV2Config):
    """DebertaV2Config with the LSG keys.

    DeBERTa reads ``max_relative_positions < 1`` as "max_position_embeddings", which LSG raises to the
    new length: the relative reach (and, with ``position_buckets``, the log buckets) would change with
    it. This config pins it at the source's max_position_embeddings instead.
    """

    model_type = "lsg-deberta-v2"
    lsg_heads = ENCODER_HEADS
    lsg_defaults = RELATIVE_POSITION_DEFAULTS

    def __init__(self, **kwargs: Any) -> None:
        LSGConfigMixin.__init__(self, **kwargs)
        if self.relative_attention and self.max_relative_positions < 1:
            self.max_relative_positions = self.max_position_embeddings
