"""The sparse context of LSG attention: the token sequence compressed f-fold into sparse keys.

Each compressor (`SPARSE_COMPRESSORS`, one per sparsity type) turns the keys of the (padded) token
sequence, (B, H, T, D), into T / f sparse keys, and compresses any number of per-token columns the
same way: the values, and, where the model has position terms, the token positions and key-side
position rows. Every compressor is linear in those columns, with weights that depend on the keys,
the first query and the mask only, so

* a position compresses to the selected token's (norm, stride, block_stride), the masked mean of its
  window (pooling: the window's centre) or the weighted mean (bos_pooling, lsh), rounded to the
  nearest token: sparse key p of a real token comes from the tokens of block p // (b / f), which
  `KeyPattern.sparse_distances` relies on;
* compressing the identity matrix gives each sparse key's share of every token's value, which the
  eager backend uses to spread a sparse key's weight over the tokens.

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_pattern only.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch
import torch.nn.functional as F

from .lsg_pattern import SparseContext, shape_cached

SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")

Columns = list[torch.Tensor]  # per-token columns, (B, H, T, width) each
Compressed = tuple[torch.Tensor, Columns, torch.Tensor]  # keys (B, H, T / f, D), columns, mask (B, 1 or H, T / f)
# made_once(key, make): what `make()` makes from the token mask alone, made once per forward pass by the first
# layer that asks (`made_once` with `PaddingPlan.memo`); by default, made at every call
MadeOnce = Callable[[Hashable, Callable[[], Any]], Any]


def made_every_time(key: Hashable, make: Callable[[], Any]) -> Any:
    """The `MadeOnce` of a call without a forward pass's memo."""
    return make()


def _gather_tokens(keys, columns: Columns, token_index, selected_mask) -> Compressed:
    """Pick tokens per head. token_index: (B or 1, H, L) positions in the token sequence; selected_mask: the
    token mask at those positions, (B, H, L) (`_selected_mask`)."""
    batch, heads = keys.shape[:2]
    index = token_index.expand(batch, heads, -1).unsqueeze(-1)  # (B, H, L, 1)
    # (B, H, T, width) -> (B, H, L, width) each
    gathered = [x.gather(2, index.expand(-1, -1, -1, x.shape[-1])) for x in (keys, *columns)]
    return gathered[0], gathered[1:], selected_mask


def _selected_mask(mask, token_index) -> torch.Tensor:
    """The token mask (B, T) at the positions `token_index` (B, H, L): (B, H, L)."""
    return mask[:, None, :].expand(-1, token_index.shape[1], -1).gather(2, token_index.expand(mask.shape[0], -1, -1))


def sparse_by_norm(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """In each chunk, keep the chunk / f keys of largest L2 norm (padding has norm 0), in the order topk gives."""
    chunk = settings.selection_chunk
    batch, heads = keys.shape[:2]
    chunk_mask = mask.view(batch, 1, -1, chunk)  # (B, 1, T / chunk, chunk)
    with torch.no_grad():
        key_norms = keys.norm(dim=-1).unflatten(2, (-1, chunk)) * chunk_mask  # (B, H, T / chunk, chunk)
        kept = key_norms.topk(chunk // settings.sparsity_factor, dim=-1, sorted=False).indices  # (B, H, T / chunk, k)
    kept_mask = chunk_mask.expand(-1, heads, -1, -1).gather(3, kept).flatten(2)  # (B, H, T / f)
    # (B, H, T, width) -> (B, H, T / chunk, chunk, width) -> the kept rows, (B, H, T / f, width) each
    chunks = [x.unflatten(2, (-1, chunk)) for x in (keys, *columns)]
    selected = [x.gather(3, kept[..., None].expand(*kept.shape, x.shape[-1])).flatten(2, 3) for x in chunks]
    return selected[0], selected[1:], kept_mask


def sparse_by_pooling(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """Masked mean of each window of f consecutive keys (and columns)."""
    factor = settings.sparsity_factor
    batch, length = mask.shape

    def window_weights():  # of the token mask alone
        window_mask = mask.view(batch, 1, length // factor, factor, 1).to(keys.dtype)
        counts = window_mask.sum(dim=-2)  # (B, 1, T / f, 1)
        return window_mask, counts.clamp(min=1), counts.squeeze(-1) > 0

    window_mask, denominator, pooled_mask = made_once(("pooling weights", keys.dtype), window_weights)

    def pooled(x):  # (B, H, T, width) -> (B, H, T / f, width)
        return (x.unflatten(2, (-1, factor)) * window_mask).sum(dim=-2) / denominator

    return pooled(keys), [pooled(column) for column in columns], pooled_mask


def sparse_by_stride(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """Head j keeps tokens k * f + (j mod f)."""
    token_index = stride_token_index(keys.shape[1], keys.shape[2], settings.sparsity_factor, keys.device)
    selected_mask = made_once(("stride mask", keys.shape[1]), lambda: _selected_mask(mask, token_index))
    return _gather_tokens(keys, columns, token_index, selected_mask)


@shape_cached
def stride_token_index(heads: int, length: int, factor: int, device: torch.device) -> torch.Tensor:
    """(1, H, T / f): the tokens head j keeps, k * f + (j mod f); made once per shape."""
    head_offset = (torch.arange(heads, device=device) % factor).view(1, heads, 1)
    return torch.arange(0, length, factor, device=device).view(1, 1, -1) + head_offset


def sparse_by_block_stride(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """Head j keeps, in every block, the b / f consecutive tokens from offset (j * b / f) mod b."""
    token_index = block_stride_token_index(
        keys.shape[1], keys.shape[2], settings.block_size, settings.sparsity_factor, keys.device
    )
    selected_mask = made_once(("block_stride mask", keys.shape[1]), lambda: _selected_mask(mask, token_index))
    return _gather_tokens(keys, columns, token_index, selected_mask)


@shape_cached
def block_stride_token_index(heads: int, length: int, block: int, factor: int, device: torch.device) -> torch.Tensor:
    """(1, H, T / f): the tokens head j keeps, in every block the b / f from offset (j * b / f) mod b; made
    once per shape."""
    kept = block // factor
    offsets = torch.arange(kept, device=device).view(1, -1) + torch.arange(heads, device=device).view(-1, 1) * kept
    block_start = torch.arange(0, length, block, device=device).view(-1, 1, 1)
    return (offsets % block + block_start).permute(1, 0, 2).reshape(1, heads, -1)


def sparse_by_bos_pooling(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """In each window of f tokens, mean weighted by softmax(q_first . k * scaling), q_first = first real token.

    A window of padding only is masked (the 2023 reference left it unmasked, so its rows depended on
    the padding after them: see the README's compatibility notes)."""
    factor = settings.sparsity_factor
    window_keys = keys.unflatten(2, (-1, factor))  # (B, H, T / f, f, D)
    window_mask = mask.view(mask.shape[0], 1, -1, factor)
    hidden, window_valid = made_once("bos_pooling masks", lambda: (~window_mask, window_mask.any(dim=-1)))
    first_query = queries[:, :, :1, None, :]  # (B, H, 1, 1, D)
    scores = (window_keys * first_query).sum(dim=-1) * scaling  # (B, H, T / f, f)
    scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1).unsqueeze(-1)

    def weighted(x):  # (B, H, T, width) -> (B, H, T / f, width)
        return (weights * x.unflatten(2, (-1, factor))).sum(dim=-2)

    return weighted(keys), [weighted(column) for column in columns], window_valid


def lsh_hyperplanes(
    shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """Random hyperplanes drawn on the CPU from `generator` (a CPU generator), then moved to `device`:
    a CUDA generator draws other numbers for the same seed, so every device gets the same buckets."""
    return torch.randn(shape, generator=generator, dtype=dtype).to(device)


def _lsh_round(keys, columns: Columns, weights, buckets: int, generator: torch.Generator):
    """Hash each chunk's items with random hyperplanes into `buckets` buckets and sum each bucket.

    keys: (B, H, C, items, D); columns: (B, H, C, items, width) each; weights: (B, H, C, items, 1)
    token counts (0 = padding).
    """
    heads, head_dim = keys.shape[1], keys.shape[-1]
    with torch.no_grad():
        if buckets > 1:
            planes = lsh_hyperplanes((1, heads, 1, head_dim, buckets // 2), generator, keys.dtype, keys.device)
            projections = (F.normalize(keys, dim=-1) * weights.clamp(0, 1)) @ planes
            bucket = torch.cat([projections, -projections], dim=-1).argmax(dim=-1, keepdim=True)
        else:
            bucket = torch.zeros_like(weights, dtype=torch.long)

    # one-hot membership (B, H, C, buckets, items): a bucket's sum is a matrix product, the same on every
    # run (CUDA's scatter_add adds in a varying order, and in half precision its sums, then the next
    # round's buckets, change from run to run)
    membership = F.one_hot(bucket.squeeze(-1), buckets).transpose(-1, -2).to(keys.dtype)

    def bucket_sums(x):  # (B, H, C, items, width) -> (B, H, C, buckets, width)
        return membership.to(x.dtype) @ x  # a no-op conversion unless x is another dtype (float32 positions)

    return bucket_sums(keys), [bucket_sums(column) for column in columns], bucket_sums(weights)


def sparse_by_lsh(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """Average keys that hash together: chunks of min(b, s), pre-rounds into `chunk` buckets, then chunk / f."""
    chunk = settings.selection_chunk
    batch, heads = keys.shape[:2]
    weights = mask.view(batch, 1, -1, chunk, 1).to(keys.dtype).expand(-1, heads, -1, -1, -1)
    chunk_keys = keys.unflatten(2, (-1, chunk)) * weights  # (B, H, T / chunk, chunk, D)
    chunk_columns = [column.unflatten(2, (-1, chunk)) * weights for column in columns]
    generator = torch.Generator().manual_seed(settings.lsh_seed)
    for _ in range(settings.lsh_num_pre_rounds):
        chunk_keys, chunk_columns, weights = _lsh_round(chunk_keys, chunk_columns, weights, chunk, generator)
    buckets = chunk // settings.sparsity_factor
    chunk_keys, chunk_columns, weights = _lsh_round(chunk_keys, chunk_columns, weights, buckets, generator)
    # bucket means; an empty bucket (weight 0) keeps its zero sum instead of 0 / 0
    counts = weights.clamp(min=1)
    return (
        (chunk_keys / counts).flatten(2, 3),
        [(column / counts).flatten(2, 3) for column in chunk_columns],
        (weights > 0).view(batch, heads, -1),
    )


def sparse_every_token(
    queries, keys, columns: Columns, mask, settings, scaling, made_once: MadeOnce = made_every_time
) -> Compressed:
    """sparsity_factor == 1: every token is a sparse token."""
    return keys, list(columns), mask[:, None, :]


# The compressors whose mask depends on the keys, not on the token mask alone: norm keeps the keys of largest
# norm (padding among them where a chunk holds fewer real tokens than it keeps), lsh's buckets may be empty
MASK_READS_KEYS = (sparse_by_norm, sparse_by_lsh)

SPARSE_COMPRESSORS: dict[str, Callable[..., Compressed]] = {
    "norm": sparse_by_norm,
    "pooling": sparse_by_pooling,
    "stride": sparse_by_stride,
    "block_stride": sparse_by_block_stride,
    "bos_pooling": sparse_by_bos_pooling,
    "lsh": sparse_by_lsh,
}


def sparse_context(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    settings: Any,
    scaling: float,
    key_rows: torch.Tensor | None = None,
    with_positions: bool = False,
    with_token_weights: bool = False,
    every_token_valid: bool = False,
    made_once: MadeOnce = made_every_time,
) -> SparseContext:
    """The sparse context of the tokens: queries, keys, values (B, H, T, D), mask (B, T) bool, compressed as
    the model's settings say (`settings`: its `lsg_settings.LSGSettings`).

    Compressed with the keys: key_rows (B, H, T, R), the key-side position rows, where given; the token
    positions with `with_positions`; the identity (each sparse key's share of every token's value,
    `SparseContext.token_weights`) with `with_token_weights`. `every_token_valid`: the caller knows,
    without reading `mask`, that it masks no token; every compressed key is then valid too
    (`SparseContext.every_key_valid`), except with lsh, whose empty buckets are masked. The mask of the
    compressed keys is made from `mask` alone, except with norm and lsh (`MASK_READS_KEYS`); what the
    compressors make from `mask` alone goes through `made_once` (the forward pass's memo,
    `made_once` with `PaddingPlan.memo`: made by its first layer).
    """
    compress = sparse_every_token if settings.sparsity_factor == 1 else SPARSE_COMPRESSORS[settings.sparsity_type]
    batch, heads, length, _ = keys.shape
    columns = {"values": values}
    if with_positions:  # in float32: exact for every position a model reads
        positions = torch.arange(length, dtype=torch.float32, device=keys.device)
        columns["positions"] = positions.view(1, 1, length, 1).expand(batch, heads, -1, -1)
    if key_rows is not None:
        columns["key_rows"] = key_rows
    if with_token_weights:
        columns["token_weights"] = torch.eye(length, dtype=values.dtype, device=keys.device).expand(batch, heads, -1, -1)
    sparse_keys, compressed, sparse_mask = compress(queries, keys, list(columns.values()), mask, settings, scaling, made_once)
    compressed = dict(zip(columns, compressed))
    positions = compressed.get("positions")
    every_key_valid = every_token_valid and compress is not sparse_by_lsh
    return SparseContext(
        keys=sparse_keys,
        values=compressed["values"],
        mask=sparse_mask,
        positions=None if positions is None else torch.floor(positions.squeeze(-1) + 0.5).long(),
        key_rows=compressed.get("key_rows"),
        token_weights=compressed.get("token_weights"),
        every_key_valid=every_key_valid,
        mask_of_tokens_alone=every_key_valid or compress not in MASK_READS_KEYS,
    )
