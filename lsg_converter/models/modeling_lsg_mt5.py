"""LSG-mT5: the mT5 heads of transformers with an LSG encoder, as LSG-T5 (modeling_lsg_t5.py): mT5 is T5
in classes of its own, so its attention module runs LSG-T5's forward.

Each head ``LSGMT5<Head>`` is the mixin below plus ``MT5<Head>``, one class per head listed in LSGMT5Config.
"""

from .configuration_lsg_mt5 import LSGMT5Config
from .configuration_lsg_t5 import T5_LAYOUT
from .lsg_attention_layers import SwappedAttention, adopted
from .lsg_global_tokens import PrependsGlobalTokens, RecordsTokenStates
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_transformers import transformers_names
from .modeling_lsg_t5 import LSGT5Attention

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.mt5.modeling_mt5 import (
        MT5Attention,
        MT5Block,
        MT5EncoderModel,
        MT5ForConditionalGeneration,
        MT5ForQuestionAnswering,
        MT5ForSequenceClassification,
        MT5ForTokenClassification,
        MT5LayerCrossAttention,
        MT5Model,
        MT5Stack,
    )


class LSGMT5Attention(MT5Attention):
    """MT5Attention of the encoder through LSG attention (`LSGT5Attention`'s forward)."""

    forward = LSGT5Attention.forward


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class MT5BlockRecordingTokenStates(RecordsTokenStates, MT5Block):
    """MT5Block recording the token rows of its states (`RecordsTokenStates`)."""


class GlobalTokensBeforeMT5BlockRecordingTokenStates(PrependsGlobalTokens, MT5BlockRecordingTokenStates):
    """The first MT5Block: the global tokens join its input (`PrependsGlobalTokens`), whose token rows it records."""


class MT5StackDroppingGlobalTokens(CarriesAndDropsGlobalTokens, MT5Stack):
    """The encoder's MT5Stack, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the
    global tokens out (`CarriesAndDropsGlobalTokens`)."""


class MT5StackSeeingGlobalTokens(SeesGlobalStates, MT5Stack):
    """The decoder's MT5Stack: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGMT5Mixin(LSGModelMixin):
    """The encoder's MT5Attention modules swapped; the global tokens in the encoder stack."""

    config_class = LSGMT5Config
    lsg_layout = T5_LAYOUT
    lsg_attention = SwappedAttention((MT5Attention, adopted(LSGMT5Attention)))
    # transformers before 5.2x builds T5's outputs by hand (no _can_record_outputs): the layers named here
    lsg_recorded_outputs = {"hidden_states": MT5Block, "cross_attentions": MT5LayerCrossAttention}


class LSGMT5Model(LSGMT5Mixin, MT5Model):
    """MT5Model with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMT5ForConditionalGeneration(LSGMT5Mixin, MT5ForConditionalGeneration):
    """MT5ForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMT5EncoderModel(LSGMT5Mixin, MT5EncoderModel):
    """MT5EncoderModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMT5ForSequenceClassification(LSGMT5Mixin, MT5ForSequenceClassification):
    """MT5ForSequenceClassification with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGMT5ForTokenClassification(LSGMT5Mixin, MT5ForTokenClassification):
    """MT5ForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMT5ForQuestionAnswering(LSGMT5Mixin, MT5ForQuestionAnswering):
    """MT5ForQuestionAnswering with an LSG encoder (Local + Sparse + Global attention, global tokens)."""
