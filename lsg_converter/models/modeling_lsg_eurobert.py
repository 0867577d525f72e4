"""LSG-EuroBERT: the EuroBERT heads of transformers with LSG attention and global tokens.

EuroBERT is a Llama-shaped encoder: token embeddings without a normalisation, grouped key/value heads
(transformers' attention interface receives them repeated), rotary positions applied to the queries and
keys before that interface, and a final RMSNorm in the bare model. The global tokens live in the bare
model (``global_embeddings``), join before the first layer and sit at position 0 of the rotary module;
the bare model's output (after its RMSNorm) drops them.

Each head ``LSGEuroBert<Head>`` is the mixin below plus ``EuroBert<Head>``, one class per head listed in
LSGEuroBertConfig.
"""

from .configuration_lsg_eurobert import LSGEuroBertConfig
from .lsg_attention_layers import RotaryAttention
from .lsg_global_tokens import GivesGlobalTokensPosition0, PrependsGlobalTokens, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.eurobert.modeling_eurobert import (
        EuroBertDecoderLayer,
        EuroBertForMaskedLM,
        EuroBertForSequenceClassification,
        EuroBertForTokenClassification,
        EuroBertModel,
        EuroBertRotaryEmbedding,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class EuroBertRotaryEmbeddingWithGlobalTokensAtPosition0(GivesGlobalTokensPosition0, EuroBertRotaryEmbedding):
    """EuroBertRotaryEmbedding: the global tokens' position ids, 0, go in front of the tokens'
    (`GivesGlobalTokensPosition0`)."""


class EuroBertDecoderLayerRecordingTokenStates(RecordsTokenStates, EuroBertDecoderLayer):
    """EuroBertDecoderLayer recording the token rows of its states (`RecordsTokenStates`)."""


class GlobalTokensBeforeEuroBertDecoderLayerRecordingTokenStates(PrependsGlobalTokens, EuroBertDecoderLayerRecordingTokenStates):
    """The first EuroBertDecoderLayer: the global tokens join its input (`PrependsGlobalTokens`), whose token rows
    it records."""


class EuroBertModelDroppingGlobalTokens(CarriesAndDropsGlobalTokens, EuroBertModel):
    """EuroBertModel, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global tokens
    out (`CarriesAndDropsGlobalTokens`)."""


class LSGEuroBertMixin(LSGModelMixin):
    """EuroBERT keeps its global tokens in the bare model and prepends them before its first layer."""

    config_class = LSGEuroBertConfig
    lsg_layout = LSGLayout(
        embeddings="", prepend_before=("layers.0",), encoder="", position_tables=(), rotary_embeddings=("rotary_emb",)
    )
    lsg_attention = RotaryAttention()


class LSGEuroBertModel(LSGEuroBertMixin, EuroBertModel):
    """EuroBertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGEuroBertForMaskedLM(LSGEuroBertMixin, EuroBertForMaskedLM):
    """EuroBertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGEuroBertForSequenceClassification(LSGEuroBertMixin, EuroBertForSequenceClassification):
    """EuroBertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGEuroBertForTokenClassification(LSGEuroBertMixin, EuroBertForTokenClassification):
    """EuroBertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""
