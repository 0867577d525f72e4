"""LSG-BART: the BART heads of transformers with an LSG encoder.

Each head ``LSGBart<Head>`` is the mixin below plus ``Bart<Head>``, one class per head listed in LSGBartConfig.
The decoder's self- and cross-attention stay dense (transformers' implementation of the model's
``attn_implementation``) with the KV cache; with ``pass_global_tokens_to_decoder`` the encoder output
keeps its global tokens in front and the cross-attention mask is extended over them (see
`GlobalTokens.covered_encoder_mask`). ``LSGBartForCausalLM`` is the
pretrained decoder alone: dense, with a longer position table.
"""

from .configuration_lsg_bart import LSGBartConfig
from .lsg_global_tokens import RecordsTokenStates
from .lsg_layout import ENCODER_DECODER_POSITIONS, LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.bart.modeling_bart import (
        BartDecoder,
        BartEncoder,
        BartEncoderLayer,
        BartForCausalLM,
        BartForConditionalGeneration,
        BartForQuestionAnswering,
        BartForSequenceClassification,
        BartModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class BartEncoderLayerRecordingTokenStates(RecordsTokenStates, BartEncoderLayer):
    """BartEncoderLayer recording the token rows of its states (`RecordsTokenStates`)."""


class BartEncoderDroppingGlobalTokens(CarriesAndDropsGlobalTokens, BartEncoder):
    """BartEncoder, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global tokens
    out (`CarriesAndDropsGlobalTokens`)."""


class BartDecoderSeeingGlobalTokens(SeesGlobalStates, BartDecoder):
    """BartDecoder: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGBartMixin(LSGModelMixin):
    """The global tokens live in the encoder and join after embed_scale * tokens + positions."""

    config_class = LSGBartConfig
    lsg_layout = LSGLayout(
        embeddings="encoder", prepend_before=("encoder.layernorm_embedding",), position_tables=ENCODER_DECODER_POSITIONS
    )


class LSGBartModel(LSGBartMixin, BartModel):
    """BartModel with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGBartForConditionalGeneration(LSGBartMixin, BartForConditionalGeneration):
    """BartForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGBartForCausalLM(LSGBartMixin, BartForCausalLM):
    """BartForCausalLM: the pretrained decoder alone, dense, with a longer position table."""


class LSGBartForSequenceClassification(LSGBartMixin, BartForSequenceClassification):
    """BartForSequenceClassification with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGBartForQuestionAnswering(LSGBartMixin, BartForQuestionAnswering):
    """BartForQuestionAnswering with an LSG encoder (Local + Sparse + Global attention, global tokens)."""
