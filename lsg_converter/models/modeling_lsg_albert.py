"""LSG-ALBERT: the ALBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGAlbert<Head>`` is the mixin below plus ``Albert<Head>``, one class per head listed in
LSGAlbertConfig. The global tokens live in the factorised embedding space (``embedding_size`` wide):
they are prepended before `embeddings.LayerNorm` and mapped to ``hidden_size`` by the encoder's
`embedding_hidden_mapping_in` with the other tokens. The shared layers all run the one LSG attention.
"""

from .configuration_lsg_albert import LSGAlbertConfig
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.albert.modeling_albert import (
        AlbertForMaskedLM,
        AlbertForMultipleChoice,
        AlbertForPreTraining,
        AlbertForQuestionAnswering,
        AlbertForSequenceClassification,
        AlbertForTokenClassification,
        AlbertLayer,
        AlbertModel,
        AlbertTransformer,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class AlbertLayerRecordingTokenStates(RecordsTokenStates, AlbertLayer):
    """AlbertLayer recording the token rows of its states (`RecordsTokenStates`)."""


class AlbertTransformerDroppingGlobalTokens(DropsGlobalTokens, AlbertTransformer):
    """AlbertTransformer: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class AlbertModelWithGlobalTokens(CarriesGlobalTokens, AlbertModel):
    """AlbertModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGAlbertMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGAlbertConfig
    lsg_layout = LSGLayout(token_type_table="embeddings.token_type_embeddings")


class LSGAlbertModel(LSGAlbertMixin, AlbertModel):
    """AlbertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForMaskedLM(LSGAlbertMixin, AlbertForMaskedLM):
    """AlbertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForSequenceClassification(LSGAlbertMixin, AlbertForSequenceClassification):
    """AlbertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForTokenClassification(LSGAlbertMixin, AlbertForTokenClassification):
    """AlbertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForQuestionAnswering(LSGAlbertMixin, AlbertForQuestionAnswering):
    """AlbertForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForMultipleChoice(LSGAlbertMixin, AlbertForMultipleChoice):
    """AlbertForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGAlbertForPreTraining(LSGAlbertMixin, AlbertForPreTraining):
    """AlbertForPreTraining with LSG attention (Local + Sparse + Global) and global tokens."""
