"""Configuration of LSG-ALBERT: AlbertConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import AlbertConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGAlbertConfig(LSGConfigMixin, AlbertConfig):
    """AlbertConfig with the LSG keys; loads reference-format configs (model_type "albert") too."""

    model_type = "lsg-albert"
    lsg_heads = (*ENCODER_HEADS, "ForPreTraining")
