"""LSG attention: Local + Sparse + Global (Condevaux & Harispe, PAKDD 2023), the one shared core.

The attention itself, in pure torch (`lsg_attention_forward`), registered with transformers as the
attention implementation ``"lsg"`` together with its mask function (`lsg_attention_mask`), which
hands the attention the O(n) ``(batch, length)`` padding mask instead of an O(n^2) one.

The sequence seen by every layer is ``g`` global tokens followed by ``t`` real tokens. Each block of
``b`` query tokens attends to

    bidirectional:  [ g global keys | s sparse keys left | s sparse keys right | 3b local keys ]
    causal:         [ g global keys | s sparse keys left | 2b local keys, up to the query itself ]

where the local keys are the previous, own (and next) blocks and the sparse keys are a compressed
copy of the context just outside the local window (see `SPARSE_COMPRESSORS`). Global queries attend
to everything (causal: to the global tokens before them). Blocks are batched through
`scaled_dot_product_attention` on 4D tensors, so its fused kernels run forward and backward; in
training, attention dropout is DropKey (keys hidden before the softmax, see `_drop_keys`), which
keeps them fused. No tensor of size ``t x t`` is ever built.

This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, sdpa_mask

LSG_ATTENTION = "lsg"
SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")


def uses_sparse_keys(config: Any) -> bool:
    """Whether the blocks get sparse keys at all (otherwise: local + global only)."""
    return config.sparsity_type != "none" and config.sparse_block_size > 0 and config.sparsity_factor > 0


def right_sparse_window_shift(config: Any) -> int:
    """Compressed positions by which block i's right sparse window starts before the aligned (i + 2) c.

    0, except for checkpoints of the 2023 reference (``legacy_sparse_window``) with one compressed
    token per block (``block_size == sparsity_factor``): the reference started that window two
    compressed tokens early, at i c, over keys the local window already holds, and models trained
    with it learned that pattern, so it is reproduced for them.
    """
    return -2 if config.legacy_sparse_window and config.block_size == config.sparsity_factor else 0


# --------------------------------------------------------------------------------------------------
# Sparse context: each function compresses the (padded) token sequence of length T into T / f keys
# --------------------------------------------------------------------------------------------------


@dataclass
class SparseContext:
    keys: torch.Tensor  # (B, H, T / f, D)
    values: torch.Tensor  # (B, H, T / f, D)
    mask: torch.Tensor  # (B, 1 or H, T / f) bool, True = may be attended


def _selection_chunk(config: Any) -> int:
    """Chunk in which norm and lsh select/hash: min(b, s), or b where that would not tile the blocks."""
    chunk = min(config.block_size, config.sparse_block_size)
    if config.block_size % chunk or chunk % config.sparsity_factor:
        return config.block_size
    return chunk


def _gather_tokens(keys, values, mask, token_index) -> SparseContext:
    """Pick tokens per head. token_index: (B or 1, H, L) positions in the token sequence."""
    batch, heads, _, head_dim = keys.shape
    token_index = token_index.expand(batch, heads, -1)
    gather_index = token_index.unsqueeze(-1).expand(-1, -1, -1, head_dim)
    selected_mask = mask[:, None, :].expand(-1, heads, -1).gather(2, token_index)
    return SparseContext(keys.gather(2, gather_index), values.gather(2, gather_index), selected_mask)


def sparse_by_norm(queries, keys, values, mask, config, scaling) -> SparseContext:
    """In each chunk, keep the chunk / f keys of largest L2 norm (padding has norm 0)."""
    chunk = _selection_chunk(config)
    kept = chunk // config.sparsity_factor
    batch, heads, length, _ = keys.shape
    with torch.no_grad():
        key_norms = keys.norm(dim=-1) * mask[:, None, :]  # (B, H, T)
        key_norms = key_norms.view(batch, heads, length // chunk, chunk)
        local_index = key_norms.topk(kept, dim=-1, sorted=False).indices  # (B, H, T / chunk, kept)
        chunk_start = torch.arange(0, length, chunk, device=keys.device).view(1, 1, -1, 1)
        token_index = (local_index + chunk_start).flatten(2)  # (B, H, T / f)
    return _gather_tokens(keys, values, mask, token_index)


def sparse_by_pooling(queries, keys, values, mask, config, scaling) -> SparseContext:
    """Masked mean of each window of f consecutive keys (and values)."""
    factor = config.sparsity_factor
    batch, heads, length, head_dim = keys.shape
    window_mask = mask.view(batch, 1, length // factor, factor, 1).to(keys.dtype)
    counts = window_mask.sum(dim=-2)  # (B, 1, T / f, 1)
    denominator = counts.clamp(min=1)
    pooled_keys = (keys.view(batch, heads, -1, factor, head_dim) * window_mask).sum(dim=-2) / denominator
    pooled_values = (values.view(batch, heads, -1, factor, head_dim) * window_mask).sum(dim=-2) / denominator
    return SparseContext(pooled_keys, pooled_values, counts.squeeze(-1) > 0)


def sparse_by_stride(queries, keys, values, mask, config, scaling) -> SparseContext:
    """Head j keeps tokens k * f + (j mod f)."""
    factor = config.sparsity_factor
    heads, length = keys.shape[1], keys.shape[2]
    head_offset = (torch.arange(heads, device=keys.device) % factor).view(1, heads, 1)
    token_index = torch.arange(0, length, factor, device=keys.device).view(1, 1, -1) + head_offset
    return _gather_tokens(keys, values, mask, token_index)


def sparse_by_block_stride(queries, keys, values, mask, config, scaling) -> SparseContext:
    """Head j keeps, in every block, the b / f consecutive tokens from offset (j * b / f) mod b."""
    block, factor = config.block_size, config.sparsity_factor
    kept = block // factor
    heads, length = keys.shape[1], keys.shape[2]
    offsets = torch.arange(kept, device=keys.device).view(1, -1) + torch.arange(heads, device=keys.device).view(-1, 1) * kept
    block_start = torch.arange(0, length, block, device=keys.device).view(-1, 1, 1)
    token_index = (offsets % block + block_start).permute(1, 0, 2).reshape(1, heads, -1)  # (1, H, T / f)
    return _gather_tokens(keys, values, mask, token_index)


def sparse_by_bos_pooling(queries, keys, values, mask, config, scaling) -> SparseContext:
    """In each window of f tokens, mean weighted by softmax(q_first . k * scaling), q_first = first real token.

    A window of padding only is masked (the 2023 reference left it unmasked, so its rows depended on
    the padding after them: see the README's compatibility notes)."""
    factor = config.sparsity_factor
    batch, heads, length, head_dim = keys.shape
    window_keys = keys.view(batch, heads, -1, factor, head_dim)
    window_values = values.view(batch, heads, -1, factor, head_dim)
    window_mask = mask.view(batch, 1, -1, factor)
    first_query = queries[:, :, :1, None, :]  # (B, H, 1, 1, D)
    scores = (window_keys * first_query).sum(dim=-1) * scaling  # (B, H, T / f, f)
    scores = scores.masked_fill(~window_mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1).unsqueeze(-1)
    return SparseContext(
        (weights * window_keys).sum(dim=-2), (weights * window_values).sum(dim=-2), window_mask.any(dim=-1)
    )


def _lsh_round(keys, values, weights, buckets: int, generator: torch.Generator):
    """Hash each chunk's items with random hyperplanes into `buckets` buckets and sum each bucket.

    keys, values: (B, H, C, items, D); weights: (B, H, C, items, 1) token counts (0 = padding).
    """
    batch, heads, chunks, _, head_dim = keys.shape
    with torch.no_grad():
        if buckets > 1:
            planes = torch.randn(
                1, heads, 1, head_dim, buckets // 2, generator=generator, device=keys.device, dtype=keys.dtype
            )
            projections = (F.normalize(keys, dim=-1) * weights.clamp(0, 1)) @ planes
            bucket = torch.cat([projections, -projections], dim=-1).argmax(dim=-1, keepdim=True)
        else:
            bucket = torch.zeros_like(weights, dtype=torch.long)
    shape = (batch, heads, chunks, buckets, head_dim)
    bucket_keys = keys.new_zeros(shape).scatter_add(-2, bucket.expand(-1, -1, -1, -1, head_dim), keys)
    bucket_values = values.new_zeros(shape).scatter_add(-2, bucket.expand(-1, -1, -1, -1, head_dim), values)
    bucket_weights = weights.new_zeros(shape[:-1] + (1,)).scatter_add(-2, bucket, weights)
    return bucket_keys, bucket_values, bucket_weights


def sparse_by_lsh(queries, keys, values, mask, config, scaling) -> SparseContext:
    """Average keys that hash together: chunks of min(b, s), pre-rounds into `chunk` buckets, then chunk / f."""
    chunk = _selection_chunk(config)
    batch, heads, length, head_dim = keys.shape
    weights = mask.view(batch, 1, -1, chunk, 1).to(keys.dtype).expand(-1, heads, -1, -1, -1)
    chunk_keys = keys.view(batch, heads, -1, chunk, head_dim) * weights
    chunk_values = values.view(batch, heads, -1, chunk, head_dim) * weights
    generator = torch.Generator(device=keys.device).manual_seed(config.lsh_seed)
    for _ in range(config.lsh_num_pre_rounds):
        chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, chunk, generator)
    buckets = chunk // config.sparsity_factor
    chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, buckets, generator)
    chunk_keys = chunk_keys / (weights + 1e-8)
    chunk_values = chunk_values / (weights + 1e-8)
    return SparseContext(
        chunk_keys.view(batch, heads, -1, head_dim),
        chunk_values.view(batch, heads, -1, head_dim),
        (weights > 0).view(batch, heads, -1),
    )


def sparse_every_token(queries, keys, values, mask, config, scaling) -> SparseContext:
    """sparsity_factor == 1: every token is a sparse token."""
    return SparseContext(keys, values, mask[:, None, :])


SPARSE_COMPRESSORS: dict[str, Callable[..., SparseContext]] = {
    "norm": sparse_by_norm,
    "pooling": sparse_by_pooling,
    "stride": sparse_by_stride,
    "block_stride": sparse_by_block_stride,
    "bos_pooling": sparse_by_bos_pooling,
    "lsh": sparse_by_lsh,
}


# --------------------------------------------------------------------------------------------------
# Attention. Tensors are laid out sequence-major, (B, L, H, D) as the projections produce them, so
# that blocks are views and SDPA's output already has the layout the model wants back.
# --------------------------------------------------------------------------------------------------


def _pad_rows(x: torch.Tensor, before: int, after: int, value: float | bool = 0) -> torch.Tensor:
    """Pad dim 1 of x (B, L, ...) with `before` and `after` rows of `value`."""
    return F.pad(x, (0, 0) * (x.dim() - 2) + (before, after), value=value)


def _sliding(x: torch.Tensor, size: int, step: int, count: int, start: int = 0) -> list[torch.Tensor]:
    """Window i = rows [start + i step, start + i step + size) of x (B, L, ...), for i < count.

    Returns views to concatenate on dim 2 into (B, count, size, ...): when the window is a few whole
    steps, the step-blocked tensor shifted once per step (its backward is a few slices); otherwise
    one `unfold` view.
    """
    steps = size // step
    if size % step == 0 and steps <= 4:
        end = start + (count + steps - 1) * step
        rows = x if (start, end) == (0, x.shape[1]) else x[:, start:end]
        blocked = rows.unflatten(1, (-1, step))  # (B, count + steps - 1, step, ...)
        return [blocked[:, j : j + count] for j in range(steps)]
    return [x[:, start:].unfold(1, size, step)[:, :count].movedim(-1, 2)]


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Copies of the rows `index` (q, K) of x (B, L, ...): (B, q, K, ...)."""
    return x.index_select(1, index.flatten()).unflatten(1, index.shape)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask -> 0 / finfo.min. Finite, so a query whose keys are all masked gets no NaN."""
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=allowed.device), torch.finfo(dtype).min)


def _drop_keys(allowed: torch.Tensor, groups_shape: torch.Size, num_keys: int, dropout: float) -> torch.Tensor:
    """Attention dropout as DropKey (Li et al., CVPR 2023) at group granularity: in each group of
    queries (a block, per head) every key is hidden with probability `dropout` before the softmax.
    The mask stays O(n) and SDPA keeps its fused kernels. A query that would lose every key keeps
    them all: it must never fall back onto masked keys."""
    kept = allowed & (torch.rand(*groups_shape, 1, num_keys, device=allowed.device) >= dropout)
    return torch.where(kept.any(dim=-1, keepdim=True), kept, allowed)


def _sdpa(query, key, value, allowed: torch.Tensor, dropout: float, scaling: float) -> torch.Tensor:
    """SDPA of query (..., H, q, D) on key, value (..., H, k, D); allowed: bool, broadcastable to (..., H, q, k)."""
    if dropout:
        allowed = _drop_keys(allowed, query.shape[:-2], key.shape[-2], dropout)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=_additive_mask(allowed, query.dtype), scale=scaling
    )


def _causal(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """(q, k) bool: query i (the last q of k positions) sees keys up to its own position."""
    return torch.arange(num_keys, device=device) <= torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]


def _sparse_context(queries, keys, values, mask, config, scaling) -> SparseContext:
    compress = sparse_every_token if config.sparsity_factor == 1 else SPARSE_COMPRESSORS[config.sparsity_type]
    return compress(queries, keys, values, mask, config, scaling)


def _attend(queries, keys, values, masks, dropout: float, scaling: float) -> torch.Tensor:
    """Each group of query rows attends to its own keys, through SDPA on 4D tensors.

    queries: (B, n, rows, H, D); keys, values: lists of (B, n, K_i, H, D) pieces (views where they
    can be), concatenated here: the one copy; masks: list of (B, n, 1 or H, 1 or rows, K_i) bool.
    Returns (B, n * rows, H, D).
    """
    batch, groups, rows, heads, head_dim = queries.shape
    mask_heads = max(m.shape[2] for m in masks)
    mask_rows = max(m.shape[3] for m in masks)
    allowed = torch.cat([m.expand(-1, -1, mask_heads, mask_rows, -1) for m in masks], dim=-1)

    def fold(x):  # (B, n, K, H, D) -> (B * n, H, K, D), a view: SDPA's fused kernels take 4D inputs
        return x.flatten(0, 1).transpose(1, 2)

    block_keys, block_values = torch.cat(keys, dim=2), torch.cat(values, dim=2)  # (B, n, K, H, D)
    output = _sdpa(fold(queries), fold(block_keys), fold(block_values), allowed.flatten(0, 1), dropout, scaling)
    # output: (B * n, H, rows, D)
    return output.transpose(1, 2).reshape(batch, groups * rows, heads, head_dim)


def _block_attention(
    queries, keys, values, mask, global_tokens, config, dropout: float, scaling: float, causal: bool
) -> torch.Tensor:
    """Attention of the token queries, block by block.

    queries, keys, values: (B, T, H, D) tokens, T a multiple of b; mask: (B, T) bool.
    global_tokens: (keys, values, mask) of the g global tokens, (B, g, H, D) x 2 and (B, g).
    Returns (B, T, H, D).
    """
    block = config.block_size
    num_blocks = queries.shape[1] // block

    # Local: block i sees tokens [(i - 1) b, (i + 2) b), causal: [(i - 1) b, (i + 1) b); zero-padded
    # and masked outside the sequence.
    local_size = (2 if causal else 3) * block

    def local(x, fill=0):  # (B, T, ...) -> pieces (B, nb, ., ...) of the 2b or 3b local rows
        return _sliding(_pad_rows(x, block, 0 if causal else block, fill), local_size, block, num_blocks)

    local_mask = torch.cat(local(mask, False), dim=2)[:, :, None, None, :]  # (B, nb, 1, 1, 3b)
    if causal:
        # row r of block i (token i b + r) sees local key j (token (i - 1) b + j) for j <= b + r
        local_mask = local_mask & _causal(block, 2 * block, queries.device)  # (B, nb, 1, b, 2b)
    block_keys, block_values, block_masks = local(keys), local(values), [local_mask]

    # Sparse: block i also sees the s compressed positions left of its local window,
    # [(i - 1) c - s, (i - 1) c), and (bidirectional) the s right of it, [(i + 2) c, (i + 2) c + s), c = b / f
    # (that one shifted by `right_sparse_window_shift` for the 2023 reference's checkpoints).
    if uses_sparse_keys(config):
        sparse = _sparse_context(*(x.transpose(1, 2) for x in (queries, keys, values)), mask, config, scaling)
        span, step = config.sparse_block_size, block // config.sparsity_factor
        margin = step + span
        right_start = margin + 2 * step + right_sparse_window_shift(config)  # (i + 2) c + shift, in padded rows

        def sparse_windows(x, fill=0):  # (B, T / f, ...) -> pieces (B, nb, ., ...) of the s or 2s sparse rows
            padded = _pad_rows(x, margin, margin, fill)
            left = _sliding(padded, span, step, num_blocks)
            return left if causal else left + _sliding(padded, span, step, num_blocks, start=right_start)

        block_keys = sparse_windows(sparse.keys.transpose(1, 2)) + block_keys
        block_values = sparse_windows(sparse.values.transpose(1, 2)) + block_values
        sparse_mask = torch.cat(sparse_windows(sparse.mask.transpose(1, 2), False), dim=2)  # (B, nb, s or 2s, 1 or H)
        block_masks.insert(0, sparse_mask.transpose(2, 3)[:, :, :, None, :])

    # Global: every block sees every global key.
    global_keys, global_values, global_mask = global_tokens
    if global_mask.shape[1]:
        block_keys.insert(0, global_keys[:, None].expand(-1, num_blocks, -1, -1, -1))
        block_values.insert(0, global_values[:, None].expand(-1, num_blocks, -1, -1, -1))
        block_masks.insert(0, global_mask[:, None, None, None, :].expand(-1, num_blocks, -1, -1, -1))

    blocked_queries = queries.unflatten(1, (num_blocks, block))  # (B, nb, b, H, D)
    return _attend(blocked_queries, block_keys, block_values, block_masks, dropout, scaling)


def _cached_causal_attention(query, key, value, key_mask, config, dropout: float, scaling: float) -> torch.Tensor:
    """Causal LSG for queries that are the last q of the cached keys (decoding): each gathers its own keys.

    query: (B, q, H, D); key, value: (B, g + T, H, D); key_mask: (B, g + T) bool. Returns (B, q, H, D).
    The keys are those a query at the same position gets from `_block_attention` with ``causal=True``.
    """
    block, num_global = config.block_size, config.num_global_tokens
    num_queries, num_tokens = query.shape[1], key.shape[1] - num_global
    if num_tokens < num_queries:
        raise ValueError("A cached causal LSG step must not start inside the global tokens: run the prompt first.")
    device = query.device
    positions = torch.arange(num_tokens - num_queries, num_tokens, device=device)  # token position of each query
    block_start = positions // block * block
    token_keys, token_values = key[:, num_global:], value[:, num_global:]
    token_mask = key_mask[:, num_global:]  # (B, T)

    # Local: tokens [block_start - b, block_start + b) up to the query (indices outside are clamped, then masked).
    local_token = block_start[:, None] - block + torch.arange(2 * block, device=device)  # (q, 2b)
    local_allowed = (local_token >= 0) & (local_token <= positions[:, None])
    local_index = local_token.clamp(0, num_tokens - 1)
    keys, values = [_rows(token_keys, local_index)], [_rows(token_values, local_index)]  # (B, q, 2b, H, D)
    masks = [(_rows(token_mask, local_index) & local_allowed)[:, :, None, None, :]]  # (B, q, 1, 1, 2b)

    # Sparse: compressed positions [(k - 1) c - s, (k - 1) c) for a query in block k. Every sparsity
    # type compresses whole blocks independently, so only the blocks under those windows are
    # compressed, [first, last): O(s f) per step, not the whole history.
    span, step, factor = config.sparse_block_size, block // config.sparsity_factor, config.sparsity_factor
    first_block = (num_tokens - num_queries) // block
    first = max(((first_block - 1) * block - span * factor) // block * block, 0)
    last = max((num_tokens - 1) // block * block - block, 0)  # the complete blocks before the last local window
    if uses_sparse_keys(config) and last > first:
        sparse = _sparse_context(
            query.transpose(1, 2),
            token_keys[:, first:last].transpose(1, 2),
            token_values[:, first:last].transpose(1, 2),
            token_mask[:, first:last],
            config,
            scaling,
        )
        # compressed positions (k - 1) c - s + i; those before the start are clamped, then masked
        sparse_position = (block_start // block - 1)[:, None] * step - span + torch.arange(span, device=device)  # (q, s)
        sparse_index = (sparse_position - first // factor).clamp(min=0)
        keys.insert(0, _rows(sparse.keys.transpose(1, 2), sparse_index))  # (B, q, s, H, D)
        values.insert(0, _rows(sparse.values.transpose(1, 2), sparse_index))
        sparse_mask = _rows(sparse.mask.transpose(1, 2), sparse_index)  # (B, q, s, 1 or H)
        sparse_mask = sparse_mask & (sparse_position >= 0)[:, :, None]
        masks.insert(0, sparse_mask.transpose(2, 3)[:, :, :, None, :])

    if num_global:
        keys.insert(0, key[:, None, :num_global].expand(-1, num_queries, -1, -1, -1))
        values.insert(0, value[:, None, :num_global].expand(-1, num_queries, -1, -1, -1))
        masks.insert(0, key_mask[:, None, None, None, :num_global].expand(-1, num_queries, -1, -1, -1))

    return _attend(query[:, :, None], keys, values, masks, dropout, scaling)


def lsg_self_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    config: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """LSG attention over ``g`` global tokens followed by ``t`` tokens.

    Args:
        query: (B, H, q, D): the last q of the g + t positions (q < g + t only when decoding with a cache).
        key, value: (B, H, g + t, D).
        padding_mask: (B, g + t) bool, True for tokens that may be attended; None = no padding.
        config: anything carrying the LSG keys of `LSGConfigMixin`.
        dropout: attention dropout probability, applied as DropKey (see `_drop_keys`).
        causal: decoder attention: local window = previous and own block up to the query, sparse keys
            on the left only, global tokens form a causal prefix.
    Returns:
        (B, H, q, D), a transposed view of a contiguous (B, q, H, D) tensor.
    """
    batch, _, length, head_dim = key.shape
    scaling = head_dim**-0.5 if scaling is None else scaling
    num_global, block = config.num_global_tokens, config.block_size
    key_mask = torch.ones(batch, length, dtype=torch.bool, device=key.device) if padding_mask is None else padding_mask
    if config.mask_first_token and length > num_global:
        key_mask = key_mask.clone()
        key_mask[:, num_global] = False
    num_tokens = length - num_global

    # Short input: the local window already covers everything, plain attention is exact.
    if num_tokens <= 2 * block and query.shape[2] == length:
        allowed = key_mask[:, None, None, :]
        if causal:
            allowed = allowed & _causal(length, length, key.device)
        return _sdpa(query, key, value, allowed, dropout, scaling)

    # From here on: sequence-major (B, L, H, D) views.
    query, key, value = (x.transpose(1, 2) for x in (query, key, value))
    if causal and query.shape[1] < length:
        return _cached_causal_attention(query, key, value, key_mask, config, dropout, scaling).transpose(1, 2)

    padding = -num_tokens % block
    if padding and not config.adaptive:
        raise ValueError(
            f"Input length {num_tokens} is not a multiple of block_size {block}: pad it, or set adaptive=True."
        )
    # Split (not slice) into global tokens and tokens: the backward pass then joins the two gradients
    # with one copy instead of zero-filling two full-size ones and adding them.
    global_queries, token_queries = query.split([num_global, num_tokens], dim=1)
    global_keys, token_keys = key.split([num_global, num_tokens], dim=1)
    global_values, token_values = value.split([num_global, num_tokens], dim=1)
    global_mask, token_mask = key_mask.split([num_global, num_tokens], dim=1)
    if padding:
        token_queries, token_keys, token_values = (
            _pad_rows(x, 0, padding) for x in (token_queries, token_keys, token_values)
        )
        token_mask = F.pad(token_mask, (0, padding), value=False)

    output = _block_attention(
        token_queries, token_keys, token_values, token_mask, (global_keys, global_values, global_mask),
        config, dropout, scaling, causal,
    )  # (B, T, H, D)
    if num_global:
        if causal:  # the global tokens are a prefix: each sees the ones before it
            keys_seen, values_seen = global_keys, global_values
            allowed = global_mask[:, None, None, :] & _causal(num_global, num_global, key.device)
        else:
            keys_seen, values_seen, allowed = key, value, key_mask[:, None, None, :]
        global_output = _sdpa(
            *(x.transpose(1, 2) for x in (global_queries, keys_seen, values_seen)), allowed, dropout, scaling
        )  # (B, H, g, D)
        output = torch.cat([global_output.transpose(1, 2), output], dim=1)
    if padding:
        output = output[:, :length]
    return output.transpose(1, 2)


def _cover_global_tokens(padding_mask: torch.Tensor, num_keys: int, config: Any) -> torch.Tensor:
    """(B, t) user mask -> (B, g + t): the model prepended g global tokens after the mask was made."""
    missing = num_keys - padding_mask.shape[-1]
    if missing == 0:
        return padding_mask
    if missing != config.num_global_tokens:
        raise ValueError(
            f"attention_mask has {padding_mask.shape[-1]} columns for {num_keys - config.num_global_tokens} tokens: "
            "give exactly one column per input token."
        )
    return F.pad(padding_mask, (missing, 0), value=True)


def lsg_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``"lsg"`` entry of transformers' AttentionInterface.

    Encoder self-attention runs LSG; so does the causal self-attention of a decoder-only model
    (``config.is_decoder``, e.g. BertLMHeadModel). The decoder and cross-attention of encoder-decoder
    models stay dense and go to SDPA. Returns (output (B, N, H, D), None).
    """
    config = module.config
    if attention_mask is not None and attention_mask.dim() == 2:
        attention_mask = _cover_global_tokens(attention_mask, key.shape[2], config)
    is_decoder_only = getattr(config, "is_decoder", False)
    causal_lsg = is_decoder_only and getattr(module, "is_causal", False)
    if not causal_lsg and (is_decoder_only or getattr(module, "is_decoder", False)):
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = attention_mask[:, None, None, :]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"LSG attention takes the (batch, length) padding mask, got a {attention_mask.dim()}D mask: "
            "pass attention_mask as a 2D tensor of 1s (tokens) and 0s (padding)."
        )
    output = lsg_self_attention(query, key, value, attention_mask, config, dropout, scaling, causal=causal_lsg)
    return output.transpose(1, 2).contiguous(), None


def lsg_attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    mask_function: Callable = bidirectional_mask_function,
    attention_mask: torch.Tensor | None = None,
    config: Any = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The ``"lsg"`` entry of transformers' AttentionMaskInterface.

    For LSG attention (bidirectional, or causal in a decoder-only model) it returns the user's (B, t)
    bool padding mask, O(n) instead of the (B, 1, q, kv) matrix; the attention extends it over the
    global tokens and applies causality itself. The dense decoders of encoder-decoder models get SDPA's mask.
    """
    if mask_function is not bidirectional_mask_function and not getattr(config, "is_decoder", False):
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            mask_function=mask_function,
            attention_mask=attention_mask,
            config=config,
            **kwargs,
        )
    return None if attention_mask is None else attention_mask.bool()


AttentionInterface.register(LSG_ATTENTION, lsg_attention_forward)
AttentionMaskInterface.register(LSG_ATTENTION, lsg_attention_mask)
