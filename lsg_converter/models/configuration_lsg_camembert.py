"""Configuration of LSG-CamemBERT: CamembertConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import CamembertConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGCamembertConfig(LSGConfigMixin, CamembertConfig):
    """CamembertConfig with the LSG keys; loads reference-format configs (model_type "camembert") too."""

    model_type = "lsg-camembert"
    lsg_heads = (*ENCODER_HEADS, "ForCausalLM")
