"""Configuration of LSG-ELECTRA: ElectraConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import ElectraConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGElectraConfig(LSGConfigMixin, ElectraConfig):
    """ElectraConfig with the LSG keys; loads reference-format configs (model_type "electra") too."""

    model_type = "lsg-electra"
    lsg_heads = (*ENCODER_HEADS, "ForPreTraining", "ForCausalLM")
