"""The ``flex_attention`` backend of LSG attention: every token query in one `flex_attention` call.

One layout (`KeyLayout`): the layer's own g + t queries and keys, read where they lie; with sparse keys,
their T / f compressed keys after them, from the next whole tile on (one copy of the keys and values).
A BlockMask says which tiles of the keys each tile of queries reads; its mask_mod says, key by key, what
a query sees (`lsg_mask_mod`): the rule of `lsg_pattern.KeyPattern` (global keys, local tokens, sparse
windows), and, as optional terms, which keys are valid and which DropKey keeps:

* Validity (`key_validity`): none read where no key is masked (no padding mask; with sparse keys, the
  tokens filling whole blocks and a compressor that leaves no key empty: `SparseContext.every_key_valid`);
  the rows' bounds where each row's valid keys are one run (padding at the end or the start of a row, as
  tokenizers give it: `RowBounds`, a few numbers per row, never a tensor per key, which a mask_mod reads
  far slower on CUDA: docs/benchmarks.md, "lsg_flex.RowBounds"); else each key's validity, (B, H, length)
  (holes in a row's mask, or a compiled graph, which cannot check the runs on the host).
* DropKey: its choice, drawn once by the core (`TokenAttention.kept`, the same for every backend).
* The tile structure is built by index arithmetic, never by evaluating the mask on every element.
  It depends on the pattern and the length only (`block_structure`, cached, shared by every layer and
  call), except for a padded batch without sparse keys whose rows' bounds are known: there each row has
  its own, made once per forward pass (`tile_structure` with the bounds: no tile of the row's padding keys, none for
  its blocks of padding only). Where the mask_mod is the pattern's rule, the key tiles every query of a
  tile sees whole are full tiles, which the kernel reads without evaluating it. What else changes from
  call to call (padding, sparse selection, dropout) reaches the kernel through tensors read by the
  mask_mod: a new padding never recompiles.
* `flex_attention` runs compiled, on CUDA and on the CPU alike (uncompiled it would materialise
  every score). One compiled kernel per `KernelSignature` (the pattern, the score_mod's terms,
  dropout, the validity read, training or inference, device, dtype), compiled once per process: the
  first length static, the next ones through one dynamic-shape graph (`MAX_COMPILES`). Where compiling
  fails or a call would need more compiles than that, the call runs the sdpa backend
  (`BackendUnavailable`), never uncompiled flex.

Position terms (`lsg_pattern.PositionTerms`) enter as a score_mod: each key of the sequence carries
its position (and key-side rows), the query's position is its index.

The global queries see every key: the core runs their few rows through SDPA over the layer's keys
(`TokenAttention.global_output`); inside the flex mask one thread block would carry the whole sequence.
The kernel's global query rows see no key; where no block holds padding only, the global queries' output
is written into them (`GlobalRowsWritten`). Where flex cannot run (gradients on a device without its
backward pass), the core runs the sdpa backend instead (`lsg_attention.choose_path`), and likewise for a
call compiled flex cannot take (`BackendUnavailable`).

This file travels with saved models as remote code: it imports torch, transformers and, of this folder,
lsg_pattern and lsg_transformers only.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from types import FunctionType
from typing import Callable

import torch
from transformers.utils import logging

from .lsg_pattern import (
    BackendUnavailable,
    KeyPattern,
    PositionTerms,
    TokenAttention,
    TokenOutput,
    sdpa_dense_attention,
    sequence_positions,
    shape_cached,
    tracing,
)
from .lsg_transformers import compile_error, inductor_compile, is_torch_flex_attn_available, unchanged_version

logger = logging.get_logger(__name__)

# torch >= 2.6: flex_attention, and torch.compiler.set_stance (how CompiledFlexAttention keeps its budget)
FLEX_ATTENTION_AVAILABLE = is_torch_flex_attn_available() and hasattr(torch.compiler, "set_stance")
if FLEX_ATTENTION_AVAILABLE:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

FLEX_FORWARD_ONLY_DEVICES = ("cpu", "mps")  # flex_attention has no backward pass on these
TILE = 128  # rows of a BlockMask tile, for queries and keys alike (flex_attention's default)
MAX_COMPILES = 2  # per kernel signature: the first length static, then one graph for every length


@dataclass(frozen=True)
class KeyLayout:
    """Where each kind of key sits in the flex key sequence: the layer's own g globals and t tokens, rows
    [0, token_end), then, with sparse keys, their rows [sparse_offset, sparse_end), from the next whole
    tile on, zero padding before and after them up to whole tiles. The queries are the layer's own g + t
    rows: token q at row g + q (`token_offset`)."""

    token_offset: int  # g: the row of token 0, as a key and as a query
    token_end: int  # g + t
    sparse_offset: int
    sparse_end: int
    length: int

    @classmethod
    def of(cls, pattern: KeyPattern, num_tokens: int, tile: int) -> KeyLayout:
        """The layout of a layer of `num_tokens` tokens (t), the sparse segment padded to `tile` rows."""
        num_global, end = pattern.num_global, pattern.num_global + num_tokens
        if not pattern.sparse_starts:
            return cls(num_global, end, end, end, end)
        compressed = -(-num_tokens // pattern.block_size) * pattern.compressed_per_block  # of the blocks, rounded up
        sparse_offset = -(-end // tile) * tile
        return cls(num_global, end, sparse_offset, sparse_offset + compressed, sparse_offset + -(-compressed // tile) * tile)


def tile_structure(
    pattern: KeyPattern, num_tokens: int, tile: int, device: torch.device, rule_only: bool = False,
    token_bounds: torch.Tensor | None = None,
) -> BlockMask:  # fmt: skip
    """The key tiles each tile of the layer's g + t queries reads over `KeyLayout.of` (a global query row sees
    no key: a tile of them only reads none), as a BlockMask (its mask_mod unset): R = 1 structure or, with
    `token_bounds` (B, 2), each row's valid tokens [first, end) in a padded batch without sparse keys
    (`RowBounds.tokens`), one per row: no tile of the row's padding keys, no query tile of its blocks of
    padding only (their rows get zeros). The tiles whose mask_mod the kernel evaluates and, where the
    mask_mod is the pattern's rule alone (`rule_only`: every key valid, the sparse ones too, or valid within
    the rows' bounds), apart from them the full tiles, every query of which sees every key (inside the part
    of a window, global, sparse or local, that all the tile's blocks share), which the kernel reads without
    evaluating the mask_mod. Without `token_bounds`, made once per shape (`block_structure`); with them,
    once per forward pass.

    Index arithmetic on the pattern, on `device`: per query tile, the range of keys of each window of
    `KeyPattern.key_windows` its blocks see, then the tiles those ranges touch: (R, nq, nk) booleans
    (inside a compiled graph, device ops that CUDA graphs can capture)."""
    block = pattern.block_size
    layout = KeyLayout.of(pattern, num_tokens, tile)
    query_rows = layout.token_end
    first_row = torch.arange(0, query_rows, tile, device=device)  # (nq,) first query row of each tile
    last_query = (first_row + tile).clamp(max=query_rows) - 1 - layout.token_offset  # its last token query
    first_query = (first_row - layout.token_offset).clamp(min=0)
    holds_tokens = last_query >= 0  # a tile of global query rows only reads no key
    # truncating = floor division of these non-negative rows; CPU inductor (torch 2.13) fails on `//` of a clamped
    # arange, and computes `arange // block` wrong past the last whole vector
    first_block = torch.div(first_query, block, rounding_mode="trunc")
    last_block = torch.div(last_query.clamp(min=0), block, rounding_mode="trunc")
    token_first, token_end = (0, num_tokens) if token_bounds is None else token_bounds[:, None].unbind(-1)  # (B, 1) each
    if token_bounds is not None:  # a tile of queries of blocks of padding only reads no key
        holds_tokens = holds_tokens & (last_block >= token_first // block) & (first_block * block < token_end)

    sources = {  # where each source's rows start in the layout, and the rows [first, end) of its valid keys
        "global": (0, 0, pattern.num_global),
        "local": (layout.token_offset, token_first, token_end),
        "sparse": (layout.sparse_offset, 0, layout.sparse_end - layout.sparse_offset),
    }
    tile_start = torch.arange(0, layout.length, tile, device=device)  # (nk,)
    needed = torch.zeros(1, len(first_row), len(tile_start), dtype=torch.bool, device=device)  # (R, nq, nk)
    full = torch.zeros_like(needed)
    only_tokens = first_row >= layout.token_offset  # a tile of token query rows only
    for window in pattern.key_windows():
        offset, valid_first, valid_end = sources[window.source]
        first = window.first + first_block * window.step  # the tile's first block's window starts there
        end = window.first + last_block * window.step + window.width  # and its last block's ends there
        # the part every block of the tile sees: from its last block's start to its first block's end
        shared_first = window.first + last_block * window.step
        shared_end = window.first + first_block * window.step + window.width
        if window.source == "local" and pattern.causal:
            end, shared_end = torch.minimum(end, last_query + 1), torch.minimum(shared_end, first_query + 1)
        first = offset + first.clamp(valid_first, valid_end)
        end = torch.where(holds_tokens, offset + end.clamp(valid_first, valid_end), 0)
        needed = needed | ((first[..., None] < tile_start + tile) & (end[..., None] > tile_start) & (first < end)[..., None])
        if rule_only:
            shared_first, shared_end = (offset + x.clamp(valid_first, valid_end) for x in (shared_first, shared_end))
            inside = (shared_first[..., None] <= tile_start) & (tile_start + tile <= shared_end[..., None])
            full = full | (inside & (only_tokens & holds_tokens)[..., None])
    return BlockMask.from_kv_blocks(
        *tile_lists(needed & ~full),
        *tile_lists(full),
        BLOCK_SIZE=tile,
        seq_lengths=(query_rows, layout.length),
    )


# `tile_structure` without the rows' bounds, made once per shape and shared by every layer and call
block_structure = shape_cached(tile_structure)


def tile_lists(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, nq, nk) bool, the key tiles each query tile reads -> how many, (R, 1, nq) int32, and which,
    those first, (R, 1, nq, nk) int32: a BlockMask's lists."""
    count = tiles.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort((~tiles).to(torch.int32), dim=-1, stable=True).to(torch.int32)
    return count[:, None], indices[:, None]


@dataclass(frozen=True)
class RowBounds:
    """The keys each row of a batch may attend to, where they are one run per row (padding is a run at
    the end or at the start of a row, as tokenizers give it): [first, end) of its tokens, (B, 2), and,
    with sparse keys, of its compressed keys per head, (B, H, 2), int64. A mask_mod reads them as a few
    numbers per row and head, never per key."""

    tokens: torch.Tensor
    sparse: torch.Tensor | None


def _one_run(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., n) bool -> [first, end) of each row's True entries, (..., 2) int64 ([n, 0) for a row without
    any), and whether they are one run, (...) bool."""
    length = valid.shape[-1]
    index = torch.arange(length, device=valid.device)
    first = torch.where(valid, index, length).amin(dim=-1)
    end = torch.where(valid, index + 1, 0).amax(dim=-1)
    return torch.stack([first, end], dim=-1), valid.sum(dim=-1) == (end - first).clamp(min=0)


def key_validity(job: TokenAttention, layout: KeyLayout, traced: bool) -> RowBounds | torch.Tensor | None:
    """Which keys of `job`, laid out as `layout`, the mask_mod reads as valid (`lsg_mask_mod`): None, every
    key (the pattern's rule alone, nothing read); the rows' bounds (`RowBounds`); or each key's validity,
    (B, H, length) bool. `traced`: inside a graph being compiled or exported (`lsg_pattern.tracing`).

    None where the core knows no key is masked (`PaddingPlan.no_masked_keys`) and every sparse key is valid
    (none, or `SparseContext.every_key_valid`). Else, where every global key is valid and each row's valid
    tokens (and, per head, its valid compressed keys) are one run, their bounds: checked on the host, the
    tokens once per forward pass (in `PaddingPlan.memo`), the compressed keys once per forward pass where
    their mask is made from the token mask alone (`SparseContext.mask_of_tokens_alone`), else in each layer;
    never inside a compiled graph, which reads each key's validity."""
    plan, sparse, heads = job.plan, job.sparse, job.token_keys.shape[2]
    if plan.no_masked_keys and (sparse is None or sparse.every_key_valid):
        return None
    if not traced:
        if "flex token bounds" not in plan.memo:
            token_bounds, token_run = _one_run(plan.token_mask)  # (B, 2), (B,)
            every_token = (token_bounds[:, 0] == 0) & (token_bounds[:, 1] == job.num_tokens)
            checks = torch.stack([plan.global_mask.all(), token_run.all(), every_token.all()]).tolist()
            plan.memo["flex token bounds"] = token_bounds, checks[0] and checks[1], checks[2]
        token_bounds, one_run, every_token_valid = plan.memo["flex token bounds"]
        if one_run and sparse is None:
            return None if every_token_valid else RowBounds(token_bounds, None)
        if one_run:
            memo = plan.memo if sparse.mask_of_tokens_alone else {}  # the same in every layer of the pass, or not
            if "flex sparse bounds" not in memo:
                sparse_bounds, sparse_run = _one_run(sparse.mask)  # (B, 1 or H, 2), (B, 1 or H)
                memo["flex sparse bounds"] = sparse_bounds.expand(-1, heads, -1).contiguous(), bool(sparse_run.all())
            sparse_bounds, sparse_run = memo["flex sparse bounds"]
            if sparse_run:
                return RowBounds(token_bounds, sparse_bounds)
    masks = [plan.key_mask[:, None]] if sparse is None else [plan.key_mask[:, None], sparse.mask]
    segment_ends = (layout.length,) if sparse is None else (layout.sparse_offset, layout.length)
    key_valid = _laid_out([mask.expand(-1, heads, -1) for mask in masks], segment_ends)  # (B, H, length)
    if torch.compiler.is_compiling() and key_valid.device.type == "cpu":
        # a buffer of its own (one more column, viewed back): inductor's CPU flex template names each tensor
        # a mask_mod reads, and cannot name one left as a pointwise computation (torch 2.13)
        key_valid = torch.cat([key_valid, key_valid.new_zeros(*key_valid.shape[:-1], 1)], dim=-1)[..., :-1]
    return key_valid


def lsg_mask_mod(
    pattern: KeyPattern, layout: KeyLayout, validity: RowBounds | torch.Tensor | None = None, kept: torch.Tensor | None = None
) -> Callable:
    """mask_mod(batch, head, query, key) over `layout`: a token query (row g + q) sees the global keys, its
    local tokens and its sparse keys, by index arithmetic (`KeyPattern`); a global query row sees no key
    (the core attends the global queries apart and writes their output into these rows,
    `GlobalRowsWritten`: every score of theirs masked, the kernel gives them zero and its backward no
    gradient). A key of a segment's zero padding is in none.

    validity (`key_validity`): None, every key is valid and nothing is read; `RowBounds`, the tokens and
    compressed keys of each row's runs; or (B, H, length) bool, each key's validity.
    kept: DropKey's choice, (B, nb, H, 1 or b, K) bool over each block's keys in the order of `KeyPattern`
    (see lsg_pattern.block_dropout), or None without dropout.
    """
    num_global, sparse = layout.token_offset, bool(pattern.sparse_starts)

    def sees_every_key(batch, head, query, key):  # the rule alone masks the segments' zero padding
        token_query, token = query - num_global, key - num_global
        local = (token >= 0) & pattern.sees_token(token_query, token)
        if not sparse:  # the keys end with the tokens
            return (token_query >= 0) & ((key < num_global) | local)
        position = key - layout.sparse_offset
        sparse_key = (position >= 0) & (key < layout.sparse_end) & pattern.sees_compressed(token_query, position)
        return (token_query >= 0) & ((key < num_global) | (local & (key < layout.token_end)) | sparse_key)

    # the rule is written out once per way of reading the validity: inductor's CPU code generation (torch
    # 2.13) fails on some equivalent forms of it in a dynamic-shape graph
    sees = sees_every_key
    if isinstance(validity, RowBounds):
        token_bounds, sparse_bounds = validity.tokens, validity.sparse

        def sees_in_runs(batch, head, query, key):  # the rule, within each row's runs
            token_query, token = query - num_global, key - num_global
            real_token = (token >= token_bounds[batch, 0]) & (token < token_bounds[batch, 1])
            seen = (token_query >= 0) & ((key < num_global) | (real_token & pattern.sees_token(token_query, token)))
            if sparse_bounds is None:
                return seen
            position = key - layout.sparse_offset
            real_position = (position >= sparse_bounds[batch, head, 0]) & (position < sparse_bounds[batch, head, 1])
            return seen | ((token_query >= 0) & real_position & pattern.sees_compressed(token_query, position))

        sees = sees_in_runs
    elif validity is not None:

        def sees_valid_keys(batch, head, query, key):  # the rule, over the keys `validity` allows
            token_query, token, position = query - num_global, key - num_global, key - layout.sparse_offset
            seen = (key < num_global) | ((token >= 0) & (position < 0) & pattern.sees_token(token_query, token))
            if sparse:
                seen = seen | ((position >= 0) & pattern.sees_compressed(token_query, position))
            return (token_query >= 0) & seen & validity[batch, head, key]

        sees = sees_valid_keys
    if kept is None:
        return sees
    num_blocks, rows, keys_per_block = kept.shape[1], kept.shape[3], kept.shape[4]

    def sees_kept(batch, head, query, key):
        token_query, token, position = query - num_global, key - num_global, key - layout.sparse_offset
        slot = torch.where(key < num_global, key, pattern.local_slot(token_query, token))
        if sparse:
            slot = torch.where(position >= 0, pattern.sparse_slot(token_query, position), slot)
        # indices stay in range for every (query, key) the kernel evaluates, seen or not
        block_index = (token_query.clamp(min=0) // pattern.block_size).clamp(max=num_blocks - 1)
        row = token_query % pattern.block_size if rows > 1 else token_query * 0
        kept_key = kept[batch, block_index, head, row, slot.clamp(0, keys_per_block - 1)]
        return sees(batch, head, query, key) & kept_key

    return sees_kept


def position_score_mod(
    terms: PositionTerms, key_positions: torch.Tensor, key_rows: torch.Tensor | None, num_global: int
) -> Callable:
    """score_mod(score, batch, head, query, key) adding the position terms to the token queries' scores.

    key_positions: (B, H, length) int64, the position of each key of the sequence, or (length,) where
    they are the same for every row and head; key_rows: (B, H, length, R), their key-side rows (with
    `PositionTerms.key_rows`). Query row r is token q = r - g: position q, row r of `PositionTerms.query_rows`.
    """
    parts = terms.parts()

    def score_mod(score, batch, head, query, key):
        token_query = query - num_global
        key_position = key_positions[key] if key_positions.dim() == 1 else key_positions[batch, head, key]
        relative = key_position - token_query
        for side, rows, bucket in parts:
            if side == "table":
                score = score + rows[head, bucket(relative)]
            elif side == "query":
                score = score + rows[batch, head, query, bucket(relative)]
            else:
                score = score + key_rows[batch, head, key, bucket(relative)]
        return score

    return score_mod


def _with_mask_mod(structure: BlockMask, mask_mod: Callable) -> BlockMask:
    """The cached tile structure with this call's mask_mod (no tensor is copied)."""
    return BlockMask(
        structure.seq_lengths,
        structure.kv_num_blocks,
        structure.kv_indices,
        structure.full_kv_num_blocks,
        structure.full_kv_indices,
        structure.q_num_blocks,
        structure.q_indices,
        structure.full_q_num_blocks,
        structure.full_q_indices,
        BLOCK_SIZE=structure.BLOCK_SIZE,
        mask_mod=mask_mod,
    )


@dataclass(frozen=True)
class KernelSignature:
    """What fixes the graph of a flex_attention call, apart from the lengths: one compiled kernel each."""

    pattern: KeyPattern
    position_parts: tuple[str, ...]  # the sides of the position terms the score_mod adds
    dropout_rows: int  # rows of DropKey's choice per block (1 or b), 0 without dropout
    validity: str  # what the mask_mod reads of the keys' validity: "none", "row bounds" or "per key"
    autograd: tuple[bool, bool]  # (grad mode, inputs requiring grad): training and inference trace apart
    device_type: str
    dtype: torch.dtype

    def kernel_name(self) -> str:
        """A name of its own, the same in every process (torch.compile keeps state per code name)."""
        return f"lsg_flex_attention_{zlib.crc32(repr(self).encode()):08x}"


def _flex_entry_point(name: str) -> Callable:
    """A copy of flex_attention with a code object of its own, called `name`.

    torch.compile keeps the graphs, the recompile count and the history of the ints it saw (which
    turns an int that changed into a dynamic one) per code object: with one per signature, the
    pattern's ints of one model stay static while another model's calls come and go. A copy, not a
    wrapper: inlined behind a wrapper, flex_attention's dynamic-shape CPU kernel fails to build.
    """
    entry_point = FunctionType(
        flex_attention.__code__.replace(co_name=name),
        flex_attention.__globals__,
        name,
        flex_attention.__defaults__,
        flex_attention.__closure__,
    )
    entry_point.__kwdefaults__ = flex_attention.__kwdefaults__
    return entry_point


class CompiledFlexAttention:
    """flex_attention compiled by inductor for one `KernelSignature`, at most `max_compiles` times.

    The first call compiles for its shapes; a call with other lengths compiles once more with those
    lengths dynamic (torch.compile's automatic dynamic shapes), after which every length runs. A
    call that would compile past the budget, or a compile that fails, raises `BackendUnavailable`
    (with one warning): never an uncompiled flex_attention, which materialises every score.
    """

    def __init__(self, name: str, max_compiles: int = MAX_COMPILES):
        self.name = name
        self.compiles_left = max_compiles
        self._kernel = torch.compile(_flex_entry_point(name), backend=self._counted_inductor, fullgraph=True)

    def _counted_inductor(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.compiles_left -= 1
        return inductor_compile(graph, example_inputs)

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        budget_spent = self.compiles_left <= 0
        try:
            with torch.compiler.set_stance("fail_on_recompile" if budget_spent else "default"):
                return self._kernel(*args, **kwargs)
        except compile_error() as error:  # inductor's errors derive from it too
            self.compiles_left = 0  # the graphs compiled so far still serve their shapes
            raise _unavailable(f"{self.name} could not be compiled", error) from error
        except RuntimeError as error:
            if not budget_spent:
                raise
            raise _unavailable(f"{self.name} has spent its compile budget", error) from error  # set_stance's refusal


def _unavailable(reason: str, error: Exception) -> BackendUnavailable:
    """The BackendUnavailable of a call compiled flex cannot take; one warning per process says so."""
    logger.warning_once(
        f"compiled flex_attention cannot take some calls (a compile failed, or they would need more than "
        f"{MAX_COMPILES} compiles per model and pattern): LSG runs its sdpa backend for them (same results)."
    )
    return BackendUnavailable(f"{reason}: {error}")


@functools.cache
def compiled_flex_attention(signature: KernelSignature) -> CompiledFlexAttention:
    """The compiled kernel of `signature`, one per process."""
    return CompiledFlexAttention(signature.kernel_name())


def _flex_kernel(signature: KernelSignature) -> Callable:
    """The compiled kernel of `signature`; plain flex_attention inside a graph being compiled (compiled with it)."""
    if torch.compiler.is_compiling():
        return flex_attention
    return compiled_flex_attention(signature)


def _kernel_operand(x: torch.Tensor) -> torch.Tensor:
    """A query, key or value operand of flex_attention, (B, n, H, D) -> (B, H, n, D). Outside a graph being
    compiled, contiguous at offset 0 of its storage (a copy if it is not): torch.compile guards on strides
    and storage offsets, so whatever the call (padded or not, from a model or not) one graph serves.
    Inside one (flex_attention is compiled with it), a contiguous copy on the CPU: inductor's CPU flex
    template reads the operands' sizes from their storage (torch 2.13), which fails on a view of a
    projection output (B n, H D)."""
    if not torch.compiler.is_compiling():
        x = x.contiguous() if x.storage_offset() == 0 else x.clone(memory_format=torch.contiguous_format)
    elif x.device.type == "cpu":
        return x.transpose(1, 2).contiguous()
    return x.transpose(1, 2)


def _laid_out(pieces: list[torch.Tensor], segment_ends: tuple[int, ...]) -> torch.Tensor:
    """(B, H, n_i, ...) per segment -> (B, H, length, ...), segment i over rows [end_(i-1), end_i), zeros
    after its piece: one copy."""
    parts = []
    for piece, segment_start, segment_end in zip(pieces, (0, *segment_ends), segment_ends):
        padding_rows = segment_end - segment_start - piece.shape[2]
        parts += [piece, piece.new_zeros(*piece.shape[:2], padding_rows, *piece.shape[3:])]
    return torch.cat(parts, dim=2)


class GlobalRowsWritten(torch.autograd.Function):
    """The global queries' output (B, g, H, D) written into the first g rows of a kernel's output over the
    layer's g + t query rows (B, g + t, H, D), in place: the kernel keeps that output for its backward,
    and it is now the layer's output too, kept once (dense attention keeps one; a joined copy would be a
    second). The kernel's global rows saw no key: their weights are zero, so its backward reads nothing
    of theirs into a gradient (flex_attention's backward takes a fully masked row's log-sum-exp as 0,
    and its every weight exp(-inf) is 0), and the write is hidden from autograd's check of the tensors it
    saved (`unchanged_version`). The gradient of the global rows goes to the global queries' output."""

    @staticmethod
    def forward(ctx, kernel_output: torch.Tensor, global_output: torch.Tensor) -> torch.Tensor:
        ctx.num_global = global_output.shape[1]
        with unchanged_version(kernel_output):
            kernel_output[:, : ctx.num_global].copy_(global_output)
        return kernel_output.view_as(kernel_output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad_output, grad_output[:, : ctx.num_global]


class FlexBackend:
    """The dense attention of the flex_attention backend (through SDPA: inputs too short for blocks, the
    global queries); its path for the token queries is `flex_token_attention`, which
    `lsg_attention.choose_path` chooses."""

    name = "flex_attention"
    returns_weights = False
    dense_attention = staticmethod(sdpa_dense_attention)


def flex_token_attention(job: TokenAttention) -> TokenOutput:
    """The flex path: every query row of the layer over its own g + t keys (`KeyLayout`), the queries read
    where they lie, the keys and values too without sparse keys (else one copy, with the compressed ones
    from the next whole tile on), in one kernel call whose mask_mod is the pattern's rule with the keys'
    validity (`key_validity`) and DropKey's choice (`lsg_mask_mod`). Where no block holds padding only,
    the global queries' output (`TokenAttention.global_output`) is written into the kernel's own global
    rows, which saw no key (`GlobalRowsWritten`), and the kernel's output is the layer's
    (`TokenOutput.is_layer_output`, not inside a graph being traced: there the core joins them); else the
    global rows are left out and the core joins the parts."""
    pattern, num_tokens, sparse, traced = job.pattern, job.num_tokens, job.sparse, tracing()
    layout = KeyLayout.of(pattern, num_tokens, TILE)
    validity = key_validity(job, layout, traced)
    segment_ends = (layout.sparse_offset, layout.length)
    queries, keys, values = job.sequence  # (B, g + t, H, D)
    queries = _kernel_operand(queries)  # (B, H, g + t, D)
    if sparse is None:
        keys, values = _kernel_operand(keys), _kernel_operand(values)
    else:  # (B, H, length, D)
        keys = _laid_out([keys.transpose(1, 2), sparse.keys], segment_ends)
        values = _laid_out([values.transpose(1, 2), sparse.values], segment_ends)
    # full tiles skip the mask_mod: only where it is the pattern's rule, within the rows' bounds, without DropKey
    if sparse is None and isinstance(validity, RowBounds) and job.kept is None:  # each row's tiles, once per forward
        if "flex row structure" not in job.plan.memo:
            job.plan.memo["flex row structure"] = tile_structure(pattern, num_tokens, TILE, queries.device, True, validity.tokens)
        structure = job.plan.memo["flex row structure"]
    else:
        structure = block_structure(pattern, num_tokens, TILE, queries.device, rule_only=validity is None and job.kept is None)
    score_mod = None
    terms = job.positions
    if terms is not None:
        key_positions = sequence_positions(terms, pattern.num_global, num_tokens, keys.device)  # (g + t,)
        key_rows = terms.key_rows
        if sparse is not None:
            batch, heads = keys.shape[:2]
            key_positions = _laid_out([key_positions.expand(batch, heads, -1), sparse.positions], segment_ends)
            if key_rows is not None:
                key_rows = _laid_out([key_rows, sparse.key_rows], segment_ends)  # (B, H, length, R)
        score_mod = position_score_mod(terms, key_positions, key_rows, pattern.num_global)
    signature = KernelSignature(
        pattern,
        () if terms is None else tuple(side for side, _, _ in terms.parts()),
        0 if job.kept is None else job.kept.shape[3],
        "none" if validity is None else "row bounds" if isinstance(validity, RowBounds) else "per key",
        (torch.is_grad_enabled(), any(x.requires_grad for x in (job.token_queries, job.token_keys, job.token_values))),
        queries.device.type,
        queries.dtype,
    )
    output = _flex_kernel(signature)(
        queries, keys, values, score_mod=score_mod,
        block_mask=_with_mask_mod(structure, lsg_mask_mod(pattern, layout, validity, job.kept)), scale=job.scaling,
    )  # (B, H, g + t, D)
    sequence_output = output.transpose(1, 2)  # (B, g + t, H, D)
    if job.plan.real_rows is None and not traced:  # the kernel's output is the layer's, kept once
        global_output = job.global_output
        if global_output is not None and torch.is_grad_enabled() and (output.requires_grad or global_output.requires_grad):
            sequence_output = GlobalRowsWritten.apply(sequence_output, global_output)
        elif global_output is not None:  # no gradients: written in place
            sequence_output[:, : pattern.num_global] = global_output
        return TokenOutput(sequence_output, None, is_layer_output=True)
    return TokenOutput(sequence_output[:, layout.token_offset :], None)
