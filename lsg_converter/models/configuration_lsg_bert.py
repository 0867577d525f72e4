"""Configuration of LSG-BERT: BertConfig plus the LSG keys (see lsg_model.LSGConfigMixin)."""

from transformers import BertConfig

from .lsg_model import ENCODER_HEADS, LSGConfigMixin


class LSGBertConfig(LSGConfigMixin, BertConfig):
    """BertConfig with the LSG keys; loads reference-format configs (model_type "bert") too."""

    model_type = "lsg-bert"
    lsg_heads = (*ENCODER_HEADS, "ForPreTraining", "ForNextSentencePrediction", "LMHeadModel")
