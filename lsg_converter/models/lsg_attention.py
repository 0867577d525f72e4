"""LSG attention: Local + Sparse + Global (Condevaux & Harispe, PAKDD 2023), the one shared core.

The attention itself, in pure torch (`lsg_attention_forward`), registered with transformers as the
attention implementations ``"lsg"`` (automatic backend), ``"lsg_sdpa"`` and ``"lsg_flex_attention"``
together with its mask function (`lsg_attention_mask`), which hands the attention the O(n)
``(batch, length)`` padding mask instead of an O(n^2) one. Models choose with
``attn_implementation="sdpa"`` or ``"flex_attention"`` (see `lsg_attention_name`).

The sequence seen by every layer is ``g`` global tokens followed by ``t`` real tokens. Each block of
``b`` query tokens attends to

    bidirectional:  [ g global keys | s sparse keys left | s sparse keys right | 3b local keys ]
    causal:         [ g global keys | s sparse keys left | 2b local keys, up to the query itself ]

where the local keys are the previous, own (and next) blocks and the sparse keys are a compressed
copy of the context just outside the local window (see `SPARSE_COMPRESSORS`). Global queries attend
to everything (causal: to the global tokens before them). `KeyPattern` describes these keys once;
two backends compute the token queries from it:

* ``"sdpa"``: blocks batched through `scaled_dot_product_attention` on 4D tensors, so its fused
  kernels run forward and backward (the default on CPU);
* ``"flex_attention"``: one `flex_attention` call over a block-sparse mask (lsg_flex; the default on
  CUDA).

In training, attention dropout is DropKey (keys hidden before the softmax, see `_drop_keys`), which
keeps the kernels fused; both backends hide the same keys for the same random state. No tensor of
size ``t x t`` is ever built (except by flex_attention run uncompiled, off CUDA).

This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, sdpa_mask
from transformers.utils import logging

from .lsg_flex import FLEX_ATTENTION_AVAILABLE, FLEX_FORWARD_ONLY_DEVICES, flex_token_attention

logger = logging.get_logger(__name__)

LSG_ATTENTION = "lsg"  # the attention registered with transformers; automatic choice of backend
# attn_implementation values an LSG model accepts: the kernel of its token queries. Each is registered
# with transformers as f"{LSG_ATTENTION}_{backend}".
LSG_BACKENDS = ("sdpa", "flex_attention")
SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")


def lsg_attention_name(attn_implementation: str | None) -> str:
    """The registered attention of an LSG model asked for `attn_implementation`.

    None (or ``"lsg"``): automatic, flex_attention on CUDA where torch has it, sdpa elsewhere; a value
    of `LSG_BACKENDS` (or its registered name): that backend. Anything else raises ValueError.
    """
    if attn_implementation is None or attn_implementation == LSG_ATTENTION:
        return LSG_ATTENTION
    backend = attn_implementation.removeprefix(f"{LSG_ATTENTION}_") if isinstance(attn_implementation, str) else None
    if backend not in LSG_BACKENDS:
        choices = ", ".join(repr(name) for name in LSG_BACKENDS)
        raise ValueError(
            f"attn_implementation={attn_implementation!r} is not available in LSG models: use one of {choices}, "
            "or leave it unset (flex_attention on CUDA, sdpa elsewhere)."
        )
    if backend == "flex_attention" and not FLEX_ATTENTION_AVAILABLE:
        raise ValueError(
            f"attn_implementation='flex_attention' needs torch >= 2.5.1 (installed: {torch.__version__}): "
            "upgrade torch or use attn_implementation='sdpa'."
        )
    return f"{LSG_ATTENTION}_{backend}"


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


def lsh_hyperplanes(
    shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """Random hyperplanes drawn on the CPU from `generator` (a CPU generator), then moved to `device`:
    a CUDA generator draws other numbers for the same seed, so every device gets the same buckets."""
    return torch.randn(shape, generator=generator, dtype=dtype).to(device)


def _lsh_round(keys, values, weights, buckets: int, generator: torch.Generator):
    """Hash each chunk's items with random hyperplanes into `buckets` buckets and sum each bucket.

    keys, values: (B, H, C, items, D); weights: (B, H, C, items, 1) token counts (0 = padding).
    """
    batch, heads, chunks, _, head_dim = keys.shape
    with torch.no_grad():
        if buckets > 1:
            planes = lsh_hyperplanes((1, heads, 1, head_dim, buckets // 2), generator, keys.dtype, keys.device)
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
    generator = torch.Generator().manual_seed(config.lsh_seed)
    for _ in range(config.lsh_num_pre_rounds):
        chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, chunk, generator)
    buckets = chunk // config.sparsity_factor
    chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, buckets, generator)
    # bucket means; an empty bucket (weight 0) keeps its zero sum instead of 0 / 0
    counts = weights.clamp(min=1)
    chunk_keys, chunk_values = chunk_keys / counts, chunk_values / counts
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
# The key pattern: which keys each token query sees, described once for every attention kernel
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPattern:
    """Which keys each token query sees: the one description both kernels derive their masks from.

    Positions count tokens from the first real token (the global tokens are apart); query block i is
    tokens [i b, (i + 1) b); compressed position p is the p-th key of the sparse context. Block i sees

    * every global token;
    * the local tokens [(i - blocks_before) b, (i + 1 + blocks_after) b), causal: up to the query;
    * per sparse window, the compressed positions [i c + start, i c + start + sparse_size), with
      c = `compressed_per_block` and start = `sparse_left_start`, then `sparse_right_start`.

    The SDPA path turns this into views of block windows (`_local_windows`, `_sparse_windows`), the
    flex path (lsg_flex) into a mask_mod over element positions (`sees_token`, `sees_compressed`) and
    the block structure of a BlockMask; a block's keys come in the order [globals | sparse windows |
    local] (`local_slot`, `sparse_slot`).
    """

    block_size: int
    blocks_before: int
    blocks_after: int
    compressed_per_block: int
    sparse_size: int
    sparse_left_start: int
    sparse_right_start: int | None
    causal: bool
    num_global: int

    @classmethod
    def of(cls, config: Any, causal: bool = False) -> KeyPattern:
        """The pattern of an LSG config: previous, own (and next) block, s sparse keys on each side."""
        block = config.block_size
        step = block // config.sparsity_factor if uses_sparse_keys(config) else 0
        size = config.sparse_block_size if step else 0
        return cls(
            block_size=block,
            blocks_before=1,
            blocks_after=0 if causal else 1,
            compressed_per_block=step,
            sparse_size=size,
            # left: the s positions just before the local window; right: the s just after it (shifted
            # for the 2023 reference's checkpoints, see `right_sparse_window_shift`)
            sparse_left_start=-step - size,
            sparse_right_start=None if causal or not size else 2 * step + right_sparse_window_shift(config),
            causal=causal,
            num_global=config.num_global_tokens,
        )

    @property
    def local_size(self) -> int:
        """Local keys per block."""
        return (self.blocks_before + 1 + self.blocks_after) * self.block_size

    @property
    def sparse_starts(self) -> tuple[int, ...]:
        """Start of each sparse window relative to i c, in key order (none without sparse keys)."""
        if not self.sparse_size:
            return ()
        return (self.sparse_left_start,) + (() if self.sparse_right_start is None else (self.sparse_right_start,))

    def local_start(self, block_index):
        """First token of block `block_index`'s local window."""
        return (block_index - self.blocks_before) * self.block_size

    def local_end(self, block_index):
        """End (exclusive) of block `block_index`'s local window."""
        return (block_index + 1 + self.blocks_after) * self.block_size

    def sees_token(self, query, token):
        """Whether query token `query` sees token `token` as a local key (int tensors, broadcast)."""
        offset = token // self.block_size - query // self.block_size
        seen = (offset >= -self.blocks_before) & (offset <= self.blocks_after)
        return seen & (token <= query) if self.causal else seen

    def sees_compressed(self, query, position):
        """Whether query token `query` sees compressed position `position` as a sparse key."""
        relative = position - query // self.block_size * self.compressed_per_block
        windows = [(relative >= start) & (relative < start + self.sparse_size) for start in self.sparse_starts]
        return functools.reduce(operator.or_, windows)

    def local_slot(self, query, token):
        """Index of `token` among the keys of `query`'s block (see the class docstring for the order)."""
        sparse_keys = len(self.sparse_starts) * self.sparse_size
        return self.num_global + sparse_keys + token - self.local_start(query // self.block_size)

    def sparse_slot(self, query, position):
        """Index of compressed position `position` among the keys of `query`'s block."""
        relative = position - query // self.block_size * self.compressed_per_block
        slot = relative - self.sparse_left_start
        if self.sparse_right_start is not None:
            right = relative >= self.sparse_right_start
            slot = torch.where(right, relative - self.sparse_right_start + self.sparse_size, slot)
        return self.num_global + slot


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


def _local_windows(pattern: KeyPattern, x: torch.Tensor, num_blocks: int, fill=0) -> list[torch.Tensor]:
    """(B, T, ...) -> pieces (B, nb, ., ...) of each block's local rows, `fill` outside the sequence."""
    block = pattern.block_size
    padded = _pad_rows(x, pattern.blocks_before * block, pattern.blocks_after * block, fill)
    return _sliding(padded, pattern.local_size, block, num_blocks)


def _sparse_windows(pattern: KeyPattern, x: torch.Tensor, num_blocks: int, fill=0) -> list[torch.Tensor]:
    """(B, T / f, ...) -> pieces (B, nb, ., ...) of each block's sparse windows, `fill` outside the sequence."""
    step, size, starts = pattern.compressed_per_block, pattern.sparse_size, pattern.sparse_starts
    before, after = max(0, -min(starts)), max(0, max(starts) + size - step)
    padded = _pad_rows(x, before, after, fill)
    return [piece for start in starts for piece in _sliding(padded, size, step, num_blocks, start=before + start)]


def _local_causal_mask(pattern: KeyPattern, device: torch.device) -> torch.Tensor:
    """(b, local_size) bool: which local keys each row of a block sees (its window starts at token 0)."""
    rows = torch.arange(pattern.block_size, device=device)[:, None] + pattern.blocks_before * pattern.block_size
    return pattern.sees_token(rows, torch.arange(pattern.local_size, device=device))


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


def _joined_masks(masks: list[torch.Tensor]) -> torch.Tensor:
    """Pieces (B, n, 1 or H, 1 or rows, K_i) bool -> one (B, n, 1 or H, 1 or rows, sum K_i)."""
    mask_heads = max(m.shape[2] for m in masks)
    mask_rows = max(m.shape[3] for m in masks)
    return torch.cat([m.expand(-1, -1, mask_heads, mask_rows, -1) for m in masks], dim=-1)


def _attend(queries, keys, values, masks, dropout: float, scaling: float) -> torch.Tensor:
    """Each group of query rows attends to its own keys, through SDPA on 4D tensors.

    queries: (B, n, rows, H, D); keys, values: lists of (B, n, K_i, H, D) pieces (views where they
    can be), concatenated here: the one copy; masks: list of (B, n, 1 or H, 1 or rows, K_i) bool.
    Returns (B, n * rows, H, D).
    """
    batch, groups, rows, heads, head_dim = queries.shape
    allowed = _joined_masks(masks)

    def fold(x):  # (B, n, K, H, D) -> (B * n, H, K, D), a view: SDPA's fused kernels take 4D inputs
        return x.flatten(0, 1).transpose(1, 2)

    block_keys, block_values = torch.cat(keys, dim=2), torch.cat(values, dim=2)  # (B, n, K, H, D)
    output = _sdpa(fold(queries), fold(block_keys), fold(block_values), allowed.flatten(0, 1), dropout, scaling)
    # output: (B * n, H, rows, D)
    return output.transpose(1, 2).reshape(batch, groups * rows, heads, head_dim)


def _block_masks(pattern: KeyPattern, token_mask, sparse: SparseContext | None, global_mask) -> list[torch.Tensor]:
    """Which keys of its window each block may attend to, as pieces in key order [globals | sparse | local].

    token_mask: (B, T) bool, T a multiple of b; global_mask: (B, g). Returns (B, nb, 1 or H, 1 or b, K_i) pieces.
    """
    num_blocks = token_mask.shape[1] // pattern.block_size
    local_mask = torch.cat(_local_windows(pattern, token_mask, num_blocks, False), dim=2)[:, :, None, None, :]
    if pattern.causal:
        local_mask = local_mask & _local_causal_mask(pattern, token_mask.device)  # (B, nb, 1, b, 2b)
    masks = [local_mask]
    if sparse is not None:
        sparse_mask = torch.cat(_sparse_windows(pattern, sparse.mask.transpose(1, 2), num_blocks, False), dim=2)
        masks.insert(0, sparse_mask.transpose(2, 3)[:, :, :, None, :])  # (B, nb, 1 or H, 1, s or 2s)
    if global_mask.shape[1]:
        masks.insert(0, global_mask[:, None, None, None, :].expand(-1, num_blocks, -1, -1, -1))
    return masks


def _block_attention(
    queries, keys, values, mask, global_tokens, sparse: SparseContext | None, pattern: KeyPattern, dropout, scaling
) -> torch.Tensor:
    """Attention of the token queries, block by block, through SDPA (the ``"sdpa"`` backend).

    queries, keys, values: (B, T, H, D) tokens, T a multiple of b; mask: (B, T) bool.
    global_tokens: (keys, values, mask) of the g global tokens, (B, g, H, D) x 2 and (B, g).
    Returns (B, T, H, D).
    """
    num_blocks = queries.shape[1] // pattern.block_size
    global_keys, global_values, global_mask = global_tokens
    # Keys and values: views of each block's window (zero-padded outside the sequence), in the order of
    # `_block_masks`.
    block_keys, block_values = _local_windows(pattern, keys, num_blocks), _local_windows(pattern, values, num_blocks)
    if sparse is not None:
        block_keys = _sparse_windows(pattern, sparse.keys.transpose(1, 2), num_blocks) + block_keys
        block_values = _sparse_windows(pattern, sparse.values.transpose(1, 2), num_blocks) + block_values
    if global_mask.shape[1]:
        block_keys.insert(0, global_keys[:, None].expand(-1, num_blocks, -1, -1, -1))
        block_values.insert(0, global_values[:, None].expand(-1, num_blocks, -1, -1, -1))

    blocked_queries = queries.unflatten(1, (num_blocks, pattern.block_size))  # (B, nb, b, H, D)
    masks = _block_masks(pattern, mask, sparse, global_mask)
    return _attend(blocked_queries, block_keys, block_values, masks, dropout, scaling)


def _dropped_block_keys(pattern, token_mask, sparse, global_mask, heads: int, dropout: float) -> torch.Tensor:
    """The keys DropKey leaves each block, as `_block_attention` draws them (same random numbers):
    (B, nb, H, 1 or b, K) bool."""
    allowed = _joined_masks(_block_masks(pattern, token_mask, sparse, global_mask))
    batch, num_blocks = allowed.shape[:2]
    kept = _drop_keys(allowed.flatten(0, 1), (batch * num_blocks, heads), allowed.shape[-1], dropout)
    return kept.unflatten(0, (batch, num_blocks))


def _cached_causal_attention(query, key, value, key_mask, config, dropout: float, scaling: float) -> torch.Tensor:
    """Causal LSG for queries that are the last q of the cached keys (decoding): each gathers its own keys.

    query: (B, q, H, D); key, value: (B, g + T, H, D); key_mask: (B, g + T) bool. Returns (B, q, H, D).
    The keys are those a query at the same position gets from `_block_attention` with ``causal=True``.
    """
    pattern = KeyPattern.of(config, causal=True)
    block, num_global = pattern.block_size, pattern.num_global
    num_queries, num_tokens = query.shape[1], key.shape[1] - num_global
    if num_tokens < num_queries:
        raise ValueError("A cached causal LSG step must not start inside the global tokens: run the prompt first.")
    device = query.device
    positions = torch.arange(num_tokens - num_queries, num_tokens, device=device)  # token position of each query
    block_index = positions // block
    token_keys, token_values = key[:, num_global:], value[:, num_global:]
    token_mask = key_mask[:, num_global:]  # (B, T)

    # Local: the window of the query's block up to the query (indices outside are clamped, then masked).
    local_token = pattern.local_start(block_index)[:, None] + torch.arange(pattern.local_size, device=device)  # (q, 2b)
    local_allowed = (local_token >= 0) & pattern.sees_token(positions[:, None], local_token)
    local_index = local_token.clamp(0, num_tokens - 1)
    keys, values = [_rows(token_keys, local_index)], [_rows(token_values, local_index)]  # (B, q, 2b, H, D)
    masks = [(_rows(token_mask, local_index) & local_allowed)[:, :, None, None, :]]  # (B, q, 1, 1, 2b)

    # Sparse: the compressed positions of the query block's windows. Every sparsity type compresses
    # whole blocks independently, so only the blocks under those windows are compressed, [first,
    # last): O(s f) per step, not the whole history.
    step, factor = pattern.compressed_per_block, config.sparsity_factor
    first_block = (num_tokens - num_queries) // block
    first = max((first_block * step + min(pattern.sparse_starts, default=0)) * factor // block * block, 0)
    last = max((num_tokens - 1) // block * block - block, 0)  # the complete blocks before the last local window
    if pattern.sparse_starts and last > first:
        sparse = _sparse_context(
            query.transpose(1, 2),
            token_keys[:, first:last].transpose(1, 2),
            token_values[:, first:last].transpose(1, 2),
            token_mask[:, first:last],
            config,
            scaling,
        )
        # compressed positions of each window; those before the start are clamped, then masked
        sparse_position = torch.cat(
            [(block_index * step + start)[:, None] + torch.arange(pattern.sparse_size, device=device)
             for start in pattern.sparse_starts],
            dim=1,
        )  # (q, s)
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


def _flex_runs(backend: str | None, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether this call goes through flex attention (`backend`: "sdpa", "flex_attention" or None = automatic)."""
    if backend is None:
        return query.device.type == "cuda" and FLEX_ATTENTION_AVAILABLE
    if backend != "flex_attention":
        return False
    needs_gradients = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    if needs_gradients and query.device.type in FLEX_FORWARD_ONLY_DEVICES:
        logger.warning_once(
            f"flex_attention has no backward pass on {query.device.type}: LSG runs its sdpa backend while gradients "
            "are needed (same results)."
        )
        return False
    return True


def lsg_self_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    config: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    causal: bool = False,
    backend: str | None = "sdpa",
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
        backend: kernel of the token queries: "sdpa" (blocks through SDPA), "flex_attention" (one flex
            attention call; see lsg_flex) or None (flex_attention on CUDA where torch has it, sdpa
            elsewhere). Same keys, same DropKey draws, same results. Short inputs and cached decoding
            steps always run SDPA, and so does flex_attention on CPU while gradients are needed.
    Returns:
        (B, H, q, D), a transposed view of a contiguous (B, q, H, D) tensor.
    """
    batch, heads, length, head_dim = key.shape
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
    pattern = KeyPattern.of(config, causal)
    # Split (not slice) into global tokens and tokens: the backward pass then joins the two gradients
    # with one copy instead of zero-filling two full-size ones and adding them.
    global_queries, token_queries = query.split([num_global, num_tokens], dim=1)
    global_keys, token_keys = key.split([num_global, num_tokens], dim=1)
    global_values, token_values = value.split([num_global, num_tokens], dim=1)
    global_mask, token_mask = key_mask.split([num_global, num_tokens], dim=1)
    if padding:
        token_keys, token_values = (_pad_rows(x, 0, padding) for x in (token_keys, token_values))
        token_mask = F.pad(token_mask, (0, padding), value=False)
    sparse = None
    if pattern.sparse_starts:
        token_heads = (x.transpose(1, 2) for x in (token_queries, token_keys, token_values))  # (B, H, ., D)
        sparse = _sparse_context(*token_heads, token_mask, config, scaling)
    global_tokens = (global_keys, global_values, global_mask)

    if _flex_runs(backend, query, key, value):
        kept = _dropped_block_keys(pattern, token_mask, sparse, global_mask, heads, dropout) if dropout else None
        output, seen = flex_token_attention(
            token_queries, token_keys, token_values, token_mask, global_tokens, sparse, pattern, scaling, kept
        )  # output: (B, t, H, D)
    else:
        block_queries = _pad_rows(token_queries, 0, padding) if padding else token_queries
        output = _block_attention(
            block_queries, token_keys, token_values, token_mask, global_tokens, sparse, pattern, dropout, scaling
        )[:, :num_tokens]  # (B, t, H, D)
        seen = key.transpose(1, 2), value.transpose(1, 2), num_global
    if num_global:
        output = torch.cat([_global_attention(global_queries, key_mask, seen, causal, dropout, scaling), output], dim=1)
    return output.transpose(1, 2)  # (B, H, L, D)


def _global_attention(global_queries, key_mask, seen, causal: bool, dropout: float, scaling: float) -> torch.Tensor:
    """Attention of the g global queries (B, g, H, D): every key (causal: the global tokens before them).

    key_mask: (B, g + t) bool; seen: (keys, values, global_rows), the sequence the backend holds, (B, H, n, D)
    x 2: the g global keys padded to `global_rows` rows, then the t tokens. Dropout is drawn on the g + t
    keys whatever the layout, so every backend hides the same keys. Returns (B, g, H, D).
    """
    keys, values, global_rows = seen
    batch, num_global, heads, _ = global_queries.shape
    if causal:  # the global tokens are a prefix: each sees the ones before it
        keys, values = keys[:, :, :num_global], values[:, :, :num_global]
        allowed = key_mask[:, None, None, :num_global] & _causal(num_global, num_global, key_mask.device)
    else:
        allowed = key_mask[:, None, None, :]  # (B, 1, 1, g + t)
    if dropout:
        allowed = _drop_keys(allowed, (batch, heads), allowed.shape[-1], dropout)
    if keys.shape[2] > allowed.shape[-1]:  # the layout pads the global keys: hide the padding rows
        padding_rows = allowed.new_zeros(*allowed.shape[:-1], global_rows - num_global)
        allowed = torch.cat([allowed[..., :num_global], padding_rows, allowed[..., num_global:]], dim=-1)
    return _sdpa(global_queries.transpose(1, 2), keys, values, allowed, 0.0, scaling).transpose(1, 2)


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
    backend: str | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``"lsg"`` entries of transformers' AttentionInterface (`backend`: see `lsg_self_attention`).

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
    output = lsg_self_attention(
        query, key, value, attention_mask, config, dropout, scaling, causal=causal_lsg, backend=backend
    )
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
    """The ``"lsg"`` entries of transformers' AttentionMaskInterface.

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


def _register_with_transformers() -> None:
    """Register the automatic LSG attention and one per backend, each with the O(n) mask function."""
    AttentionInterface.register(LSG_ATTENTION, lsg_attention_forward)
    AttentionMaskInterface.register(LSG_ATTENTION, lsg_attention_mask)
    for backend in LSG_BACKENDS:
        name = f"{LSG_ATTENTION}_{backend}"
        AttentionInterface.register(name, functools.partial(lsg_attention_forward, backend=backend))
        AttentionMaskInterface.register(name, lsg_attention_mask)


_register_with_transformers()
