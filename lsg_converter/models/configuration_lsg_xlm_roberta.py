"""Configuration of LSG-XLM-RoBERTa: XLMRobertaConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import XLMRobertaConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGXLMRobertaConfig(LSGConfigMixin, XLMRobertaConfig):
    """XLMRobertaConfig with the LSG keys; loads reference-format configs (model_type "xlm-roberta") too."""

    model_type = "lsg-xlm-roberta"
    lsg_heads = (*ENCODER_HEADS, "ForCausalLM")
