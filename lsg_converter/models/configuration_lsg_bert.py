"""Configuration of LSG-BERT: BertConfig plus the LSG keys (see lsg_attention.LSGConfigMixin)."""

from transformers import BertConfig

from .lsg_attention import LSGConfigMixin


class LSGBertConfig(LSGConfigMixin, BertConfig):
    """BertConfig with the LSG keys; loads reference-format configs (model_type "bert") too."""

    model_type = "lsg-bert"
    lsg_auto_map = {
        "AutoConfig": "configuration_lsg_bert.LSGBertConfig",
        "AutoModel": "modeling_lsg_bert.LSGBertModel",
        "AutoModelForMaskedLM": "modeling_lsg_bert.LSGBertForMaskedLM",
        "AutoModelForPreTraining": "modeling_lsg_bert.LSGBertForPreTraining",
        "AutoModelForNextSentencePrediction": "modeling_lsg_bert.LSGBertForNextSentencePrediction",
        "AutoModelForSequenceClassification": "modeling_lsg_bert.LSGBertForSequenceClassification",
        "AutoModelForTokenClassification": "modeling_lsg_bert.LSGBertForTokenClassification",
        "AutoModelForQuestionAnswering": "modeling_lsg_bert.LSGBertForQuestionAnswering",
        "AutoModelForMultipleChoice": "modeling_lsg_bert.LSGBertForMultipleChoice",
    }

    def __init__(self, **kwargs):
        # Defined in the class body so that transformers keeps it instead of generating a dataclass __init__.
        super().__init__(**kwargs)
