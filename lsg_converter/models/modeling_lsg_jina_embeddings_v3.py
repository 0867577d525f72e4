"""LSG-Jina-v3: the jina-embeddings-v3 heads of transformers with LSG attention and global tokens.

jina-embeddings-v3 is laid out as NomicBERT (`lsg_layout.ROTARY_BERT_LAYOUT`): an XLM-RoBERTa body with
rotary positions applied to the queries and keys before transformers' attention interface, no position
table, the global tokens joining before the embedding LayerNorm at position 0 of the rotary module. Its
task-specific LoRA adapters are not part of transformers' model (PEFT loads them); the converted model keeps
the module names they target.

Each head ``LSGJinaEmbeddingsV3<Head>`` is the mixin below plus ``JinaEmbeddingsV3<Head>``, one class per head
listed in LSGJinaEmbeddingsV3Config.
"""

from .configuration_lsg_jina_embeddings_v3 import LSGJinaEmbeddingsV3Config
from .lsg_attention_layers import RotaryAttention
from .lsg_global_tokens import GivesGlobalTokensPosition0, RecordsTokenStates
from .lsg_layout import ROTARY_BERT_LAYOUT
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.jina_embeddings_v3.modeling_jina_embeddings_v3 import (
        JinaEmbeddingsV3ForMaskedLM,
        JinaEmbeddingsV3ForQuestionAnswering,
        JinaEmbeddingsV3ForSequenceClassification,
        JinaEmbeddingsV3ForTokenClassification,
        JinaEmbeddingsV3Layer,
        JinaEmbeddingsV3Model,
        JinaEmbeddingsV3RotaryEmbedding,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class JinaEmbeddingsV3RotaryEmbeddingWithGlobalTokensAtPosition0(GivesGlobalTokensPosition0, JinaEmbeddingsV3RotaryEmbedding):
    """JinaEmbeddingsV3RotaryEmbedding: the global tokens' position ids, 0, go in front of the tokens'
    (`GivesGlobalTokensPosition0`)."""


class JinaEmbeddingsV3LayerRecordingTokenStates(RecordsTokenStates, JinaEmbeddingsV3Layer):
    """JinaEmbeddingsV3Layer recording the token rows of its states (`RecordsTokenStates`)."""


class JinaEmbeddingsV3ModelDroppingGlobalTokens(CarriesAndDropsGlobalTokens, JinaEmbeddingsV3Model):
    """JinaEmbeddingsV3Model, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the
    global tokens out (`CarriesAndDropsGlobalTokens`)."""


class LSGJinaEmbeddingsV3Mixin(LSGModelMixin):
    """Jina v3 keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGJinaEmbeddingsV3Config
    lsg_layout = ROTARY_BERT_LAYOUT
    lsg_attention = RotaryAttention()


class LSGJinaEmbeddingsV3Model(LSGJinaEmbeddingsV3Mixin, JinaEmbeddingsV3Model):
    """JinaEmbeddingsV3Model with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGJinaEmbeddingsV3ForMaskedLM(LSGJinaEmbeddingsV3Mixin, JinaEmbeddingsV3ForMaskedLM):
    """JinaEmbeddingsV3ForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGJinaEmbeddingsV3ForSequenceClassification(LSGJinaEmbeddingsV3Mixin, JinaEmbeddingsV3ForSequenceClassification):
    """JinaEmbeddingsV3ForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGJinaEmbeddingsV3ForTokenClassification(LSGJinaEmbeddingsV3Mixin, JinaEmbeddingsV3ForTokenClassification):
    """JinaEmbeddingsV3ForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGJinaEmbeddingsV3ForQuestionAnswering(LSGJinaEmbeddingsV3Mixin, JinaEmbeddingsV3ForQuestionAnswering):
    """JinaEmbeddingsV3ForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""
