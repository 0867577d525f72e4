"""The ``eager`` backend of LSG attention: explicit weights, as ``output_attentions=True`` returns them.

The blocks of the sdpa backend (same keys, same DropKey draws, same position terms) with an explicit
softmax (`explicit_softmax`). Their weights become what transformers returns for BERT,
one ``(t, t)`` matrix per head:

* `token_weights` spreads each block's weights over the layer's keys (the blocks' `lsg_pattern.BlockTable`),
  then each sparse key's weight over the tokens it compresses, in the proportions it takes their
  values (`SparseContext.token_weights`), so that the output is exactly these weights times the values;
* the output is computed from them (`weighted_values`), with the global columns cut off
  the matrix returned but kept on the output's autograd path.

Everything here is O(n^2) in memory, for inspection; training and serving use sdpa or flex_attention.
This file travels with saved models as remote code: it imports torch and, of this folder, lsg_pattern only.
"""

from __future__ import annotations

import torch

from .lsg_pattern import BlockKeys, BlockTable, SparseContext, TokenAttention, TokenOutput, additive_mask


def explicit_softmax(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The softmax of every explicit LSG attention: in float32 at least (half precision inputs too), as
    transformers' eager attention runs it, then cast to `dtype`."""
    return scores.softmax(dim=-1, dtype=torch.promote_types(dtype, torch.float32)).to(dtype)


def weighted_values(
    weights: torch.Tensor, value: torch.Tensor, num_global: int, global_rows: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """weights (B, H, q, g + k) over value (B, H, g + k, D), whose first `global_rows` rows (0 or g) are
    the global queries': the output (B, H, q, D) and the token block of the weights, (B, H, q -
    global_rows, k), rebuilt into the matrix the output is computed from, so that it lies on the
    autograd path (``attentions[i].retain_grad()`` gets a gradient)."""
    token_block = weights[:, :, global_rows:, num_global:]
    if num_global:
        token_rows = torch.cat([weights[:, :, global_rows:, :num_global], token_block], dim=-1)
        weights = torch.cat([weights[:, :, :global_rows], token_rows], dim=2)
    return weights @ value, token_block


def token_weights(
    table: BlockTable, block_weights, sparse: SparseContext | None, num_global: int, num_tokens: int
) -> torch.Tensor:
    """Each token query's weights over the layer's keys, from its block's weights: (B, H, t, g + t).

    table: where each block's keys lie in [g globals | t tokens | compressed keys]; block_weights: (B, nb,
    H, b, K) over each block's keys (`KeyPattern.key_columns`); sparse: the sparse context with
    ``token_weights`` (B, H, T / f, T), each sparse key's weight on every token.
    A sparse key's weight is spread over the tokens by those proportions, and the tokens' value
    through it is what the query receives: a norm, stride or block_stride key gives its whole weight
    to the token it selected, a pooling key 1/f to each token of its window, a bos_pooling key its
    softmax share to each, an lsh key 1/count to each token of its bucket. A token reached both as a
    local and as a sparse key gets both weights.
    """
    batch, num_blocks, heads, rows, _ = block_weights.shape
    num_compressed = 0 if sparse is None else sparse.token_weights.shape[2]
    # each block's keys in the sequence [g globals | t tokens | compressed | one column for the keys outside it]
    outside = num_global + num_tokens + num_compressed
    columns = torch.where(table.inside, table.columns, outside)  # (nb, K)
    index = columns[None, None, :, None, :].expand(batch, heads, -1, rows, -1)  # (B, H, nb, b, K)
    dense = block_weights.new_zeros(batch, heads, num_blocks, rows, outside + 1)
    dense = dense.scatter_add(-1, index, block_weights.transpose(1, 2)).flatten(2, 3)  # (B, H, T, g + t + T / f + 1)
    dense = dense[:, :, :num_tokens]  # the token queries' rows
    global_part, token_part, compressed_part, _ = dense.split([num_global, num_tokens, num_compressed, 1], dim=-1)
    if num_compressed:
        token_part = token_part + compressed_part @ sparse.token_weights[..., :num_tokens]  # (B, H, t, t)
    return torch.cat([global_part, token_part], dim=-1)


def eager_token_attention(job: TokenAttention, memo: dict | None) -> TokenOutput:
    """The eager path: the blocks of the sdpa backend with explicit weights, spread over a (t, t) matrix per
    head, returned as the token queries' weights; their mask made once under `memo` (as in
    `lsg_sdpa.gathered_token_attention`)."""
    blocks = BlockKeys.of(job, memo, with_values=False)
    scores = blocks.queries @ blocks.keys.transpose(-1, -2) * job.scaling  # (B * nb, H, b, K)
    block_weights = explicit_softmax(scores + blocks.mask, scores.dtype)
    block_weights = block_weights.unflatten(0, (job.token_keys.shape[0], job.num_blocks))  # (B, nb, H, b, K)
    weights = token_weights(blocks.table, block_weights, job.sparse, job.pattern.num_global, job.num_tokens)
    if job.plan.real_rows is not None:  # the queries of blocks of padding only weigh nothing, as sdpa leaves them
        weights = torch.where(job.plan.real_rows[:, None, :, None], weights, 0)
    output, token_block = weighted_values(weights, job.sequence[2].transpose(1, 2), job.pattern.num_global)  # (B, H, g + t, D)
    return TokenOutput(output.transpose(1, 2), token_block)


class EagerBackend:
    """The dense attention of the eager backend, with explicit weights; its path for the token queries is
    `eager_token_attention`."""

    name = "eager"
    returns_weights = True

    def dense_attention(self, query, key, value, allowed, scaling, scores):
        logits = (query @ key.transpose(-1, -2)) * scaling
        mask = additive_mask(allowed, query.dtype, scores)  # None: every key, no position terms
        logits = logits if mask is None else logits + mask
        weights = explicit_softmax(logits, query.dtype)
        return weights @ value, weights
