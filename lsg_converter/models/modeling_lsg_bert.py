"""LSG-BERT: the BERT heads of transformers with LSG attention and global tokens.

Each head ``LSGBert<Head>`` is the mixin below plus ``Bert<Head>``, one class per head listed in LSGBertConfig.
"""

from .configuration_lsg_bert import LSGBertConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates, ShiftsPastLength
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.bert.modeling_bert import (
        BertEmbeddings,
        BertEncoder,
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertLMHeadModel,
        BertLayer,
        BertModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class BertEmbeddingsAfterGlobalTokens(ShiftsPastLength, BertEmbeddings):
    """BertEmbeddings of a causal decoder: a cached step counts its positions from the first real token
    (`ShiftsPastLength`)."""


class BertLayerRecordingTokenStates(RecordsTokenStates, BertLayer):
    """BertLayer recording the token rows of its states (`RecordsTokenStates`)."""


class BertEncoderDroppingGlobalTokens(DropsGlobalTokens, BertEncoder):
    """BertEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class BertModelWithGlobalTokens(CarriesGlobalTokens, BertModel):
    """BertModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGBertMixin(LSGModelMixin):
    """BERT keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGBertConfig
    lsg_layout = LSGLayout(token_type_table="embeddings.token_type_embeddings")


class LSGBertModel(LSGBertMixin, BertModel):
    """BertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForMaskedLM(LSGBertMixin, BertForMaskedLM):
    """BertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForSequenceClassification(LSGBertMixin, BertForSequenceClassification):
    """BertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForTokenClassification(LSGBertMixin, BertForTokenClassification):
    """BertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForQuestionAnswering(LSGBertMixin, BertForQuestionAnswering):
    """BertForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForMultipleChoice(LSGBertMixin, BertForMultipleChoice):
    """BertForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForPreTraining(LSGBertMixin, BertForPreTraining):
    """BertForPreTraining with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertForNextSentencePrediction(LSGBertMixin, BertForNextSentencePrediction):
    """BertForNextSentencePrediction with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGBertLMHeadModel(LSGBertMixin, BertLMHeadModel):
    """BertLMHeadModel with LSG attention (Local + Sparse + Global) and global tokens."""
