"""LSG-ModernBERT: the ModernBERT heads of transformers with LSG attention and global tokens.

ModernBERT rotates its queries and keys (RoPE, a frequency table per layer type) before transformers'
attention interface, so LSG attention receives them rotated; it has no position table. Every third layer
("full_attention") sees the whole input: there LSG attention runs with the model's settings. The others
("sliding_attention") see the keys within half their window (``|i - j| <= local_attention // 2``): there
LSG attention keeps that window exactly, in O(n), as a band (`SlidingWindowAttention`): blocks of half the
window, no sparse keys, and the keys beyond it masked by a position term (`window_terms`). The global tokens
join before the embedding norm and sit at position 0 of the rotary module: in a sliding layer they are seen,
and see, as a token at position 0 is. transformers' ModernBERT builds an (L, L) mask for both kinds of layer;
an LSG model hands both its (B, 1, 1, g + t) padding view, which transformers passes through.

Each head ``LSGModernBert<Head>`` is the mixin below plus ``ModernBert<Head>``, one class per head listed in
LSGModernBertConfig.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .configuration_lsg_modernbert import LSGModernBertConfig
from .lsg_attention import SelfAttentionRole
from .lsg_attention_layers import RotaryAttention
from .lsg_global_tokens import GivesGlobalTokensPosition0, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_pattern import PositionTerms, shape_cached
from .lsg_recorder import CarriesAndDropsGlobalTokens
from .lsg_settings import LSGSettings
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.modernbert.modeling_modernbert import (
        ModernBertEncoderLayer,
        ModernBertForMaskedLM,
        ModernBertForMultipleChoice,
        ModernBertForQuestionAnswering,
        ModernBertForSequenceClassification,
        ModernBertForTokenClassification,
        ModernBertModel,
        ModernBertRotaryEmbedding,
    )

# The score added to a key beyond the window: finite, so that a padded query whose window holds padding
# alone still averages something, and far enough below any score that its weight is 0 in float32 and bf16.
OUTSIDE_WINDOW = -1e4


def outside_window(relative: torch.Tensor, half_window: int) -> torch.Tensor:
    """Column of the window's table for a relative distance (int64): 1 beyond `half_window`, else 0."""
    return (relative.abs() > half_window).long()


def window_terms(query: torch.Tensor, half_window: int) -> PositionTerms:
    """ModernBERT's sliding window as position terms: 0 for a key within `half_window` of its query,
    `OUTSIDE_WINDOW` beyond, for every head of `query` (B, H, N, D): one object for the sliding layers of
    every forward pass (`shared_window_terms`), under which each pass keeps what it makes of them once."""
    return shared_window_terms(half_window, query.shape[1], query.dtype, query.device)


@shape_cached
def shared_window_terms(half_window: int, heads: int, dtype: torch.dtype, device: torch.device) -> PositionTerms:
    """`window_terms` for `heads` heads in `dtype` on `device`, made once."""
    table = torch.tensor([0.0, OUTSIDE_WINDOW], dtype=dtype, device=device).expand(heads, 2)  # (H, 2)
    bucket = functools.partial(outside_window, half_window=half_window)
    return PositionTerms(bucket=bucket, table=table, global_position=0, max_distance=half_window + 1)


@dataclass(frozen=True)
class SlidingWindowAttention(RotaryAttention):
    """ModernBERT's attention layers: the full-attention ones run LSG attention with the model's settings
    (the global distances clamped with the full-attention frequencies), the sliding-window ones a band of
    their window (blocks of half the window, so that a block's local keys cover it; no sparse keys;
    `window_terms` masking the keys beyond it, the global tokens' included)."""

    frequencies: str = "full_attention_inv_freq"

    def reads_far_global_tokens(self, module: nn.Module) -> bool:
        return module.sliding_window is None

    def role(self, module: nn.Module, config: Any, settings: LSGSettings) -> SelfAttentionRole:
        if module.sliding_window is None:
            return super().role(module, config, settings)
        half_window = config.sliding_window
        band = dataclasses.replace(settings, block_size=half_window, sparsity_type="none")
        band.pattern()  # built now, not in a compiled forward
        return SelfAttentionRole(band, position_terms=functools.partial(window_terms, half_window=half_window))


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class ModernBertRotaryEmbeddingWithGlobalTokensAtPosition0(GivesGlobalTokensPosition0, ModernBertRotaryEmbedding):
    """ModernBertRotaryEmbedding: the global tokens' position ids, 0, go in front of the tokens'
    (`GivesGlobalTokensPosition0`)."""


class ModernBertEncoderLayerRecordingTokenStates(RecordsTokenStates, ModernBertEncoderLayer):
    """ModernBertEncoderLayer recording the token rows of its states (`RecordsTokenStates`)."""


class ModernBertModelDroppingGlobalTokens(CarriesAndDropsGlobalTokens, ModernBertModel):
    """ModernBertModel, the recorder: its forward runs inside its `RecorderSteps`, its output leaves the global
    tokens out (`CarriesAndDropsGlobalTokens`)."""


class LSGModernBertMixin(LSGModelMixin):
    """ModernBERT keeps its global tokens in `embeddings` and prepends them before `embeddings.norm`."""

    config_class = LSGModernBertConfig
    lsg_layout = LSGLayout(
        prepend_before=("embeddings.norm",), encoder="", position_tables=(), rotary_embeddings=("rotary_emb",)
    )
    lsg_attention = SlidingWindowAttention()


class LSGModernBertModel(LSGModernBertMixin, ModernBertModel):
    """ModernBertModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGModernBertForMaskedLM(LSGModernBertMixin, ModernBertForMaskedLM):
    """ModernBertForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGModernBertForSequenceClassification(LSGModernBertMixin, ModernBertForSequenceClassification):
    """ModernBertForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGModernBertForTokenClassification(LSGModernBertMixin, ModernBertForTokenClassification):
    """ModernBertForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGModernBertForQuestionAnswering(LSGModernBertMixin, ModernBertForQuestionAnswering):
    """ModernBertForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGModernBertForMultipleChoice(LSGModernBertMixin, ModernBertForMultipleChoice):
    """ModernBertForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""
