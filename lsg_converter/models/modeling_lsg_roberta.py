"""LSG-RoBERTa: the RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGRoberta<Head>`` is the mixin below plus ``Roberta<Head>``, one class per head listed in
LSGRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from .configuration_lsg_roberta import LSGRobertaConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates, ShiftsPastLength
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.roberta.modeling_roberta import (
        RobertaEmbeddings,
        RobertaEncoder,
        RobertaForCausalLM,
        RobertaForMaskedLM,
        RobertaForMultipleChoice,
        RobertaForQuestionAnswering,
        RobertaForSequenceClassification,
        RobertaForTokenClassification,
        RobertaLayer,
        RobertaModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class RobertaEmbeddingsAfterGlobalTokens(ShiftsPastLength, RobertaEmbeddings):
    """RobertaEmbeddings of a causal decoder: a cached step counts its positions from the first real token
    (`ShiftsPastLength`)."""


class RobertaLayerRecordingTokenStates(RecordsTokenStates, RobertaLayer):
    """RobertaLayer recording the token rows of its states (`RecordsTokenStates`)."""


class RobertaEncoderDroppingGlobalTokens(DropsGlobalTokens, RobertaEncoder):
    """RobertaEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class RobertaModelWithGlobalTokens(CarriesGlobalTokens, RobertaModel):
    """RobertaModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGRobertaMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGRobertaConfig
    lsg_layout = LSGLayout(positions_after_padding=True)


class LSGRobertaModel(LSGRobertaMixin, RobertaModel):
    """RobertaModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForMaskedLM(LSGRobertaMixin, RobertaForMaskedLM):
    """RobertaForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForSequenceClassification(LSGRobertaMixin, RobertaForSequenceClassification):
    """RobertaForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForTokenClassification(LSGRobertaMixin, RobertaForTokenClassification):
    """RobertaForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForQuestionAnswering(LSGRobertaMixin, RobertaForQuestionAnswering):
    """RobertaForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForMultipleChoice(LSGRobertaMixin, RobertaForMultipleChoice):
    """RobertaForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForCausalLM(LSGRobertaMixin, RobertaForCausalLM):
    """RobertaForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
