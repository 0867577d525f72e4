"""The ``sdpa`` backend of LSG attention: blocks batched through `scaled_dot_product_attention`.

Each block of b token queries gets its keys gathered once (`lsg_pattern.BlockKeys`: views where they
can be, one copy), and the blocks run as one batch of 4D inputs, (B * nb, H, b, D), so that SDPA's
fused kernels run forward and backward (5D inputs, and its own dropout, fall back to the O(n^2) math
kernel: dropout is DropKey, drawn by the core). Position terms join the additive mask; the blocks
whose mask is all zero run without it (`mask_runs`). The blocks of a padded batch that hold padding
only are left out (`TokenAttention.real_blocks`). The default backend, on the CPU and on CUDA.

This file travels with saved models as remote code: it imports torch only.
"""

from __future__ import annotations

import torch

from .lsg_pattern import BlockKeys, TokenAttention, TokenOutput, fused_attention, sdpa_dense_attention, tracing


class SdpaBackend:
    """Token queries block by block through SDPA; the global queries through one SDPA call."""

    name = "sdpa"
    returns_weights = False

    def runs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
        return True

    def token_attention(self, job: TokenAttention) -> TokenOutput:
        chosen = job.query_blocks  # None: every block
        blocks = BlockKeys.of(job, chosen=chosen)
        batch, padded_tokens, heads, _ = job.queries.shape
        queries, keys, values, mask = blocks.queries, blocks.keys, blocks.values, blocks.mask
        output = queries.new_empty(queries.shape[0], job.pattern.block_size, heads, values.shape[-1])  # (n, b, H, D)
        for start, end, masked in mask_runs(mask):
            output[start:end] = fused_attention(
                queries[start:end], keys[start:end], values[start:end], mask[start:end] if masked else None, job.scaling
            ).transpose(1, 2)
        if chosen is not None:  # the blocks of padding only get zeros
            every_block = output.new_zeros(batch, job.num_blocks, *output.shape[1:])
            output = every_block.index_put_(chosen, output)
        output = output.reshape(batch, padded_tokens, heads, -1)[:, : job.num_tokens]
        return TokenOutput(output, None, None)

    dense_attention = staticmethod(sdpa_dense_attention)


def mask_runs(mask: torch.Tensor) -> list[tuple[int, int, bool]]:
    """The blocks of an additive block mask (n, 1 or H, 1 or b, K) as runs of consecutive ones, (start,
    end, whether they need the mask): a block whose mask is all zero (every key allowed, no position
    terms: a block away from the edges and the padding) runs SDPA without one, the fused kernels' faster
    path, with the same result. Masks with rows per head or query (position terms, DropKey) are not
    scanned: one run that needs its mask."""
    blocks = mask.shape[0]
    if mask.shape[1] * mask.shape[2] != 1 or tracing():
        return [(0, blocks, True)]
    needed = mask.flatten(1).ne(0).any(dim=1).tolist()
    runs, start = [], 0
    for end in range(1, blocks + 1):
        if end == blocks or needed[end] != needed[start]:
            runs.append((start, end, needed[start]))
            start = end
    return runs
