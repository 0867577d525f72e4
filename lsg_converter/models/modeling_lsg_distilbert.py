"""LSG-DistilBERT: the DistilBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGDistilBert<Head>`` is the mixin below plus ``DistilBert<Head>``, one class per head listed in
LSGDistilBertConfig. ``inputs_embeds`` works like ``input_ids``: the global tokens join at the norm.
"""

from .configuration_lsg_distilbert import LSGDistilBertConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.distilbert.modeling_distilbert import (
        DistilBertForMaskedLM,
        DistilBertForMultipleChoice,
        DistilBertForQuestionAnswering,
        DistilBertForSequenceClassification,
        DistilBertForTokenClassification,
        DistilBertModel,
        Transformer,
        TransformerBlock,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class TransformerBlockRecordingTokenStates(RecordsTokenStates, TransformerBlock):
    """TransformerBlock recording the token rows of its states (`RecordsTokenStates`)."""


class TransformerDroppingGlobalTokens(DropsGlobalTokens, Transformer):
    """Transformer: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class DistilBertModelWithGlobalTokens(CarriesGlobalTokens, DistilBertModel):
    """DistilBertModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGDistilBertMixin(LSGModelMixin):
    """DistilBERT's encoder is called `transformer`."""

    config_class = LSGDistilBertConfig
    lsg_layout = LSGLayout(encoder="transformer", sinusoidal_positions="interleaved", sinusoidal_switch="sinusoidal_pos_embds")


class LSGDistilBertModel(LSGDistilBertMixin, DistilBertModel):
    """DistilBertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDistilBertForMaskedLM(LSGDistilBertMixin, DistilBertForMaskedLM):
    """DistilBertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDistilBertForSequenceClassification(LSGDistilBertMixin, DistilBertForSequenceClassification):
    """DistilBertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDistilBertForTokenClassification(LSGDistilBertMixin, DistilBertForTokenClassification):
    """DistilBertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDistilBertForQuestionAnswering(LSGDistilBertMixin, DistilBertForQuestionAnswering):
    """DistilBertForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDistilBertForMultipleChoice(LSGDistilBertMixin, DistilBertForMultipleChoice):
    """DistilBertForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""
