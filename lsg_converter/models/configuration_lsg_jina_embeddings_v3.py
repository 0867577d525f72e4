"""Configuration of LSG-Jina-v3 (jina-embeddings-v3 checkpoints): JinaEmbeddingsV3Config plus the LSG keys (see
lsg_model.LSGConfigMixin)."""

from transformers import JinaEmbeddingsV3Config

from .lsg_defaults import ROTARY_DEFAULTS
from .lsg_model import LSGConfigMixin
from .lsg_transformers import convert_weights_as


class LSGJinaEmbeddingsV3Config(LSGConfigMixin, JinaEmbeddingsV3Config):
    """JinaEmbeddingsV3Config with the LSG keys."""

    model_type = "lsg-jina_embeddings_v3"
    lsg_heads = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
    lsg_defaults = ROTARY_DEFAULTS


convert_weights_as(LSGJinaEmbeddingsV3Config.model_type, "jina_embeddings_v3")  # the hub checkpoints' own weight names
