"""LSG-T5: the T5 heads of transformers (T5, T5 v1.1, Flan-T5 checkpoints) with an LSG encoder.

T5 has no absolute positions: its attention adds a bucketed relative bias (bidirectional in the
encoder, 32 buckets, exact below 8, logarithmic up to 128), a table of a score per head and bucket
held by the first layer and shared by the stack, and it does not scale the scores by 1/sqrt(d).
transformers builds the bias as a (1, H, L, L) tensor (12 GiB for a T5-base-sized encoder at 16,384
tokens). Here the first layer of the encoder (`LSGT5Attention`) turns T5's table into a bias per head
and distance, once per forward (`lsg_t5_bias.t5_position_terms`), and hands it to the next layers as
`lsg_pattern.PositionTerms`, which LSG attention looks up for the pairs it computes, block by block;
the global tokens sit at ``config.global_token_position`` (`configuration_lsg_t5.T5_DEFAULTS`).

The global tokens join before the first block (`configuration_lsg_t5.T5_LAYOUT`) and leave at the
encoder output; the decoder's self- and cross-attention stay dense with the KV cache (as in LSG-BART),
and with ``pass_global_tokens_to_decoder`` the cross-attention sees the global states. The fp16 clamp
of the hidden states is transformers' own. mT5 is the same model in classes of its own
(modeling_lsg_mt5.py adopts this file's attention), UMT5 has a table in every layer (modeling_lsg_umt5.py).

Each head ``LSGT5<Head>`` is the mixin below plus ``T5<Head>``, one class per head listed in LSGT5Config.
"""

from __future__ import annotations

from typing import Any

import torch

from .configuration_lsg_t5 import T5_LAYOUT, LSGT5Config
from .lsg_attention_layers import SwappedAttention, adopted, projected_self_attention
from .lsg_global_tokens import PrependsGlobalTokens, RecordsTokenStates
from .lsg_model import LSGModelMixin
from .lsg_pattern import PositionTerms
from .lsg_recorder import CarriesAndDropsGlobalTokens, SeesGlobalStates
from .lsg_t5_bias import t5_position_terms
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.t5.modeling_t5 import (
        T5Attention,
        T5Block,
        T5EncoderModel,
        T5ForConditionalGeneration,
        T5ForQuestionAnswering,
        T5ForSequenceClassification,
        T5ForTokenClassification,
        T5LayerCrossAttention,
        T5Model,
        T5Stack,
    )

class LSGT5Attention(T5Attention):
    """T5Attention of the encoder through LSG attention; the position bias it receives and returns (the
    stack passes the first layer's on) is T5's bias per head and distance (`PositionTerms`)."""

    def forward(
        self, hidden_states: torch.Tensor, mask: Any = None, key_value_states: Any = None, position_bias: Any = None, **kwargs: Any
    ) -> tuple[torch.Tensor, PositionTerms, torch.Tensor | None]:
        if position_bias is None:  # the first layer: the bias of the whole stack, once per forward
            position_bias = t5_position_terms(self, self.config.global_token_position)
        output, weights = projected_self_attention(
            self,
            hidden_states,
            mask,
            self.key_value_proj_dim,
            scaling=1.0,  # T5 does not scale its scores by 1/sqrt(d)
            position_terms=position_bias,
            output_attentions=kwargs.get("output_attentions"),
        )
        return output, position_bias, weights


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class T5BlockRecordingTokenStates(RecordsTokenStates, T5Block):
    """T5Block recording the token rows of its states (`RecordsTokenStates`)."""


class GlobalTokensBeforeT5BlockRecordingTokenStates(PrependsGlobalTokens, T5BlockRecordingTokenStates):
    """The first T5Block: the global tokens join its input (`PrependsGlobalTokens`), whose token rows it records."""


class T5StackDroppingGlobalTokens(CarriesAndDropsGlobalTokens, T5Stack):
    """The encoder's T5Stack, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the
    global tokens out (`CarriesAndDropsGlobalTokens`)."""


class T5StackSeeingGlobalTokens(SeesGlobalStates, T5Stack):
    """The decoder's T5Stack: its encoder mask covers the global states the encoder output keeps in front
    (`SeesGlobalStates`)."""


class LSGT5Mixin(LSGModelMixin):
    """The encoder's T5Attention modules swapped; the global tokens in the encoder stack."""

    config_class = LSGT5Config
    lsg_layout = T5_LAYOUT
    lsg_attention = SwappedAttention((T5Attention, adopted(LSGT5Attention)))
    # transformers before 5.2x builds T5's outputs by hand (no _can_record_outputs): the layers named here
    lsg_recorded_outputs = {"hidden_states": T5Block, "cross_attentions": T5LayerCrossAttention}


class LSGT5Model(LSGT5Mixin, T5Model):
    """T5Model with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGT5ForConditionalGeneration(LSGT5Mixin, T5ForConditionalGeneration):
    """T5ForConditionalGeneration with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGT5EncoderModel(LSGT5Mixin, T5EncoderModel):
    """T5EncoderModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGT5ForSequenceClassification(LSGT5Mixin, T5ForSequenceClassification):
    """T5ForSequenceClassification with an LSG encoder (Local + Sparse + Global attention, global tokens)."""


class LSGT5ForTokenClassification(LSGT5Mixin, T5ForTokenClassification):
    """T5ForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGT5ForQuestionAnswering(LSGT5Mixin, T5ForQuestionAnswering):
    """T5ForQuestionAnswering with an LSG encoder (Local + Sparse + Global attention, global tokens)."""
