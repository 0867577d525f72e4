"""LSG-ELECTRA: the ELECTRA heads of transformers with LSG attention and global tokens.

Each head ``LSGElectra<Head>`` is the mixin below plus ``Electra<Head>``, one class per head listed in
LSGElectraConfig. The global tokens live in the embedding space (``embedding_size`` wide): they are
prepended before `embeddings.LayerNorm`, then `embeddings_project` (present when ``embedding_size``
differs from ``hidden_size``) maps them to ``hidden_size`` with the other tokens.
"""

from .configuration_lsg_electra import LSGElectraConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates, ShiftsPastLength
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.electra.modeling_electra import (
        ElectraEmbeddings,
        ElectraEncoder,
        ElectraForCausalLM,
        ElectraForMaskedLM,
        ElectraForMultipleChoice,
        ElectraForPreTraining,
        ElectraForQuestionAnswering,
        ElectraForSequenceClassification,
        ElectraForTokenClassification,
        ElectraLayer,
        ElectraModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class ElectraEmbeddingsAfterGlobalTokens(ShiftsPastLength, ElectraEmbeddings):
    """ElectraEmbeddings of a causal decoder: a cached step counts its positions from the first real token
    (`ShiftsPastLength`)."""


class ElectraLayerRecordingTokenStates(RecordsTokenStates, ElectraLayer):
    """ElectraLayer recording the token rows of its states (`RecordsTokenStates`)."""


class ElectraEncoderDroppingGlobalTokens(DropsGlobalTokens, ElectraEncoder):
    """ElectraEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class ElectraModelWithGlobalTokens(CarriesGlobalTokens, ElectraModel):
    """ElectraModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGElectraMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGElectraConfig
    lsg_layout = LSGLayout(token_type_table="embeddings.token_type_embeddings")


class LSGElectraModel(LSGElectraMixin, ElectraModel):
    """ElectraModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForMaskedLM(LSGElectraMixin, ElectraForMaskedLM):
    """ElectraForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForSequenceClassification(LSGElectraMixin, ElectraForSequenceClassification):
    """ElectraForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForTokenClassification(LSGElectraMixin, ElectraForTokenClassification):
    """ElectraForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForQuestionAnswering(LSGElectraMixin, ElectraForQuestionAnswering):
    """ElectraForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForMultipleChoice(LSGElectraMixin, ElectraForMultipleChoice):
    """ElectraForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForPreTraining(LSGElectraMixin, ElectraForPreTraining):
    """ElectraForPreTraining with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGElectraForCausalLM(LSGElectraMixin, ElectraForCausalLM):
    """ElectraForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
