"""LSG-UMT5: the UMT5 heads of transformers with an LSG encoder, as LSG-T5 (modeling_lsg_t5.py), except
that every UMT5 layer holds its own relative bias table: each swapped attention module hands LSG
attention its own bias per head and distance (`lsg_t5_bias.t5_position_terms`); nothing is passed
between layers.

Each head ``LSGUMT5<Head>`` is the mixin below plus ``UMT5<Head>``, one class per head listed in LSGUMT5Config.
"""

from __future__ import annotations

from typing import Any

import torch

from .configuration_lsg_t5 import T5_LAYOUT
from .configuration_lsg_umt5 import LSGUMT5Config
from .lsg_attention_layers import SwappedAttention, adopted, projected_self_attention
from .lsg_global_tokens import PrependsGlobalTokens, RecordsTokenStates
from .lsg_model import LSGModelMixin
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_t5_bias import t5_position_terms
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.umt5.modeling_umt5 import (
        UMT5Attention,
        UMT5Block,
        UMT5EncoderModel,
        UMT5ForConditionalGeneration,
        UMT5ForQuestionAnswering,
        UMT5ForSequenceClassification,
        UMT5ForTokenClassification,
        UMT5LayerCrossAttention,
        UMT5Model,
        UMT5Stack,
    )


class LSGUMT5Attention(UMT5Attention):
    """UMT5Attention of the encoder through LSG attention, with the layer's own relative bias as `PositionTerms`.

    It hands LSG attention the bool padding mask: UMT5's stack before transformers 5.2x turns the
    (B, 1, 1, g + t) bool view it receives into an additive one, (1 - mask) * min, with two more unit dimensions.
    """

    def forward(
        self, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, cache: Any = None, attention_mask: Any = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if attention_mask is not None and attention_mask.is_floating_point():  # additive: 0 (or -0.0) where seen
            attention_mask = attention_mask == 0
        return projected_self_attention(
            self,
            hidden_states,
            attention_mask,
            self.key_value_proj_dim,
            scaling=1.0,  # T5 does not scale its scores by 1/sqrt(d)
            position_terms=t5_position_terms(self, self.config.global_token_position),
            output_attentions=kwargs.get("output_attentions"),
        )


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class UMT5BlockRecordingTokenStates(RecordsTokenStates, UMT5Block):
    """UMT5Block recording the token rows of its states (`RecordsTokenStates`)."""


class GlobalTokensBeforeUMT5BlockRecordingTokenStates(PrependsGlobalTokens, UMT5BlockRecordingTokenStates):
    """The first UMT5Block: the global tokens join its input (`PrependsGlobalTokens`), whose token rows it records."""


class UMT5StackDroppingGlobalTokens(CarriesAndDropsGlobalTokens, UMT5Stack):
    """The encoder's UMT5Stack, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the
    global tokens out (`CarriesAndDropsGlobalTokens`)."""


class UMT5StackSeeingGlobalTokens(SeesGlobalStates, UMT5Stack):
    """The decoder's UMT5Stack: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGUMT5Mixin(LSGModelMixin):
    """The encoder's UMT5Attention modules swapped; the global tokens in the encoder stack."""

    config_class = LSGUMT5Config
    lsg_layout = T5_LAYOUT
    lsg_attention = SwappedAttention((UMT5Attention, adopted(LSGUMT5Attention)))
    # transformers before 5.2x builds T5's outputs by hand (no _can_record_outputs): the layers named here
    lsg_recorded_outputs = {"hidden_states": UMT5Block, "cross_attentions": UMT5LayerCrossAttention}


class LSGUMT5Model(LSGUMT5Mixin, UMT5Model):
    """UMT5Model with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGUMT5ForConditionalGeneration(LSGUMT5Mixin, UMT5ForConditionalGeneration):
    """UMT5ForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGUMT5EncoderModel(LSGUMT5Mixin, UMT5EncoderModel):
    """UMT5EncoderModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGUMT5ForSequenceClassification(LSGUMT5Mixin, UMT5ForSequenceClassification):
    """UMT5ForSequenceClassification with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGUMT5ForTokenClassification(LSGUMT5Mixin, UMT5ForTokenClassification):
    """UMT5ForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGUMT5ForQuestionAnswering(LSGUMT5Mixin, UMT5ForQuestionAnswering):
    """UMT5ForQuestionAnswering with an LSG encoder (Local + Sparse + Global attention, global tokens)."""
