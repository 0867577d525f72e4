"""LSG-GTE: the GTE heads of transformers (gte-*-en-v1.5, gte-multilingual) with LSG attention and global tokens.

GTE is laid out as NomicBERT (`lsg_layout.ROTARY_BERT_LAYOUT`): rotary positions applied to
the queries and keys before transformers' attention interface, no position table, the global tokens
joining before the embedding LayerNorm at position 0 of the rotary module.

Each head ``LSGGte<Head>`` is the mixin below plus ``Gte<Head>``, one class per head listed in LSGGteConfig.
"""

from .configuration_lsg_gte import LSGGteConfig
from .lsg_attention_layers import RotaryAttention
from .lsg_global_tokens import GivesGlobalTokensPosition0, RecordsTokenStates
from .lsg_layout import ROTARY_BERT_LAYOUT
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.gte.modeling_gte import (
        GteForMaskedLM,
        GteForSequenceClassification,
        GteForTokenClassification,
        GteLayer,
        GteModel,
        GteRotaryEmbedding,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class GteRotaryEmbeddingWithGlobalTokensAtPosition0(GivesGlobalTokensPosition0, GteRotaryEmbedding):
    """GteRotaryEmbedding: the global tokens' position ids, 0, go in front of the tokens'
    (`GivesGlobalTokensPosition0`)."""


class GteLayerRecordingTokenStates(RecordsTokenStates, GteLayer):
    """GteLayer recording the token rows of its states (`RecordsTokenStates`)."""


class GteModelDroppingGlobalTokens(CarriesAndDropsGlobalTokens, GteModel):
    """GteModel, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global tokens out
    (`CarriesAndDropsGlobalTokens`)."""


class LSGGteMixin(LSGModelMixin):
    """GTE keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGGteConfig
    lsg_layout = ROTARY_BERT_LAYOUT
    lsg_attention = RotaryAttention()


class LSGGteModel(LSGGteMixin, GteModel):
    """GteModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGGteForMaskedLM(LSGGteMixin, GteForMaskedLM):
    """GteForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGGteForSequenceClassification(LSGGteMixin, GteForSequenceClassification):
    """GteForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGGteForTokenClassification(LSGGteMixin, GteForTokenClassification):
    """GteForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""
