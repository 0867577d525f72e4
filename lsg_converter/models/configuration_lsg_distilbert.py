"""Configuration of LSG-DistilBERT: DistilBertConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import DistilBertConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGDistilBertConfig(LSGConfigMixin, DistilBertConfig):
    """DistilBertConfig with the LSG keys; loads reference-format configs (model_type "distilbert") too."""

    model_type = "lsg-distilbert"
    lsg_heads = ENCODER_HEADS
