"""LSG-CamemBERT: the CamemBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGCamembert<Head>`` is the mixin below plus ``Camembert<Head>``, one class per head listed in
LSGCamembertConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from .configuration_lsg_camembert import LSGCamembertConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates, ShiftsPastLength
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.camembert.modeling_camembert import (
        CamembertEmbeddings,
        CamembertEncoder,
        CamembertForCausalLM,
        CamembertForMaskedLM,
        CamembertForMultipleChoice,
        CamembertForQuestionAnswering,
        CamembertForSequenceClassification,
        CamembertForTokenClassification,
        CamembertLayer,
        CamembertModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class CamembertEmbeddingsAfterGlobalTokens(ShiftsPastLength, CamembertEmbeddings):
    """CamembertEmbeddings of a causal decoder: a cached step counts its positions from the first real token
    (`ShiftsPastLength`)."""


class CamembertLayerRecordingTokenStates(RecordsTokenStates, CamembertLayer):
    """CamembertLayer recording the token rows of its states (`RecordsTokenStates`)."""


class CamembertEncoderDroppingGlobalTokens(DropsGlobalTokens, CamembertEncoder):
    """CamembertEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class CamembertModelWithGlobalTokens(CarriesGlobalTokens, CamembertModel):
    """CamembertModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGCamembertMixin(LSGModelMixin):
    """Same places as RoBERTa: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGCamembertConfig
    lsg_layout = LSGLayout(positions_after_padding=True)


class LSGCamembertModel(LSGCamembertMixin, CamembertModel):
    """CamembertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForMaskedLM(LSGCamembertMixin, CamembertForMaskedLM):
    """CamembertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForSequenceClassification(LSGCamembertMixin, CamembertForSequenceClassification):
    """CamembertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForTokenClassification(LSGCamembertMixin, CamembertForTokenClassification):
    """CamembertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForQuestionAnswering(LSGCamembertMixin, CamembertForQuestionAnswering):
    """CamembertForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForMultipleChoice(LSGCamembertMixin, CamembertForMultipleChoice):
    """CamembertForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGCamembertForCausalLM(LSGCamembertMixin, CamembertForCausalLM):
    """CamembertForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
