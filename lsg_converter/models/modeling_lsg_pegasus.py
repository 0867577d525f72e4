"""LSG-Pegasus: the Pegasus heads of transformers with an LSG encoder.

Each head ``LSGPegasus<Head>`` is the mixin below plus ``Pegasus<Head>``, one class per head listed in
LSGPegasusConfig. The decoder stays dense with the KV cache; ``LSGPegasusForCausalLM`` is the
pretrained decoder alone. Positions are sinusoidal: the converter regenerates them at the new length.
"""

from .configuration_lsg_pegasus import LSGPegasusConfig
from .lsg_global_tokens import PrependsGlobalTokens, RecordsTokenStates
from .lsg_layout import ENCODER_DECODER_POSITIONS, LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.pegasus.modeling_pegasus import (
        PegasusDecoder,
        PegasusEncoder,
        PegasusEncoderLayer,
        PegasusForCausalLM,
        PegasusForConditionalGeneration,
        PegasusModel,
    )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class PegasusEncoderLayerRecordingTokenStates(RecordsTokenStates, PegasusEncoderLayer):
    """PegasusEncoderLayer recording the token rows of its states (`RecordsTokenStates`)."""


class GlobalTokensBeforePegasusEncoderLayerRecordingTokenStates(PrependsGlobalTokens, PegasusEncoderLayerRecordingTokenStates):
    """The first PegasusEncoderLayer: the global tokens join its input (`PrependsGlobalTokens`), whose token rows it
    records."""


class PegasusEncoderDroppingGlobalTokens(CarriesAndDropsGlobalTokens, PegasusEncoder):
    """PegasusEncoder, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global
    tokens out (`CarriesAndDropsGlobalTokens`)."""


class PegasusDecoderSeeingGlobalTokens(SeesGlobalStates, PegasusDecoder):
    """PegasusDecoder: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGPegasusMixin(LSGModelMixin):
    """Pegasus is pre-norm with no norm after its embeddings: the global tokens live in the encoder
    and join before its first layer, after embed_scale * tokens + positions and the embedding dropout.
    """

    config_class = LSGPegasusConfig
    lsg_layout = LSGLayout(
        embeddings="encoder",
        prepend_before=("encoder.layers.0",),
        position_tables=ENCODER_DECODER_POSITIONS,
        sinusoidal_positions="halves",
    )


class LSGPegasusModel(LSGPegasusMixin, PegasusModel):
    """PegasusModel with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGPegasusForConditionalGeneration(LSGPegasusMixin, PegasusForConditionalGeneration):
    """PegasusForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGPegasusForCausalLM(LSGPegasusMixin, PegasusForCausalLM):
    """PegasusForCausalLM: the pretrained decoder alone, dense, with a longer position table."""
