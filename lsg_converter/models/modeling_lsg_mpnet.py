"""LSG-MPNet: the MPNet heads of transformers with LSG attention and global tokens.

MPNet adds a relative position bias to its attention scores: a T5-style bucket of the distance
key - query (32 buckets, exact below 8, logarithmic up to 128), one table of a score per head and
bucket shared by all layers. transformers builds it once per forward as a (B, H, L, L) tensor
(12 GiB at 16,384 tokens) and adds it in a hand-written attention. Here the encoder hands its layers
the table and the bucket function instead (`LSGMPNetEncoder`), as `lsg_pattern.PositionTerms`, and
the attention (`LSGMPNetSelfAttention`) runs LSG attention with them: every (query, key) pair LSG
evaluates gets MPNet's term, block by block; a sparse key at the position of what it compresses, the
global tokens at ``config.global_token_position`` (0, the <s> position). Absolute positions follow
RoBERTa's convention (positions from padding_idx + 1 = 2), tiled like RoBERTa's.

Each head ``LSGMPNet<Head>`` is the mixin below plus ``MPNet<Head>``, one class per head listed in
LSGMPNetConfig.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .configuration_lsg_mpnet import LSGMPNetConfig
from .lsg_attention_layers import SwappedAttention, adopted, projected_self_attention
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_pattern import PositionTerms
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.mpnet.modeling_mpnet import (
        MPNetEncoder,
        MPNetForMaskedLM,
        MPNetForMultipleChoice,
        MPNetForQuestionAnswering,
        MPNetForSequenceClassification,
        MPNetForTokenClassification,
        MPNetLayer,
        MPNetModel,
        MPNetSelfAttention,
    )


class LSGMPNetEncoder(MPNetEncoder):
    """MPNetEncoder whose position bias is MPNet's table and bucket function (`PositionTerms`), evaluated
    by LSG attention for the pairs it computes, instead of a (B, H, L, L) tensor."""

    def compute_position_bias(self, x: torch.Tensor, position_ids=None, num_buckets: int = 32) -> PositionTerms:
        return PositionTerms(
            bucket=functools.partial(self.relative_position_bucket, num_buckets=num_buckets),
            table=self.relative_attention_bias.weight.T,  # (H, buckets)
            global_position=self.config.global_token_position,
        )


class LSGMPNetSelfAttention(MPNetSelfAttention):
    """MPNetSelfAttention through LSG attention, with the encoder's position terms (`LSGMPNetEncoder`)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_bias: PositionTerms | None = None,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ...]:
        output, weights = projected_self_attention(
            self,
            hidden_states,
            attention_mask,
            self.attention_head_size,
            scaling=self.attention_head_size**-0.5,
            position_terms=position_bias,
            output_attentions=output_attentions,
        )
        return (output, weights) if output_attentions else (output,)


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class MPNetLayerRecordingTokenStates(RecordsTokenStates, MPNetLayer):
    """MPNetLayer recording the token rows of its states (`RecordsTokenStates`)."""


class LSGMPNetEncoderDroppingGlobalTokens(DropsGlobalTokens, LSGMPNetEncoder):
    """LSGMPNetEncoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class MPNetModelWithGlobalTokens(CarriesGlobalTokens, MPNetModel):
    """MPNetModel inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGMPNetMixin(LSGModelMixin):
    """RoBERTa's places (`embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`); the
    encoder and its self-attention swapped; outputs built by hand, so their layers are named here."""

    config_class = LSGMPNetConfig
    lsg_layout = LSGLayout(positions_after_padding=True)
    lsg_attention = SwappedAttention(
        (MPNetEncoder, adopted(LSGMPNetEncoder)),
        (MPNetSelfAttention, adopted(LSGMPNetSelfAttention)),
    )
    lsg_recorded_outputs = {"hidden_states": MPNetLayer, "attentions": LSGMPNetSelfAttention}

    @staticmethod
    def lsg_output_tuple(output) -> tuple:
        """MPNetModel's own tuple: the pooler output kept in its place, None included (its heads read
        the hidden states and attentions from index 2 on)."""
        extras = (output.hidden_states, output.attentions)
        return (output.last_hidden_state, output.pooler_output, *(extra for extra in extras if extra is not None))


class LSGMPNetModel(LSGMPNetMixin, MPNetModel):
    """MPNetModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMPNetForMaskedLM(LSGMPNetMixin, MPNetForMaskedLM):
    """MPNetForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMPNetForSequenceClassification(LSGMPNetMixin, MPNetForSequenceClassification):
    """MPNetForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMPNetForTokenClassification(LSGMPNetMixin, MPNetForTokenClassification):
    """MPNetForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMPNetForQuestionAnswering(LSGMPNetMixin, MPNetForQuestionAnswering):
    """MPNetForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGMPNetForMultipleChoice(LSGMPNetMixin, MPNetForMultipleChoice):
    """MPNetForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""
