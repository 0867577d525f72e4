"""T5's relative attention bias (T5, mT5, UMT5 encoders) as LSG position terms, looked up by distance.

T5 adds to each score a learned scalar per head and bucket of the relative distance r = key - query
(bidirectional: 32 buckets, exact below 8, logarithmic up to ``relative_attention_max_distance`` M,
128; every distance at or beyond M on one side in the same last bucket, as transformers' bucket
function documents it). `t5_position_terms` evaluates transformers' bucket function
once, on the 2 M + 1 distances -M..M, and hands LSG attention the bias per head and distance, (H,
2 M + 1), with `clamped_distance` as the bucket: each (query, key) pair then costs a clamp and a
lookup, never the bucket function (a block's sparse keys mostly lie beyond M).
The distance table is a gather of the bias table, so the bias gets its gradient through it.

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_pattern and
lsg_transformers only.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .lsg_pattern import PositionTerms
from .lsg_transformers import relative_position_buckets


def clamped_distance(relative: torch.Tensor, max_distance: int) -> torch.Tensor:
    """Column of a table over the distances -max_distance..max_distance: relative distance (int64),
    clamped into that range, plus max_distance."""
    return relative.clamp(-max_distance, max_distance) + max_distance


def t5_position_terms(attention: nn.Module, global_position: int) -> PositionTerms:
    """The bias of a T5-style encoder attention module (``relative_attention_bias``, a (buckets, H)
    embedding) as `PositionTerms` over clamped distances; global tokens at `global_position`."""
    max_distance = attention.relative_attention_max_distance
    weight = attention.relative_attention_bias.weight  # (buckets, H)
    distances = torch.arange(-max_distance, max_distance + 1, device=weight.device)
    buckets = relative_position_buckets(attention, distances)  # (2 M + 1,)
    return PositionTerms(
        bucket=functools.partial(clamped_distance, max_distance=max_distance),
        table=weight.T[:, buckets],  # (H, 2 M + 1)
        global_position=global_position,
        max_distance=max_distance,
    )
