"""LSG-BERT: the BERT classes of transformers with LSG encoder attention and global tokens.

Only what LSG changes is here; the attention, the masks and the global tokens live in lsg_attention.
"""

from transformers.models.bert.modeling_bert import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from .configuration_lsg_bert import LSGBertConfig
from .lsg_attention import LSGModelMixin, register_for_auto_classes


class LSGBertMixin(LSGModelMixin):
    """BERT keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGBertConfig


class LSGBertModel(LSGBertMixin, BertModel):
    """BertModel with LSG attention."""


class LSGBertForMaskedLM(LSGBertMixin, BertForMaskedLM):
    """BertForMaskedLM with LSG attention."""


class LSGBertForPreTraining(LSGBertMixin, BertForPreTraining):
    """BertForPreTraining with LSG attention."""


class LSGBertForNextSentencePrediction(LSGBertMixin, BertForNextSentencePrediction):
    """BertForNextSentencePrediction with LSG attention."""


class LSGBertForSequenceClassification(LSGBertMixin, BertForSequenceClassification):
    """BertForSequenceClassification with LSG attention."""


class LSGBertForTokenClassification(LSGBertMixin, BertForTokenClassification):
    """BertForTokenClassification with LSG attention."""


class LSGBertForQuestionAnswering(LSGBertMixin, BertForQuestionAnswering):
    """BertForQuestionAnswering with LSG attention."""


class LSGBertForMultipleChoice(LSGBertMixin, BertForMultipleChoice):
    """BertForMultipleChoice with LSG attention."""


register_for_auto_classes(LSGBertConfig, globals())
