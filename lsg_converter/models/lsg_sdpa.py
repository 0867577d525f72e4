"""The ``sdpa`` backend of LSG attention: blocks batched through `scaled_dot_product_attention`.

Each block of b token queries gets its keys gathered once (`lsg_pattern.BlockKeys`: views where they
can be, one copy), and the blocks run as one batch of 4D inputs, (B * nb, H, b, D), so that SDPA's
fused kernels run forward and backward (5D inputs, and its own dropout, fall back to the O(n^2) math
kernel: dropout is DropKey, drawn by the core). Position terms join the additive mask. The blocks of a
padded batch that hold padding only are left out (`TokenAttention.real_blocks`). The default
backend without CUDA.

This file travels with saved models as remote code: it imports torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .lsg_pattern import BlockKeys, TokenAttention, TokenOutput, sdpa_dense_attention


class SdpaBackend:
    """Token queries block by block through SDPA; the global queries through one SDPA call."""

    name = "sdpa"
    returns_weights = False

    def runs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
        return True

    def token_attention(self, job: TokenAttention) -> TokenOutput:
        chosen = job.query_blocks  # None: every block
        blocks = BlockKeys.of(job, chosen=chosen)
        output = F.scaled_dot_product_attention(
            blocks.queries, blocks.keys, blocks.values, attn_mask=blocks.mask, scale=job.scaling
        )  # (n, H, b, D)
        batch, padded_tokens, heads, head_dim = job.queries.shape
        output = output.transpose(1, 2)  # (n, b, H, D)
        if chosen is not None:  # the blocks of padding only get zeros
            every_block = output.new_zeros(batch, job.num_blocks, *output.shape[1:])
            output = every_block.index_put_(chosen, output)
        output = output.reshape(batch, padded_tokens, heads, head_dim)[:, : job.num_tokens]
        return TokenOutput(output, None, None)

    dense_attention = staticmethod(sdpa_dense_attention)
