"""LSG-mBART (and BARThez): the mBART heads of transformers with an LSG encoder.

Each head ``LSGMBart<Head>`` is the mixin below plus ``MBart<Head>``, one class per head listed in
LSGMBartConfig. As in BART, the decoder's self- and cross-attention stay dense with the KV
cache, and ``LSGMBartForCausalLM`` is the pretrained decoder alone, dense, with a longer position table.
"""

from .configuration_lsg_mbart import LSGMBartConfig
from .lsg_global_tokens import RecordsTokenStates
from .lsg_layout import ENCODER_DECODER_POSITIONS, LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.mbart.modeling_mbart import (
        MBartDecoder,
        MBartEncoder,
        MBartEncoderLayer,
        MBartForCausalLM,
        MBartForConditionalGeneration,
        MBartForQuestionAnswering,
        MBartForSequenceClassification,
        MBartModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class MBartEncoderLayerRecordingTokenStates(RecordsTokenStates, MBartEncoderLayer):
    """MBartEncoderLayer recording the token rows of its states (`RecordsTokenStates`)."""


class MBartEncoderDroppingGlobalTokens(CarriesAndDropsGlobalTokens, MBartEncoder):
    """MBartEncoder, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global tokens
    out (`CarriesAndDropsGlobalTokens`)."""


class MBartDecoderSeeingGlobalTokens(SeesGlobalStates, MBartDecoder):
    """MBartDecoder: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGMBartMixin(LSGModelMixin):
    """The global tokens live in the encoder and join after embed_scale * tokens + positions."""

    config_class = LSGMBartConfig
    lsg_layout = LSGLayout(
        embeddings="encoder", prepend_before=("encoder.layernorm_embedding",), position_tables=ENCODER_DECODER_POSITIONS
    )


class LSGMBartModel(LSGMBartMixin, MBartModel):
    """MBartModel with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMBartForConditionalGeneration(LSGMBartMixin, MBartForConditionalGeneration):
    """MBartForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMBartForCausalLM(LSGMBartMixin, MBartForCausalLM):
    """MBartForCausalLM: the pretrained decoder alone, dense, with a longer position table."""


class LSGMBartForSequenceClassification(LSGMBartMixin, MBartForSequenceClassification):
    """MBartForSequenceClassification with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMBartForQuestionAnswering(LSGMBartMixin, MBartForQuestionAnswering):
    """MBartForQuestionAnswering with an LSG encoder (Local + Sparse + Global attention, global tokens)."""
