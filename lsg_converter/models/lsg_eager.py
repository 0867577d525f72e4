"""The ``eager`` backend of LSG attention: attention weights as transformers returns them.

lsg_attention computes each block's weights over its keys with an explicit softmax (the blocks of
the sdpa backend, same keys, same DropKey draws). Here those weights become what
``output_attentions=True`` returns for BERT, one ``(t, t)`` matrix per head:

* `token_weights` spreads each block's weights over the layer's keys (`KeyPattern.key_columns`),
  then each sparse key's weight over the tokens it compresses, in the proportions it takes their
  values, so that the output is exactly these weights times the values;
* `weighted_values` computes the output from them, with the global tokens' rows and columns cut
  off the matrix returned but kept on the output's autograd path;
* `global_state_cross_attention` does the same for a decoder's cross-attention over an encoder
  output that keeps its global states (``pass_global_tokens_to_decoder``).

Everything here is O(n^2) in memory, for inspection; training and serving use sdpa or flex_attention.
This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

if TYPE_CHECKING:
    from .lsg_attention import KeyPattern, SparseContext


def token_weights(pattern: KeyPattern, block_weights, sparse: SparseContext | None, num_tokens: int) -> torch.Tensor:
    """Each token query's weights over the layer's keys, from its block's weights: (B, H, t, g + t).

    block_weights: (B, nb, H, b, K) over each block's keys (`KeyPattern.key_columns`); sparse: the
    sparse context computed with the identity as values, so that ``sparse.values`` (B, H, T / f, T)
    holds each sparse key's weight on every token. A sparse key's weight is spread over the tokens
    by those proportions, and the tokens' value through it is what the query receives: a norm, stride
    or block_stride key gives its whole weight to the token it selected, a pooling key 1/f to each
    token of its window, a bos_pooling key its softmax share to each, an lsh key 1/count to each
    token of its bucket. A token reached both as a local and as a sparse key gets both weights.
    """
    batch, num_blocks, heads, rows, _ = block_weights.shape
    num_global, padded_tokens = pattern.num_global, num_blocks * rows
    num_compressed = 0 if sparse is None else sparse.values.shape[2]
    columns = pattern.key_columns(torch.arange(num_blocks, device=block_weights.device), padded_tokens, num_compressed)
    index = columns[None, None, :, None, :].expand(batch, heads, -1, rows, -1)  # (B, H, nb, b, K)
    dense = block_weights.new_zeros(batch, heads, num_blocks, rows, num_global + padded_tokens + num_compressed + 1)
    dense = dense.scatter_add(-1, index, block_weights.transpose(1, 2)).flatten(2, 3)  # (B, H, T, g + T + T / f + 1)
    global_part, token_part, compressed_part, _ = dense.split([num_global, padded_tokens, num_compressed, 1], dim=-1)
    if num_compressed:
        token_part = token_part + compressed_part @ sparse.values  # (B, H, T, T)
    return torch.cat([global_part, token_part[..., :num_tokens]], dim=-1)[:, :, :num_tokens]


def weighted_values(weights: torch.Tensor, value: torch.Tensor, num_global: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weights (B, H, L, L) over value (B, H, L, D): the output (B, H, L, D) and the token rows and
    columns of the weights (B, H, L - g, L - g), rebuilt into the matrix the output is computed from,
    so that they lie on its autograd path (``attentions[i].retain_grad()`` gets a gradient)."""
    token_block = weights[:, :, num_global:, num_global:]
    if num_global:
        token_rows = torch.cat([weights[:, :, num_global:, :num_global], token_block], dim=-1)
        weights = torch.cat([weights[:, :, :num_global], token_rows], dim=2)
    return weights @ value, token_block


def global_state_cross_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    backend: str = "sdpa",
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``"lsg_cross_<backend>"`` entries of transformers' AttentionInterface: the decoder's
    cross-attention over an encoder output that keeps its g global states in front
    (``pass_global_tokens_to_decoder``). It is dense: transformers' implementation of `backend`,
    except that with "eager" the weights returned leave the g global columns out, (B, H, q, t), so
    that column j is input token j as in the source model; the output is computed from them."""
    if backend != "eager":
        return ALL_ATTENTION_FUNCTIONS[backend](module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    dropout = kwargs.get("dropout", 0.0)
    scores = (query @ key.transpose(-1, -2)) * scaling
    if attention_mask is not None:  # transformers' eager mask: additive, (B, 1, q, g + t)
        scores = scores + attention_mask
    weights = F.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)  # (B, H, q, g + t)
    num_global = module.config.num_global_tokens
    token_columns = weights[..., num_global:]
    weights = torch.cat([weights[..., :num_global], token_columns], dim=-1)  # on the output's autograd path
    return (weights @ value).transpose(1, 2).contiguous(), token_columns
