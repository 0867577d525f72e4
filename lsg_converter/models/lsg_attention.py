"""LSG attention: Local + Sparse + Global (Condevaux & Harispe, PAKDD 2023), the one shared core.

The attention itself, in pure torch (`lsg_self_attention`), registered with transformers as the
attention implementations ``"lsg_eager"``, ``"lsg_sdpa"`` and ``"lsg_flex_attention"``. Models choose
one the transformers way, ``attn_implementation="eager"``, ``"sdpa"`` or ``"flex_attention"`` (see
`lsg_backend`); their self-attention layers then dispatch to the registered LSG function of that
backend (see lsg_model.AttentionLayerConfig) and receive the O(n) ``(batch, length)`` padding mask.

The sequence seen by every layer is ``g`` global tokens followed by ``t`` real tokens. Each block of
``b`` query tokens attends to

    bidirectional:  [ g global keys | s sparse keys left | s sparse keys right | 3b local keys ]
    causal:         [ g global keys | s sparse keys left | 2b local keys, up to the query itself ]

where the local keys are the previous, own (and next) blocks and the sparse keys are a compressed
copy of the context just outside the local window (see `SPARSE_COMPRESSORS`). Global queries attend
to everything (causal: to the global tokens before them). `KeyPattern` describes these keys once;
three backends compute the token queries from it:

* ``"sdpa"``: blocks batched through `scaled_dot_product_attention` on 4D tensors, so its fused
  kernels run forward and backward (the default without CUDA);
* ``"flex_attention"``: one `flex_attention` call over a block-sparse mask (lsg_flex; the default
  where CUDA is available);
* ``"eager"``: the blocks of the sdpa backend with an explicit softmax, whose weights are spread
  over a ``(t, t)`` matrix per head and returned (``output_attentions=True``): O(n^2) memory, for
  inspection (lsg_eager).

In training, attention dropout is DropKey (keys hidden before the softmax, see `_drop_keys`), which
keeps the kernels fused; every backend hides the same keys for the same random state. No tensor of
size ``t x t`` is ever built (except by the eager backend, and by flex_attention run uncompiled,
off CUDA).

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
from transformers.utils import logging

from .lsg_eager import global_state_cross_attention, token_weights, weighted_values
from .lsg_flex import FLEX_ATTENTION_AVAILABLE, FLEX_FORWARD_ONLY_DEVICES, flex_token_attention

logger = logging.get_logger(__name__)

LSG_ATTENTION = "lsg"  # prefix of the attentions registered with transformers, one per backend
# attn_implementation values an LSG model accepts: the kernel of its token queries. Each is registered
# with transformers as f"{LSG_ATTENTION}_{backend}".
LSG_BACKENDS = ("eager", "sdpa", "flex_attention")
SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")


def default_backend() -> str:
    """The backend of a model whose attn_implementation is left unset: flex_attention where CUDA is
    available and torch has it, sdpa elsewhere."""
    return "flex_attention" if FLEX_ATTENTION_AVAILABLE and torch.cuda.is_available() else "sdpa"


def lsg_backend(attn_implementation: str | None) -> str:
    """The backend an LSG model runs for `attn_implementation`: a value of `LSG_BACKENDS` is itself,
    None is `default_backend()`; anything else raises ValueError naming the valid values."""
    if attn_implementation is None:
        return default_backend()
    if attn_implementation not in LSG_BACKENDS:
        choices = ", ".join(f'"{name}"' for name in LSG_BACKENDS)
        raise ValueError(
            f'Specified `attn_implementation="{attn_implementation}"` is not supported by LSG models: use one of '
            f"{choices}, or leave it unset (flex_attention where CUDA is available, sdpa elsewhere)."
        )
    if attn_implementation == "flex_attention" and not FLEX_ATTENTION_AVAILABLE:
        raise ValueError(
            f"attn_implementation='flex_attention' needs torch >= 2.5.1 (installed: {torch.__version__}): "
            "upgrade torch or use attn_implementation='sdpa'."
        )
    return attn_implementation


def registered_attention(backend: str) -> str:
    """The name under which the LSG attention of `backend` is registered with transformers."""
    return f"{LSG_ATTENTION}_{backend}"


def registered_cross_attention(backend: str) -> str:
    """The name under which `global_state_cross_attention` of `backend` is registered with transformers."""
    return f"{LSG_ATTENTION}_cross_{backend}"


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
    values: torch.Tensor  # (B, H, T / f, D'), D' the width of the values given (T for the eager backend)
    mask: torch.Tensor  # (B, 1 or H, T / f) bool, True = may be attended


# Every compressor is linear in the values, with weights that depend on the keys, queries and mask only:
# compressing the identity matrix as values gives the weight of each token in each sparse value
# (the eager backend spreads the sparse keys' attention over the tokens that way).


def _selection_chunk(config: Any) -> int:
    """Chunk in which norm and lsh select/hash: min(b, s), or b where that would not tile the blocks."""
    chunk = min(config.block_size, config.sparse_block_size)
    if config.block_size % chunk or chunk % config.sparsity_factor:
        return config.block_size
    return chunk


def _gather_tokens(keys, values, mask, token_index) -> SparseContext:
    """Pick tokens per head. token_index: (B or 1, H, L) positions in the token sequence."""
    batch, heads = keys.shape[:2]
    token_index = token_index.expand(batch, heads, -1)

    def rows(x):  # (B, H, T, width) -> (B, H, L, width)
        return x.gather(2, token_index.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))

    selected_mask = mask[:, None, :].expand(-1, heads, -1).gather(2, token_index)
    return SparseContext(rows(keys), rows(values), selected_mask)


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
    batch, length = mask.shape
    window_mask = mask.view(batch, 1, length // factor, factor, 1).to(keys.dtype)
    counts = window_mask.sum(dim=-2)  # (B, 1, T / f, 1)
    denominator = counts.clamp(min=1)
    pooled_keys = (keys.unflatten(2, (-1, factor)) * window_mask).sum(dim=-2) / denominator
    pooled_values = (values.unflatten(2, (-1, factor)) * window_mask).sum(dim=-2) / denominator
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
    window_keys = keys.unflatten(2, (-1, factor))  # (B, H, T / f, f, D)
    window_values = values.unflatten(2, (-1, factor))
    window_mask = mask.view(mask.shape[0], 1, -1, factor)
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

    keys: (B, H, C, items, D); values: (B, H, C, items, D'); weights: (B, H, C, items, 1) token counts
    (0 = padding).
    """
    batch, heads, chunks, _, head_dim = keys.shape
    with torch.no_grad():
        if buckets > 1:
            planes = lsh_hyperplanes((1, heads, 1, head_dim, buckets // 2), generator, keys.dtype, keys.device)
            projections = (F.normalize(keys, dim=-1) * weights.clamp(0, 1)) @ planes
            bucket = torch.cat([projections, -projections], dim=-1).argmax(dim=-1, keepdim=True)
        else:
            bucket = torch.zeros_like(weights, dtype=torch.long)

    def bucket_sums(x):  # (B, H, C, items, width) -> (B, H, C, buckets, width)
        width = x.shape[-1]
        return x.new_zeros(batch, heads, chunks, buckets, width).scatter_add(-2, bucket.expand(-1, -1, -1, -1, width), x)

    return bucket_sums(keys), bucket_sums(values), bucket_sums(weights)


def sparse_by_lsh(queries, keys, values, mask, config, scaling) -> SparseContext:
    """Average keys that hash together: chunks of min(b, s), pre-rounds into `chunk` buckets, then chunk / f."""
    chunk = _selection_chunk(config)
    batch, heads = keys.shape[:2]
    weights = mask.view(batch, 1, -1, chunk, 1).to(keys.dtype).expand(-1, heads, -1, -1, -1)
    chunk_keys = keys.unflatten(2, (-1, chunk)) * weights  # (B, H, T / chunk, chunk, D)
    chunk_values = values.unflatten(2, (-1, chunk)) * weights
    generator = torch.Generator().manual_seed(config.lsh_seed)
    for _ in range(config.lsh_num_pre_rounds):
        chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, chunk, generator)
    buckets = chunk // config.sparsity_factor
    chunk_keys, chunk_values, weights = _lsh_round(chunk_keys, chunk_values, weights, buckets, generator)
    # bucket means; an empty bucket (weight 0) keeps its zero sum instead of 0 / 0
    counts = weights.clamp(min=1)
    chunk_keys, chunk_values = chunk_keys / counts, chunk_values / counts
    return SparseContext(
        chunk_keys.flatten(2, 3),
        chunk_values.flatten(2, 3),
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
    """Which keys each token query sees: the one description every kernel derives its masks from.

    Positions count tokens from the first real token (the global tokens are apart); query block i is
    tokens [i b, (i + 1) b); compressed position p is the p-th key of the sparse context. Block i sees

    * every global token;
    * the local tokens [(i - blocks_before) b, (i + 1 + blocks_after) b), causal: up to the query;
    * per sparse window, the compressed positions [i c + start, i c + start + sparse_size), with
      c = `compressed_per_block` and start = `sparse_left_start`, then `sparse_right_start`.

    The SDPA path turns this into views of block windows (`_local_windows`, `_sparse_windows`), the
    flex path (lsg_flex) into a mask_mod over element positions (`sees_token`, `sees_compressed`) and
    the block structure of a BlockMask; a block's keys come in the order [globals | sparse windows |
    local] (`key_columns`, and its inverses `local_slot`, `sparse_slot`).
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

    def key_columns(self, block_index: torch.Tensor, num_tokens: int, num_compressed: int) -> torch.Tensor:
        """Where each key of the blocks `block_index` (n,) lies in the sequence [g globals | num_tokens
        tokens | num_compressed compressed keys]: (n, keys per block), in the blocks' key order. Keys
        outside the sequence (the zero padding of the windows) get the column after the last one."""
        device = block_index.device
        outside = self.num_global + num_tokens + num_compressed
        block_index = block_index[:, None]
        columns = [torch.arange(self.num_global, device=device).expand(len(block_index), -1)]
        for start in self.sparse_starts:
            position = block_index * self.compressed_per_block + start + torch.arange(self.sparse_size, device=device)
            inside = (position >= 0) & (position < num_compressed)
            columns.append(torch.where(inside, self.num_global + num_tokens + position, outside))
        token = self.local_start(block_index) + torch.arange(self.local_size, device=device)
        columns.append(torch.where((token >= 0) & (token < num_tokens), self.num_global + token, outside))
        return torch.cat(columns, dim=1)

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


def _attention_weights(query, key, allowed: torch.Tensor, dropout: float, scaling: float) -> torch.Tensor:
    """The softmax that `_sdpa` fuses, made explicit (same DropKey draws): (..., H, q, k) weights.

    The softmax runs in float32 at least (half precision inputs too), as transformers' eager attention does."""
    if dropout:
        allowed = _drop_keys(allowed, query.shape[:-2], key.shape[-2], dropout)
    scores = (query @ key.transpose(-1, -2)) * scaling + _additive_mask(allowed, query.dtype)
    return scores.softmax(dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)


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


def _attend(queries, keys, values, masks, dropout: float, scaling: float, explicit: bool = False) -> torch.Tensor:
    """Each group of query rows attends to its own keys, through SDPA on 4D tensors.

    queries: (B, n, rows, H, D); keys, values: lists of (B, n, K_i, H, D) pieces (views where they
    can be), concatenated here: the one copy; masks: list of (B, n, 1 or H, 1 or rows, K_i) bool.
    Returns (B, n * rows, H, D); with `explicit`, the attention weights (B, n, H, rows, K) instead.
    """
    batch, groups, rows, heads, head_dim = queries.shape
    allowed = _joined_masks(masks)

    def fold(x):  # (B, n, K, H, D) -> (B * n, H, K, D), a view: SDPA's fused kernels take 4D inputs
        return x.flatten(0, 1).transpose(1, 2)

    block_keys = torch.cat(keys, dim=2)  # (B, n, K, H, D)
    if explicit:
        weights = _attention_weights(fold(queries), fold(block_keys), allowed.flatten(0, 1), dropout, scaling)
        return weights.unflatten(0, (batch, groups))
    block_values = torch.cat(values, dim=2)
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
    queries,
    keys,
    values,
    mask,
    global_tokens,
    sparse: SparseContext | None,
    pattern: KeyPattern,
    dropout,
    scaling,
    explicit: bool = False,
) -> torch.Tensor:
    """Attention of the token queries, block by block, through SDPA (the ``"sdpa"`` backend).

    queries, keys, values: (B, T, H, D) tokens, T a multiple of b; mask: (B, T) bool.
    global_tokens: (keys, values, mask) of the g global tokens, (B, g, H, D) x 2 and (B, g).
    Returns (B, T, H, D); with `explicit` (the ``"eager"`` backend), each block's weights over its
    keys instead, (B, nb, H, b, K) in the order of `KeyPattern.key_columns`.
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
    return _attend(blocked_queries, block_keys, block_values, masks, dropout, scaling, explicit)


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


def _flex_runs(backend: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether this call goes through flex attention (`backend`: one of `LSG_BACKENDS`)."""
    if backend != "flex_attention":
        return False
    needs_gradients = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    if needs_gradients and query.device.type in FLEX_FORWARD_ONLY_DEVICES:
        logger.warning_once(
            f"flex_attention has no backward pass on {query.device.type}: LSG runs its sdpa backend while gradients "
            "are needed (same results)."
        )
        return False
    if query.device.type != "cuda":
        logger.warning_once(
            f"flex_attention runs uncompiled on {query.device.type} and computes every score (O(n^2) memory): "
            "use attn_implementation='sdpa' off CUDA."
        )
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
    backend: str = "sdpa",
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
            attention call; see lsg_flex) or "eager" (explicit weights, see `lsg_self_attention_weights`).
            Same keys, same DropKey draws, same results. Short inputs and cached decoding steps run
            SDPA on the flex backend, and so does flex_attention on CPU while gradients are needed.
    Returns:
        (B, H, q, D), a transposed view of a contiguous (B, q, H, D) tensor.
    """
    if backend == "eager":
        return lsg_self_attention_weights(query, key, value, padding_mask, config, dropout, scaling, causal)[0]
    return _lsg_attention(query, key, value, padding_mask, config, dropout, scaling, causal, backend)


def lsg_self_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    config: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LSG attention with its weights (the ``"eager"`` backend): what ``output_attentions=True`` returns.

    Arguments as for `lsg_self_attention`. Returns the output (B, H, q, D) and the weights of the
    token queries over the tokens, (B, H, q', t) with q' = q - g (the global queries and keys left
    out, as the model's outputs leave out the global tokens): zero outside the LSG pattern, and a
    sparse key's weight spread over the tokens it compresses, in the proportions it takes their
    values (see `lsg_eager.token_weights`). The output is computed from these weights, ``weights @ values``
    (the global tokens' share included), so gradients flow through them.

    Memory is O(n^2): a (B, H, g + t, g + t) matrix per layer, and the composition of the sparse keys
    (B, H, t / f, t). For inspection and short inputs; train and serve with "sdpa" or "flex_attention".
    """
    batch, heads, length, head_dim = key.shape
    num_queries = query.shape[2]
    if num_queries < length and causal:  # cached decoding step: the last rows of the whole causal pattern
        missing_queries = query.new_zeros(batch, heads, length - num_queries, head_dim)
        query = torch.cat([missing_queries, query], dim=2)
        output, weights = _lsg_attention(query, key, value, padding_mask, config, dropout, scaling, causal, "eager")
        return output[:, :, -num_queries:], weights[:, :, -num_queries:]
    return _lsg_attention(query, key, value, padding_mask, config, dropout, scaling, causal, "eager")


def _lsg_attention(query, key, value, padding_mask, config, dropout, scaling, causal, backend):
    """`lsg_self_attention`; with the "eager" backend, `lsg_self_attention_weights` (whole sequences)."""
    batch, heads, length, head_dim = key.shape
    scaling = head_dim**-0.5 if scaling is None else scaling
    explicit = backend == "eager"
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
        if explicit:
            return weighted_values(_attention_weights(query, key, allowed, dropout, scaling), value, num_global)
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
        token_heads = [x.transpose(1, 2) for x in (token_queries, token_keys, token_values)]  # (B, H, ., D)
        if explicit:  # compress the identity: the sparse "values" are then each sparse key's token weights
            padded_tokens = token_keys.shape[1]
            token_heads[2] = torch.eye(padded_tokens, dtype=query.dtype, device=query.device).expand(
                batch, heads, -1, -1
            )
        sparse = _sparse_context(*token_heads, token_mask, config, scaling)
    global_tokens = (global_keys, global_values, global_mask)
    block_queries = _pad_rows(token_queries, 0, padding) if padding else token_queries

    if explicit:
        block_weights = _block_attention(
            block_queries, token_keys, token_values, token_mask, global_tokens, sparse, pattern, dropout, scaling,
            explicit=True,
        )  # (B, nb, H, b, K)
        weights = token_weights(pattern, block_weights, sparse, num_tokens)  # (B, H, t, g + t)
        if num_global:
            seen = key.transpose(1, 2), value.transpose(1, 2), num_global
            global_weights = _global_attention(global_queries, key_mask, seen, causal, dropout, scaling, explicit=True)
            weights = torch.cat([global_weights, weights], dim=2)
        return weighted_values(weights, value.transpose(1, 2), num_global)

    if _flex_runs(backend, query, key, value):
        kept = _dropped_block_keys(pattern, token_mask, sparse, global_mask, heads, dropout) if dropout else None
        output, seen = flex_token_attention(
            token_queries, token_keys, token_values, token_mask, global_tokens, sparse, pattern, scaling, kept
        )  # output: (B, t, H, D)
    else:
        output = _block_attention(
            block_queries, token_keys, token_values, token_mask, global_tokens, sparse, pattern, dropout, scaling
        )[:, :num_tokens]  # (B, t, H, D)
        seen = key.transpose(1, 2), value.transpose(1, 2), num_global
    if num_global:
        output = torch.cat([_global_attention(global_queries, key_mask, seen, causal, dropout, scaling), output], dim=1)
    return output.transpose(1, 2)  # (B, H, L, D)


def _global_attention(
    global_queries, key_mask, seen, causal: bool, dropout: float, scaling: float, explicit: bool = False
) -> torch.Tensor:
    """Attention of the g global queries (B, g, H, D): every key (causal: the global tokens before them).

    key_mask: (B, g + t) bool; seen: (keys, values, global_rows), the sequence the backend holds, (B, H, n, D)
    x 2: the g global keys padded to `global_rows` rows, then the t tokens. Dropout is drawn on the g + t
    keys whatever the layout, so every backend hides the same keys. Returns (B, g, H, D); with
    `explicit`, the weights (B, H, g, g + t) instead (zero on the tokens when causal).
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
    if explicit:
        weights = _attention_weights(global_queries.transpose(1, 2), keys, allowed, 0.0, scaling)
        return F.pad(weights, (0, key_mask.shape[1] - weights.shape[-1]))
    if keys.shape[2] > allowed.shape[-1]:  # the layout pads the global keys: hide the padding rows
        padding_rows = allowed.new_zeros(*allowed.shape[:-1], global_rows - num_global)
        allowed = torch.cat([allowed[..., :num_global], padding_rows, allowed[..., num_global:]], dim=-1)
    return _sdpa(global_queries.transpose(1, 2), keys, values, allowed, 0.0, scaling).transpose(1, 2)


def _padding_mask(attention_mask: torch.Tensor | None, num_keys: int, config: Any) -> torch.Tensor | None:
    """The mask a model hands its LSG layers -> (B, g + t) bool, True for the keys that may be attended.

    It arrives as the user's (B, t) mask, 2D or as the (B, 1, 1, t) view the model passes through
    transformers' mask creation (see lsg_model.padding_mask_view); the model prepended g global tokens
    after it was made. A cached decoding step's mask already counts the global tokens (t = g + past + q).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1):
        attention_mask = attention_mask[:, 0, 0]
    if attention_mask.dim() != 2:
        raise ValueError(
            f"LSG attention takes a (batch, length) padding mask, got one of shape {tuple(attention_mask.shape)}: "
            "pass attention_mask as a 2D tensor of 1s (tokens) and 0s (padding)."
        )
    missing = num_keys - attention_mask.shape[-1]
    if missing not in (0, config.num_global_tokens):
        raise ValueError(
            f"attention_mask has {attention_mask.shape[-1]} columns for {num_keys - config.num_global_tokens} tokens: "
            "give exactly one column per input token."
        )
    return F.pad(attention_mask.bool(), (missing, 0), value=True)


def lsg_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    backend: str = "sdpa",
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``"lsg_<backend>"`` entries of transformers' AttentionInterface: the self-attention of the
    LSG layers, bidirectional in encoders, causal in decoder-only models (``config.is_decoder``, e.g.
    BertLMHeadModel). Returns (output (B, N, H, D), weights): the token weights (B, H, q, t) of
    `lsg_self_attention_weights` with the "eager" backend, None with the others.
    """
    config = module.config
    padding_mask = _padding_mask(attention_mask, key.shape[2], config)
    causal = bool(getattr(config, "is_decoder", False) and getattr(module, "is_causal", False))
    if backend == "eager":
        output, weights = lsg_self_attention_weights(query, key, value, padding_mask, config, dropout, scaling, causal)
    else:
        if kwargs.get("output_attentions"):
            logger.warning_once(
                f"LSG attention returns no attention weights with attn_implementation={backend!r}: call "
                "model.set_attn_implementation('eager') for output_attentions=True (O(n^2) memory)."
            )
        output = _lsg_attention(query, key, value, padding_mask, config, dropout, scaling, causal, backend)
        weights = None
    return output.transpose(1, 2).contiguous(), weights


def _register_with_transformers() -> None:
    """Register the LSG attention and the global-state cross-attention of every backend."""
    for backend in LSG_BACKENDS:
        AttentionInterface.register(registered_attention(backend), functools.partial(lsg_attention_forward, backend=backend))
        AttentionInterface.register(
            registered_cross_attention(backend), functools.partial(global_state_cross_attention, backend=backend)
        )


_register_with_transformers()
