"""LSG-NomicBERT: the NomicBERT heads of transformers (nomic-embed-text) with LSG attention and global tokens.

NomicBERT has no position table: its attention rotates the queries and keys by their positions (RoPE)
before transformers' attention interface, which LSG attention then receives rotated, so the local keys
see their true distances. The global tokens join before the embedding LayerNorm and sit at position 0 of
the rotary module (`LSGLayout.rotary_embeddings`), where the first token is.

Each head ``LSGNomicBert<Head>`` is the mixin below plus ``NomicBert<Head>``, one class per head listed in
LSGNomicBertConfig.
"""

from .configuration_lsg_nomic_bert import LSGNomicBertConfig
from .lsg_attention_layers import RotaryAttention
from .lsg_global_tokens import GivesGlobalTokensPosition0, RecordsTokenStates
from .lsg_layout import ROTARY_BERT_LAYOUT
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.nomic_bert.modeling_nomic_bert import (
        NomicBertForMaskedLM,
        NomicBertForSequenceClassification,
        NomicBertForTokenClassification,
        NomicBertLayer,
        NomicBertModel,
        NomicBertRotaryEmbedding,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class NomicBertRotaryEmbeddingWithGlobalTokensAtPosition0(GivesGlobalTokensPosition0, NomicBertRotaryEmbedding):
    """NomicBertRotaryEmbedding: the global tokens' position ids, 0, go in front of the tokens'
    (`GivesGlobalTokensPosition0`)."""


class NomicBertLayerRecordingTokenStates(RecordsTokenStates, NomicBertLayer):
    """NomicBertLayer recording the token rows of its states (`RecordsTokenStates`)."""


class NomicBertModelDroppingGlobalTokens(CarriesAndDropsGlobalTokens, NomicBertModel):
    """NomicBertModel, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global
    tokens out (`CarriesAndDropsGlobalTokens`)."""


class LSGNomicBertMixin(LSGModelMixin):
    """NomicBERT keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGNomicBertConfig
    lsg_layout = ROTARY_BERT_LAYOUT
    lsg_attention = RotaryAttention()


class LSGNomicBertModel(LSGNomicBertMixin, NomicBertModel):
    """NomicBertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGNomicBertForMaskedLM(LSGNomicBertMixin, NomicBertForMaskedLM):
    """NomicBertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGNomicBertForSequenceClassification(LSGNomicBertMixin, NomicBertForSequenceClassification):
    """NomicBertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGNomicBertForTokenClassification(LSGNomicBertMixin, NomicBertForTokenClassification):
    """NomicBertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""
