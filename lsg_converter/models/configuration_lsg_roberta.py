"""Configuration of LSG-RoBERTa: RobertaConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import RobertaConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGRobertaConfig(LSGConfigMixin, RobertaConfig):
    """RobertaConfig with the LSG keys; loads reference-format configs (model_type "roberta") too."""

    model_type = "lsg-roberta"
    lsg_heads = (*ENCODER_HEADS, "ForCausalLM")
