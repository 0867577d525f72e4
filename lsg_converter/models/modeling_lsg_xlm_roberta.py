"""LSG-XLM-RoBERTa: the XLM-RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGXLMRoberta<Head>`` is the mixin below plus ``XLMRoberta<Head>``, one class per head listed in
LSGXLMRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from .configuration_lsg_xlm_roberta import LSGXLMRobertaConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates, ShiftsPastLength
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.xlm_roberta.modeling_xlm_roberta import (
        XLMRobertaEmbeddings,
        XLMRobertaEncoder,
        XLMRobertaForCausalLM,
        XLMRobertaForMaskedLM,
        XLMRobertaForMultipleChoice,
        XLMRobertaForQuestionAnswering,
        XLMRobertaForSequenceClassification,
        XLMRobertaForTokenClassification,
        XLMRobertaLayer,
        XLMRobertaModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class XLMRobertaEmbeddingsAfterGlobalTokens(ShiftsPastLength, XLMRobertaEmbeddings):
    """XLMRobertaEmbeddings of a causal decoder: a cached step counts its positions from the first real token
    (`ShiftsPastLength`)."""


class XLMRobertaLayerRecordingTokenStates(RecordsTokenStates, XLMRobertaLayer):
    """XLMRobertaLayer recording the token rows of its states (`RecordsTokenStates`)."""


class XLMRobertaEncoderDroppingGlobalTokens(DropsGlobalTokens, XLMRobertaEncoder):
    """XLMRobertaEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class XLMRobertaModelWithGlobalTokens(CarriesGlobalTokens, XLMRobertaModel):
    """XLMRobertaModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGXLMRobertaMixin(LSGModelMixin):
    """Same places as RoBERTa: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGXLMRobertaConfig
    lsg_layout = LSGLayout(positions_after_padding=True)


class LSGXLMRobertaModel(LSGXLMRobertaMixin, XLMRobertaModel):
    """XLMRobertaModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForMaskedLM(LSGXLMRobertaMixin, XLMRobertaForMaskedLM):
    """XLMRobertaForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForSequenceClassification(LSGXLMRobertaMixin, XLMRobertaForSequenceClassification):
    """XLMRobertaForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForTokenClassification(LSGXLMRobertaMixin, XLMRobertaForTokenClassification):
    """XLMRobertaForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForQuestionAnswering(LSGXLMRobertaMixin, XLMRobertaForQuestionAnswering):
    """XLMRobertaForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForMultipleChoice(LSGXLMRobertaMixin, XLMRobertaForMultipleChoice):
    """XLMRobertaForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForCausalLM(LSGXLMRobertaMixin, XLMRobertaForCausalLM):
    """XLMRobertaForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
