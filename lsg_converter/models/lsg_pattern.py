"""What every LSG attention backend shares: which keys a token query sees, and the backend contract.

* `KeyPattern`: the keys of each block of token queries, described once (global tokens, local
  blocks, sparse windows); every backend derives its masks from it. `KeyPattern.key_windows` gives
  each segment of a block's keys as a window of its sequence (`KeyWindow`), from which the gathered
  columns (`key_columns`) and the sdpa backend's views derive.
* `SparseContext`: the compressed keys and values of the sparse windows (computed by the core).
* `PositionTerms`: additive relative-position score terms (a bucketed table shared by all queries,
  as MPNet's; query-side and key-side rows per bucket, as DeBERTa's c2p and p2c), evaluated for the
  (query, key) pairs a backend evaluates and never as an (L, L) tensor (`relative_scores`).
* `TokenAttention` / `TokenOutput`: the contract. The core (lsg_attention) hands a path the token
  queries, their keys and the global queries' output (`TokenAttention.global_output`); the path returns
  the token queries' output and their weights if it computes them.
* Block keys (`block_table`, `BlockKeys`): where each block's queries and keys lie in the sequence
  [globals | tokens | compressed keys], one table made once per shape, and each block's keys gathered
  with it in the order [globals | sparse | local], with their mask and position terms, for the
  backends that batch blocks (sdpa, eager).

A backend file (lsg_sdpa, lsg_eager, lsg_flex) imports this module, and lsg_transformers where it reads torch's private names.
This file travels with saved models as remote code: it imports torch only (nothing of this folder).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, NamedTuple, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Made = TypeVar("Made")  # what a memo holds (`made_once`)


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
# The key pattern: which keys each token query sees, described once for every attention kernel
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyWindow:
    """One segment of every block's keys, as a window of a sequence: block i reads rows [first + i step,
    first + i step + width) of the `source` sequence ("global": the g global tokens, every block the
    same rows, step 0; "sparse": the compressed keys; "local": the tokens). Rows before 0 or past the
    sequence's end are keys outside it (masked)."""

    source: str
    first: int
    step: int
    width: int

    def rows(self, block_index: torch.Tensor) -> torch.Tensor:
        """The rows of the blocks `block_index` (n, 1): (n, width)."""
        return block_index * self.step + self.first + torch.arange(self.width, device=block_index.device)


@dataclass(frozen=True)
class KeyPattern:
    """Which keys each token query sees: the one description every kernel derives its masks from.

    Positions count tokens from the first real token (the global tokens are apart); query block i is
    tokens [i b, (i + 1) b); compressed position p is the p-th key of the sparse context. Block i sees

    * every global token;
    * the local tokens [(i - blocks_before) b, (i + 1 + blocks_after) b), causal: up to the query;
    * per sparse window, the compressed positions [i c + start, i c + start + sparse_size), with
      c = `compressed_per_block` and start = `sparse_left_start`, then `sparse_right_start`.

    The block backends turn this into views of block windows (`BlockKeys`), the flex backend into a
    mask_mod over element positions (`sees_token`, `sees_compressed`) and the block structure of a
    BlockMask; a block's keys come in the order [globals | sparse windows | local] (`key_columns`,
    and its inverses `local_slot`, `sparse_slot`).
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
    # local keys per block
    local_size: int = field(init=False)
    # the start of each sparse window relative to i c, in key order (none without sparse keys)
    sparse_starts: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_size", (self.blocks_before + 1 + self.blocks_after) * self.block_size)
        right = () if self.sparse_right_start is None else (self.sparse_right_start,)
        object.__setattr__(self, "sparse_starts", ((self.sparse_left_start,) + right) if self.sparse_size else ())

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

    def sparse_distances(self) -> tuple[tuple[int, int], ...]:
        """Per sparse window, in key order, the least and the greatest distance (key - query, in tokens)
        between a block's queries and the tokens its compressed keys come from, compressed position p
        coming from the tokens of block p // c (c = `compressed_per_block`), as every compressor of
        lsg_sparse keeps it."""
        block, per_block = self.block_size, self.compressed_per_block
        distances = []
        for start in self.sparse_starts:
            first_block, last_block = start // per_block, (start + self.sparse_size - 1) // per_block
            distances.append((first_block * block - (block - 1), (last_block + 1) * block - 1))
        return tuple(distances)

    def key_windows(self) -> tuple[KeyWindow, ...]:
        """The segments of each block's keys, in key order: the global tokens, each sparse window, the
        local window (none of zero width)."""
        windows = (
            KeyWindow("global", 0, 0, self.num_global),
            *(KeyWindow("sparse", start, self.compressed_per_block, self.sparse_size) for start in self.sparse_starts),
            KeyWindow("local", self.local_start(0), self.block_size, self.local_size),
        )
        return tuple(window for window in windows if window.width)

    def key_columns(
        self, block_index: torch.Tensor, num_tokens: int, num_compressed: int, compressed_start: int = 0
    ) -> torch.Tensor:
        """Where each key of the blocks `block_index` (n,) lies in the sequence [g globals | num_tokens
        tokens | the compressed keys of positions [compressed_start, num_compressed)]: (n, keys per
        block), in the blocks' key order (`key_windows`). Keys outside the sequence (the zero padding of
        the windows) get the column after the last one."""
        outside = self.num_global + num_tokens + num_compressed - compressed_start
        sequences = {  # where each source's rows start in the sequence, and the rows it holds
            "global": (0, 0, self.num_global),
            "sparse": (self.num_global + num_tokens - compressed_start, compressed_start, num_compressed),
            "local": (self.num_global, 0, num_tokens),
        }
        columns = []
        for window in self.key_windows():
            offset, first, end = sequences[window.source]
            rows = window.rows(block_index[:, None])  # (n, width)
            columns.append(torch.where((rows >= first) & (rows < end), offset + rows, outside))
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
# Relative position terms
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class PositionTerms:
    """Additive score terms of relative positions: query i (position p_i) and key j (position p_j) get

        table[h, bucket(r)] + query_rows[b, h, i, query_bucket(r)] + key_rows[b, h, j, key_bucket(r)],

    r = p_j - p_i, each part optional. Token k of the input is at position k; the global tokens are at
    `global_position`. Rows are indexed over the layer's sequence of g + t positions (global tokens
    first); sparse keys get the position and the key rows of their compressor (lsg_sparse: compressed
    as the values are). Terms are added to the scaled scores, as they are: scale them beforehand.

    Attributes:
        bucket: relative distance (int64 tensor) -> column of `table`, elementwise torch operations
            (flex_attention evaluates it inside its score_mod).
        table: (H, R) scores per head and bucket, shared by every query and key (MPNet's bias), or None.
        query_rows: (B, H, g + t, R), query i's score for a key in each bucket (DeBERTa's c2p), or None.
        query_bucket: relative distance -> column of `query_rows` (default: `bucket`).
        key_rows: (B, H, g + t, R), key j's score for a query in each bucket (DeBERTa's p2c), or None.
        key_bucket: relative distance -> column of `key_rows` (default: `bucket`).
        global_position: the position of every global token (0: the first token's, where the global
            tokens come from: global 0 is the [CLS] / <s> embedding at position 0, so a query sees it
            with the term it gave that token, and the global queries see the text as it did).
        max_distance: where `bucket` is constant beyond: bucket(r) = bucket(max_distance) for r >=
            max_distance, bucket(-max_distance) for r <= -max_distance (T5's bias), or None. With a
            table only, the block backends then look a block's sparse keys up by their offset from
            the block's start (`block_table_scores`), not by the distance of each pair, and where
            every sparse window lies that far from its block, give it its side's terms whatever its
            keys' positions (`far_sparse_scores`).

    Compared and hashed by identity: what the layers of a forward pass make from one object of terms is
    kept in the pass's plan under it (`made_once` with `PaddingPlan.memo`).
    """

    bucket: Callable[[torch.Tensor], torch.Tensor]
    table: torch.Tensor | None = None
    query_rows: torch.Tensor | None = None
    query_bucket: Callable[[torch.Tensor], torch.Tensor] | None = None
    key_rows: torch.Tensor | None = None
    key_bucket: Callable[[torch.Tensor], torch.Tensor] | None = None
    global_position: int = 0
    max_distance: int | None = None

    @property
    def same_in_every_block(self) -> bool:
        """Whether the terms are the table's alone (no query or key rows): a block's local keys then get
        the same terms in every block (`shared_local_scores`)."""
        return self.table is not None and self.query_rows is None and self.key_rows is None

    def parts(self) -> list[tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]:
        """(side, rows, bucket) of each term present: side "table", "query" or "key"."""
        parts = [
            ("table", self.table, self.bucket),
            ("query", self.query_rows, self.query_bucket or self.bucket),
            ("key", self.key_rows, self.key_bucket or self.bucket),
        ]
        return [part for part in parts if part[1] is not None]


def relative_scores(
    terms: PositionTerms,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    query_rows: RowLookup | None = None,
    key_rows: RowLookup | None = None,
) -> torch.Tensor:
    """The position terms of a group of queries over their keys: (B or 1, ..., H, q, K).

    query_positions: (B or 1, ..., 1 or H, q, 1) and key_positions: (B or 1, ..., 1 or H, 1, K), int64
    tensors that broadcast together (at least 4 dimensions); query_rows and key_rows: where the rows of
    `PositionTerms.query_rows` / `key_rows` of these queries and keys are (each given where the term is).
    """
    relative = key_positions - query_positions  # (B or 1, ..., 1 or H, q, K)
    total = None
    for side, table, bucket in terms.parts():
        column = bucket(relative)
        if side == "table":
            heads, buckets = table.shape
            shape = torch.broadcast_shapes(column.shape[:-3] + (heads,) + column.shape[-2:-1] + (buckets,))
            score = table[:, None, :].expand(shape).gather(-1, column.expand(*shape[:-1], column.shape[-1]))
        else:
            score = (query_rows if side == "query" else key_rows).scores(column)
        if total is None:
            total = score
        else:  # each part is a tensor of its own: added in place where the shapes allow
            total = total.add_(score) if total.shape == torch.broadcast_shapes(total.shape, score.shape) else total + score
    return total


@dataclass(frozen=True)
class RowLookup:
    """Where the position rows of some queries or keys are: `rows` (B, H, N, R) of a sequence and `index`,
    the row of each query (B or 1, ..., 1 or H, q, 1) or key (B or 1, ..., 1 or H, 1, K), int64.

    The rows are never copied per pair or per window: `scores` gathers each pair's column straight from
    the flattened rows, with an index broadcast over the batch and the heads where it does not vary."""

    rows: torch.Tensor
    index: torch.Tensor

    def scores(self, column: torch.Tensor) -> torch.Tensor:
        """rows[b, h, index, column] of every pair, column: (B or 1, ..., 1 or H, q, K) -> (B, ..., H, q, K)."""
        batch, heads, _, buckets = self.rows.shape
        flat = (self.index * buckets + column).movedim(-3, 1)  # (B or 1, 1 or H, ..., q, K)
        pairs = flat.shape[2:]
        flat = flat.reshape(*flat.shape[:2], -1).expand(batch, heads, -1)
        scores = self.rows.flatten(2).gather(2, flat)  # (B, H, pairs)
        return scores.view(batch, heads, *pairs).movedim(1, -3)


def block_row_table(job: TokenAttention) -> torch.Tensor:
    """The table's score for row j of a block and a key k tokens after the block's start, k clamped into
    [-M, M + b) (M = `PositionTerms.max_distance`: beyond, every row of the block gets the same
    score): (H, b, 2 M + b), column k + M. Made once per forward pass (`made_once` with `PaddingPlan.memo`)."""
    terms, block_size = job.positions, job.pattern.block_size

    def make() -> torch.Tensor:
        offsets = torch.arange(-terms.max_distance, terms.max_distance + block_size, device=terms.table.device)
        rows = torch.arange(block_size, device=terms.table.device)[:, None]
        return terms.table[:, terms.bucket(offsets - rows)]  # (H, b, 2 M + b)

    return made_once(job.plan.memo, ("block row table", terms), make)


def block_table_scores(job: TokenAttention, key_offsets: torch.Tensor) -> torch.Tensor:
    """The table's scores of each row of a block over its keys, from each key's offset from the block's
    start, key_offsets (B or 1, nb, 1 or H, 1, K) int64 -> (B or 1, nb, H, b, K): one lookup per key and
    head of the b rows' scores in `block_row_table` (terms with a table only, and `max_distance`), whose
    backward adds them into the table (no gradient of the table's size per block and head)."""
    table, max_distance = block_row_table(job), job.positions.max_distance
    heads, block_size, width = table.shape
    column = key_offsets.clamp(-max_distance, width - max_distance - 1) + max_distance
    head_columns = column[:, :, :, 0, :] + torch.arange(heads, device=column.device)[:, None] * width  # (B or 1, nb, H, K)
    rows_of_columns = table.transpose(0, 1).reshape(block_size, heads * width)  # (b, H W)
    scores = rows_of_columns.index_select(-1, head_columns.flatten()).view(block_size, *head_columns.shape)
    return scores.movedim(0, -2)  # (b, B or 1, nb, H, K) -> (B or 1, nb, H, b, K)


def far_sparse_scores(
    terms: PositionTerms, pattern: KeyPattern, device: torch.device, memo: dict | None = None
) -> torch.Tensor | None:
    """The terms of a block's rows over its sparse keys where every sparse window lies at `max_distance`
    or more from every row of the block (`KeyPattern.sparse_distances`), each window on one side, so that
    a table's terms are constant over it: (1, 1, H, 1, sparse keys), the same for every block, row and
    sparse key's position; None where that does not hold (rows, no table, no `max_distance`, a window
    within reach). Made once per `memo` (a forward pass's: `PaddingPlan.memo`), else at every call."""
    if not terms.same_in_every_block or terms.max_distance is None:
        return None

    def make() -> torch.Tensor | None:
        reach, sides = terms.max_distance, []
        for least, greatest in pattern.sparse_distances():
            if greatest > -reach and least < reach:
                return None
            sides.append(-reach if greatest <= -reach else reach)
        distances = torch.tensor(sides, device=device).repeat_interleave(pattern.sparse_size)
        origin = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
        return relative_scores(terms, origin, distances.view(1, 1, 1, -1))[None]  # (1, 1, H, 1, S)

    return made_once(memo, ("far sparse scores", terms, pattern), make)


def shared_local_scores(terms: PositionTerms, pattern: KeyPattern, device: torch.device) -> torch.Tensor:
    """The terms of a block's rows over its local keys where every block gets the same ones
    (`PositionTerms.same_in_every_block`): (1, H, b, local), from the rows' and the keys' offsets from
    the block's start."""
    rows = torch.arange(pattern.block_size, device=device).view(1, 1, -1, 1)
    local = pattern.key_windows()[-1]
    local_keys = local.rows(torch.zeros(1, 1, dtype=torch.long, device=device)).view(1, 1, 1, -1)
    return relative_scores(terms, rows, local_keys)


def token_global_scores(terms: PositionTerms, num_global: int, num_tokens: int, device: torch.device) -> torch.Tensor:
    """The terms of `num_tokens` token queries over the global keys where they are the table's alone
    (`PositionTerms.same_in_every_block`): (1, H, num_tokens, g)."""
    tokens = torch.arange(num_tokens, device=device).view(1, 1, -1, 1)
    return relative_scores(terms, tokens, global_query_positions(terms, num_global, device).view(1, 1, 1, -1))


def global_query_positions(terms: PositionTerms, num_global: int, device: torch.device) -> torch.Tensor:
    """(g,) int64: the position of each global token."""
    return torch.full((num_global,), terms.global_position, dtype=torch.long, device=device)


def sequence_positions(terms: PositionTerms, num_global: int, num_tokens: int, device: torch.device) -> torch.Tensor:
    """(g + num_tokens,) int64: the positions of the layer's sequence, global tokens first."""
    tokens = torch.arange(num_tokens, device=device)
    return torch.cat([global_query_positions(terms, num_global, device), tokens])


def dense_position_scores(
    terms: PositionTerms, query_index: torch.Tensor, key_index: torch.Tensor, num_global: int, length: int
):
    """Position terms of queries over keys, both named by their index in the sequence of `length` = g + t:
    (B or 1, H, q, k). For the few global queries and for inputs shorter than two blocks."""
    positions = sequence_positions(terms, num_global, length - num_global, query_index.device)
    query_index, key_index = query_index.view(1, 1, -1, 1), key_index.view(1, 1, 1, -1)
    query_rows = None if terms.query_rows is None else RowLookup(terms.query_rows, query_index)
    key_rows = None if terms.key_rows is None else RowLookup(terms.key_rows, key_index)
    return relative_scores(terms, positions[query_index], positions[key_index], query_rows, key_rows)


# --------------------------------------------------------------------------------------------------
# The contract between the core and its backends
# --------------------------------------------------------------------------------------------------


@dataclass
class SparseContext:
    """The compressed keys of the sparse windows (T / f of them), and what travels with them."""

    keys: torch.Tensor  # (B, H, T / f, D)
    values: torch.Tensor  # (B, H, T / f, D)
    mask: torch.Tensor  # (B, 1 or H, T / f) bool, True = may be attended
    positions: torch.Tensor | None = None  # (B, H, T / f) int64, with position terms
    key_rows: torch.Tensor | None = None  # (B, H, T / f, R), with key-side position terms
    token_weights: torch.Tensor | None = None  # (B, H, T / f, T): each key's share of every token's value
    # True where every compressed key is known valid without reading `mask` (no token masked, none padded,
    # a compressor that leaves no key empty: `lsg_sparse.sparse_context`)
    every_key_valid: bool = False
    # True where `mask` depends on the token mask alone, not on the keys (made from it, or every key valid):
    # the same in every layer of a forward pass
    mask_of_tokens_alone: bool = False


@dataclass
class PaddingPlan:
    """What the LSG layers of one kind (their settings and causality) make from a forward pass's padding
    alone: made once, before the layers run, where the model's recorder makes the padding mask
    (`lsg_attention.plan_padding`), and read by every layer of the pass, those gradient checkpointing runs
    again included; made by the call itself where no recorder made its mask, and in every layer while tracing.

    pattern: the layers' `KeyPattern`; key_mask: (B, g + t) bool, the keys that may be attended; global_mask:
    (B, g), its global columns; token_mask: (B, T) bool, the tokens' padded at the end to whole blocks (T =
    nb b), the first token masked with ``mask_first_token``; padding: T - t; no_masked_keys: whether no key
    is masked, known without reading a mask (no padding mask, no masked first token); real_blocks: (B, nb)
    bool, the blocks that hold a real token, None where every block does; real_rows: (B, t) bool, the token
    queries of those blocks (None: every query); query_blocks: (batch index, block index) of those blocks,
    (n,) each (None: every block, or while tracing: a compiled graph computes every block); window_views: the
    blocks of sdpa's window-view path on the CPU (`lsg_sdpa.WindowViewPlan`) where the padding allows it (no
    sparse keys, not causal, every global key valid), else None; memo: what a path makes from the padding
    and the pass's position terms the first time a layer asks (flex_attention's row bounds, the gathered
    blocks' masks, the window views' masks), for the next ones (`made_once` with `PaddingPlan.memo`)."""

    pattern: KeyPattern
    key_mask: torch.Tensor
    global_mask: torch.Tensor
    token_mask: torch.Tensor
    padding: int
    no_masked_keys: bool
    real_blocks: torch.Tensor | None
    real_rows: torch.Tensor | None
    query_blocks: tuple[torch.Tensor, torch.Tensor] | None
    window_views: Any = None
    memo: dict = field(default_factory=dict)


@dataclass
class TokenAttention:
    """What the core hands a backend: the t token queries and every key they may see.

    token_queries, token_keys, token_values: (B, t, H, D) (`padded`: the same padded at the end to T = nb b,
    the padding masked, made on first use); global_keys, global_values: (B, g, H, D); sparse: the sparse
    context, or None without sparse keys; pattern: the keys each block sees; scaling: the scores' factor;
    num_tokens: t; num_blocks: nb; sequence: the layer's queries,
    keys and values, (B, g + t, H, D) each, of which the global and token tensors above are the two parts
    (which the block backends gather from with `block_table` and flex_attention reads where they lie);
    plan: what the layers of this kind make from the forward pass's padding alone (`PaddingPlan`: the key
    and token masks, whether any key is masked, the blocks that hold a real token, whose output rows the
    core leaves zero and a path may leave out, the window views' blocks), made once for the pass;
    kept: the keys DropKey leaves each block in training, (B, nb, H, 1 or b, K) bool in the order of
    `KeyPattern.key_columns` (drawn once, by the core, see `block_dropout`), None otherwise;
    positions: the position terms, or None;
    training: whether the call needs gradients (of its queries, keys or values);
    terms_trained: whether its position terms give the scores a gradient (a bias table or rows being trained);
    global_output: the global queries' output (B, g, H, D), made by the core before the token queries' path,
    which may write it into its own output (`TokenOutput.is_layer_output`), so that the kernel's saved
    output is the layer's output and no joined copy of it is kept; None without global tokens.
    block_global_keys: (B, nb, g, H, D), each block's own global keys where they differ per block (their
    distances clamped to the trained length, `lsg_rotary`), else None: `global_keys` serve every block.
    """

    token_queries: torch.Tensor
    token_keys: torch.Tensor
    token_values: torch.Tensor
    global_keys: torch.Tensor
    global_values: torch.Tensor
    sparse: SparseContext | None
    pattern: KeyPattern
    scaling: float
    num_tokens: int
    num_blocks: int
    sequence: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    plan: PaddingPlan
    kept: torch.Tensor | None = None
    positions: PositionTerms | None = None
    training: bool = False
    terms_trained: bool = False
    global_output: torch.Tensor | None = None
    block_global_keys: torch.Tensor | None = None
    _token_key_rows: torch.Tensor | None = field(default=None, init=False, repr=False)
    _padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False)

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The token queries, keys and values padded to T rows, (B, T, H, D) each, made once (no copy where
        t = T, except while exporting: the traced graph then pads by 0 rows too). (Kept in a field, not a
        functools.cached_property, whose lock torch.compile cannot trace.)"""
        if self._padded is None:
            tokens = (self.token_queries, self.token_keys, self.token_values)
            padding = self.plan.token_mask.shape[1] - self.num_tokens
            self._padded = tuple(pad_rows(x, 0, padding) for x in tokens) if padding or is_exporting() else tokens
        return self._padded

    @property
    def token_key_rows(self) -> torch.Tensor | None:
        """The tokens' `PositionTerms.key_rows` (the global rows left out), padded at the end like the
        tokens: (B, H, T, R), or None. Made once, where a sequence of the tokens' rows is needed (the
        sparse compression, flex's score_mod); the block backends look the rows up where they are.
        (Kept in a field, not a functools.cached_property, whose lock torch.compile cannot trace.)"""
        if self._token_key_rows is None and self.positions is not None and self.positions.key_rows is not None:
            token_rows = self.positions.key_rows[:, :, self.pattern.num_global :]
            self._token_key_rows = F.pad(token_rows, (0, 0, 0, self.plan.token_mask.shape[1] - token_rows.shape[2]))
        return self._token_key_rows


@dataclass
class TokenOutput:
    """What a backend returns: output (B, t, H, D), or a tuple of pieces (B, t_i, H, D) in token order that
    the core joins with the global queries' output in one copy; weights (B, H, t, t), the token queries' weights
    over the tokens (the global columns left out, on the output's autograd path, see
    `lsg_eager.weighted_values`), or None where the backend does not compute them;
    is_layer_output: the output is the whole layer's, (B, g + t, H, D): the global queries' rows first
    (`TokenAttention.global_output`), the rows of blocks of padding only zero; the core joins nothing."""

    output: torch.Tensor | tuple[torch.Tensor, ...]
    weights: torch.Tensor | None
    is_layer_output: bool = False


class BackendUnavailable(RuntimeError):
    """Raised by a path of a backend for a call it cannot take after all (compiled flex_attention
    whose compile failed or whose budget is spent): the core runs the sdpa backend for it."""


class Backend(Protocol):
    """The dense attention of an LSG backend (lsg_sdpa, lsg_eager, lsg_flex): inputs of at most two blocks
    and the global queries. Its paths for the token queries are functions that `lsg_attention.choose_path`
    chooses."""

    name: str
    returns_weights: bool  # its path returns weights (the core then asks for `SparseContext.token_weights`)

    def dense_attention(
        self, query, key, value, allowed: torch.Tensor | None, scaling: float, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Plain attention of query (..., H, q, D) over key, value (..., H, k, D): allowed, bool (None:
        every key), and scores, additive (position terms), broadcast to (..., H, q, k). Returns the output
        (..., H, q, D) and the weights (..., H, q, k) or None."""


# --------------------------------------------------------------------------------------------------
# Masks and dropout
# --------------------------------------------------------------------------------------------------


def pad_rows(x: torch.Tensor, before: int, after: int, value: float | bool = 0) -> torch.Tensor:
    """Pad dim 1 of x (B, L, ...) with `before` and `after` rows of `value`."""
    return F.pad(x, (0, 0) * (x.dim() - 2) + (before, after), value=value)


def additive_mask(
    allowed: torch.Tensor | None, dtype: torch.dtype, scores: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Bool mask (and position terms) -> `scores` (or 0) where allowed, finfo.min elsewhere. Finite, so
    a query whose keys are all masked gets no NaN. allowed None (every key): `scores`, or None."""
    if allowed is None:
        return None if scores is None else scores.to(dtype)
    kept = constant(0.0, dtype, allowed.device) if scores is None else scores.to(dtype)
    return torch.where(allowed, kept, constant(torch.finfo(dtype).min, dtype, allowed.device))


def drop_keys(allowed: torch.Tensor, groups_shape: torch.Size, num_keys: int, dropout: float) -> torch.Tensor:
    """Attention dropout as DropKey (Li et al., CVPR 2023) at group granularity: in each group of
    queries (a block, per head) every key is hidden with probability `dropout` before the softmax.
    The mask stays O(n) and SDPA keeps its fused kernels. A query that would lose every key keeps
    them all: it must never fall back onto masked keys."""
    kept = allowed & (torch.rand(*groups_shape, 1, num_keys, device=allowed.device) >= dropout)
    return torch.where(kept.any(dim=-1, keepdim=True), kept, allowed)


# SDPA's kernels for LSG's calls on CUDA: not cuDNN's (torch's default on Hopper GPUs), which fails on masked
# calls of some key counts and gives NaN gradients at others (pytorch/pytorch#196678; what was seen:
# docs/benchmarks.md, "lsg_pattern.CUDA_SDPA_KERNELS")
CUDA_SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


# On CUDA, calls of at most this many queries (the global queries over every key) run `few_query_attention`:
# SDPA's fused kernels give a few queries a handful of thread blocks that walk every key (measured slow:
# docs/benchmarks.md, "lsg_pattern.FEW_QUERIES")
FEW_QUERIES = 16


def fused_attention(query, key, value, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """`scaled_dot_product_attention` with an additive mask (or none), on CUDA without cuDNN's kernels,
    and through `few_query_attention` there for at most `FEW_QUERIES` queries."""
    if not query.is_cuda:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    if query.shape[-2] <= FEW_QUERIES:
        return few_query_attention(query, key, value, mask, scaling)
    with sdpa_kernel(CUDA_SDPA_KERNELS):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)


def few_query_attention(query, key, value, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v as two matrix products in the inputs' dtype, the softmax in
    float32 at least (as transformers' eager attention): (..., q, D) over (..., k, D) -> (..., q, D), with
    (..., q, k) scores, small for a few queries, and no copy of the keys or values kept for backward.
    A query whose keys are all masked averages their values, as SDPA does."""
    scores = (query @ key.transpose(-1, -2)).to(torch.promote_types(query.dtype, torch.float32)) * scaling
    if mask is not None:
        scores = scores + mask
    return scores.softmax(dim=-1).to(value.dtype) @ value


def sdpa_dense_attention(query, key, value, allowed, scaling, scores) -> tuple[torch.Tensor, None]:
    """`Backend.dense_attention` through SDPA (no weights): the sdpa and flex_attention backends'; allowed
    None: every key."""
    return fused_attention(query, key, value, additive_mask(allowed, query.dtype, scores), scaling), None


def causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """(q, k) bool: query i (the last q of k positions) sees keys up to its own position."""
    return torch.arange(num_keys, device=device) <= torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]


# --------------------------------------------------------------------------------------------------
# Block windows: each block's keys in the order [globals | sparse windows | local]
# --------------------------------------------------------------------------------------------------


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


def local_windows(pattern: KeyPattern, x: torch.Tensor, num_blocks: int, fill=0) -> list[torch.Tensor]:
    """(B, T, ...) -> pieces (B, nb, ., ...) of each block's local rows, `fill` outside the sequence."""
    block = pattern.block_size
    padded = pad_rows(x, pattern.blocks_before * block, pattern.blocks_after * block, fill)
    return _sliding(padded, pattern.local_size, block, num_blocks)


def sparse_windows(pattern: KeyPattern, x: torch.Tensor, num_blocks: int, fill=0) -> list[torch.Tensor]:
    """(B, T / f, ...) -> pieces (B, nb, ., ...) of each block's sparse windows, `fill` outside the sequence."""
    step, size, starts = pattern.compressed_per_block, pattern.sparse_size, pattern.sparse_starts
    before, after = max(0, -min(starts)), max(0, max(starts) + size - step)
    padded = pad_rows(x, before, after, fill)
    return [piece for start in starts for piece in _sliding(padded, size, step, num_blocks, start=before + start)]


def local_causal_mask(pattern: KeyPattern, device: torch.device) -> torch.Tensor:
    """(b, local_size) bool: which local keys each row of a block sees (its window starts at token 0)."""
    rows = torch.arange(pattern.block_size, device=device)[:, None] + pattern.blocks_before * pattern.block_size
    return pattern.sees_token(rows, torch.arange(pattern.local_size, device=device))


def block_mask(job: TokenAttention) -> torch.Tensor:
    """Which keys of its window each block may attend to: (B, nb, 1 or H, 1 or b, K) bool, in key order: the
    validity of the keys that the block table's columns name (`block_table`, whose columns gather the
    blocks' keys), False outside the sequence; causal: the local keys up to each query."""
    plan, sparse = job.plan, job.sparse
    num_compressed = 0 if sparse is None else sparse.keys.shape[2]
    table = block_table(job.pattern, job.num_blocks, job.num_tokens, num_compressed, plan.key_mask.device)
    valid = plan.key_mask[:, None, :]  # (B, 1, g + t)
    if sparse is not None:  # (B, 1 or H, g + t + T / f)
        valid = torch.cat([valid.expand(-1, sparse.mask.shape[1], -1), sparse.mask], dim=-1)
    allowed = (valid[:, :, table.columns] & table.inside).transpose(1, 2)[:, :, :, None]  # (B, nb, 1 or H, 1, K)
    if job.pattern.causal:
        allowed = allowed & causal_key_mask(job.pattern, table.columns.shape[1], valid.device)  # (B, nb, 1 or H, b, K)
    return allowed


def block_dropout(job: TokenAttention, heads: int, dropout: float) -> torch.Tensor:
    """The keys DropKey leaves each block: (B, nb, H, 1 or b, K) bool (see `drop_keys`), drawn in every
    layer from the keys each block may attend to (made once per forward pass where no sparse mask reads the
    keys, `SparseContext.mask_of_tokens_alone`)."""
    if job.sparse is None or job.sparse.mask_of_tokens_alone:
        allowed = made_once(job.plan.memo, "allowed keys", lambda: block_mask(job))
    else:
        allowed = block_mask(job)
    batch, num_blocks = allowed.shape[:2]
    kept = drop_keys(allowed.flatten(0, 1), (batch * num_blocks, heads), allowed.shape[-1], dropout)
    return kept.unflatten(0, (batch, num_blocks))


def block_position_scores(job: TokenAttention) -> list[torch.Tensor]:
    """The position terms of each block's queries over its keys, in key order: pieces (B or 1, nb or 1,
    1 or H, 1 or b, K_i) that broadcast to (B, nb, H, b, K_i) and join on the last dimension.

    Local keys sit at the same distances from the rows of every block: without query or key rows
    their piece is computed once (`shared_local_scores`) and broadcast; so is the sparse keys' where
    they all lie beyond the table's `max_distance` (`far_sparse_scores`).
    Query and key rows are looked up where they are (`RowLookup`), not copied into each block's window.
    """
    terms, pattern, num_blocks, sparse = job.positions, job.pattern, job.num_blocks, job.sparse
    block, num_global, device = pattern.block_size, pattern.num_global, job.token_keys.device
    padded_tokens = num_blocks * block

    def windows(pieces: list[torch.Tensor]) -> torch.Tensor:  # pieces (B, nb, K_i, H) -> (B, nb, H, 1, K)
        return torch.cat(pieces, dim=2).transpose(2, 3)[:, :, :, None, :]

    def key_rows(rows: torch.Tensor | None, index: torch.Tensor) -> RowLookup | None:
        return None if rows is None else RowLookup(rows, index)

    query_positions = torch.arange(padded_tokens, device=device).view(1, num_blocks, 1, block, 1)
    query_rows = None
    if terms.query_rows is not None:  # the padding queries read the last token's row (their output is dropped)
        query_rows = RowLookup(terms.query_rows, num_global + query_positions.clamp(max=job.num_tokens - 1))

    # keys of each kind: positions and rows (B or 1, nb, 1 or H, 1, K_i); windows outside the sequence read row 0
    token_positions = torch.arange(padded_tokens, device=device).view(1, padded_tokens, 1)
    local_positions = windows(local_windows(pattern, token_positions, num_blocks))
    local_rows = key_rows(terms.key_rows, num_global + local_positions.clamp(max=job.num_tokens - 1))  # padding: masked
    if terms.same_in_every_block:
        local = shared_local_scores(terms, pattern, device)[:, None]  # (1, 1, H, b, local)
    else:
        local = relative_scores(terms, query_positions, local_positions, query_rows, local_rows)
    pieces = [local]
    far_sparse = None if sparse is None else far_sparse_scores(terms, pattern, device, job.plan.memo)
    if far_sparse is not None:
        pieces.insert(0, far_sparse)
    elif sparse is not None:
        sparse_positions = windows(sparse_windows(pattern, sparse.positions.transpose(1, 2), num_blocks))
        compressed = torch.arange(sparse.keys.shape[2], device=device).view(1, -1, 1)
        sparse_rows = key_rows(sparse.key_rows, windows(sparse_windows(pattern, compressed, num_blocks)))
        if terms.table is not None and terms.max_distance is not None and query_rows is None and sparse_rows is None:
            block_starts = query_positions[:, :, :, :1]  # (1, nb, 1, 1, 1)
            pieces.insert(0, block_table_scores(job, sparse_positions - block_starts))
        else:
            pieces.insert(0, relative_scores(terms, query_positions, sparse_positions, query_rows, sparse_rows))
    if num_global:
        global_positions = global_query_positions(terms, num_global, device).view(1, 1, 1, 1, num_global)
        global_rows = key_rows(terms.key_rows, torch.arange(num_global, device=device).view(1, 1, 1, 1, num_global))
        pieces.insert(0, relative_scores(terms, query_positions, global_positions, query_rows, global_rows))
    return pieces


def shape_cached(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, of hashable arguments (a shape, a pattern, a device), made once per arguments and shared
    by the layers and the forwards that follow: kept in an LRU cache, its tensors made outside inference
    mode (so a training step may save them for its backward after an inference_mode call made them);
    inside a compiled graph, traced every time (device ops that CUDA graphs capture). It has the cache's
    `cache_info` and `cache_clear`."""
    cached = functools.lru_cache(maxsize=64)(function)

    @functools.wraps(function)
    def made(*args: Any, **kwargs: Any) -> Any:
        if tracing():
            return function(*args, **kwargs)
        with torch.inference_mode(False):
            return cached(*args, **kwargs)

    made.cache_info, made.cache_clear = cached.cache_info, cached.cache_clear
    return made


@shape_cached
def constant(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`value` as a 0-dimensional tensor of `dtype` on `device`, made once (a Python number would be made
    into one in every call): for masks filled with it and rows padded with its views."""
    return torch.tensor(value, dtype=dtype, device=device)


# The attribute of the padding mask a recorder makes for a forward pass that holds the pass's padding plans
# (`padding_plans_of`)
PADDING_PLANS = "lsg_padding_plans"


def give_padding_plans(mask: torch.Tensor | None, plans: dict) -> None:
    """Give `mask`, the padding mask a model's recorder makes for one forward pass (one tensor that
    transformers hands every layer of the pass), its `PaddingPlan`s, by (settings, causal, number of keys)
    (`lsg_attention.plan_padding`): found by its layers, and by those gradient checkpointing runs again
    in the backward pass; they live as long as the mask. Not while tracing: a compiled graph or an export
    makes its plan in every layer, with no host-side state."""
    if mask is not None and not tracing():
        setattr(mask, PADDING_PLANS, plans)


def padding_plans_of(mask: Any) -> dict | None:
    """The `PaddingPlan`s of the pass that made `mask` (`give_padding_plans`); None for a mask no recorder
    made, or while tracing: each call then makes its own."""
    if tracing():
        return None
    return getattr(mask, PADDING_PLANS, None)


def made_once(memo: dict | None, key: Hashable, make: Callable[[], Made]) -> Made:
    """`memo[key]`, made by `make()` the first time it is asked for; `make()` at every call without a memo.

    With a forward pass's `PaddingPlan.memo`: what every layer of the plan's kind has the same of in the pass,
    made from the plan (the masks, the real blocks) and what `key` names besides (a name, a dtype, the
    position terms the layers share: one object, `PositionTerms`); not the sparse keys' values or DropKey,
    which each layer has its own of. Made by the first layer of the pass that asks, shared by the next ones."""
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


# Whether torch.export is tracing the model (torch >= 2.7; never before, where it is not checked)
is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing (no host-side shortcuts then)."""
    return torch.compiler.is_compiling() or is_exporting()


def folded_blocks(x: torch.Tensor, batch: int, chosen: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """(B or 1, nb, ...) -> (n, ...): every block folded into the batch (n = B * nb), or the `chosen` ones
    ((batch index, block index), as `PaddingPlan.query_blocks` gives them)."""
    x = x.expand(batch, *x.shape[1:])
    return x.flatten(0, 1) if chosen is None else x[chosen]


def block_additive_mask(job: TokenAttention) -> torch.Tensor:
    """The additive mask of each block over its keys, position terms included: (B, nb, 1 or H, 1 or b, K),
    0 (or the terms) where a key may be attended, finfo.min elsewhere (see `additive_mask`).

    Without gradients, the terms are written piece by piece into the mask (one pass over it); with
    them, joined first, then masked."""
    allowed = block_mask(job) if job.kept is None else job.kept  # (B, nb, 1 or H, 1 or b, K)
    dtype = job.token_queries.dtype
    if job.positions is None:
        return additive_mask(allowed, dtype)
    pieces = block_position_scores(job)
    shape = (
        max(allowed.shape[0], *(piece.shape[0] for piece in pieces)),
        job.num_blocks,
        max(allowed.shape[2], *(piece.shape[2] for piece in pieces)),
        job.pattern.block_size,
    )
    if tracing() or (torch.is_grad_enabled() and any(piece.requires_grad for piece in pieces)):
        return additive_mask(allowed, dtype, torch.cat([piece.expand(*shape, -1) for piece in pieces], dim=-1))
    mask = torch.empty(*shape, allowed.shape[-1], dtype=dtype, device=allowed.device)
    lowest = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    start = 0
    for piece in pieces:
        end = start + piece.shape[-1]
        torch.where(allowed[..., start:end], piece.to(dtype).expand(*shape, -1), lowest, out=mask[..., start:end])
        start = end
    return mask


def folded_mask_parts(
    job: TokenAttention, chosen: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`block_additive_mask`'s parts, not joined, folded into the batch (every block or the `chosen`
    ones, `folded_blocks`): which keys each block may attend, (n, 1 or H, 1 or b, K) bool, and the
    position terms of each segment of its keys, in key order, (n, 1 or H, 1 or b, K_i) in the queries' dtype
    (broadcast views where they do not vary between blocks)."""
    allowed = block_mask(job) if job.kept is None else job.kept  # (B, nb, 1 or H, 1 or b, K)
    batch, num_blocks, dtype = job.token_keys.shape[0], job.num_blocks, job.token_queries.dtype
    pieces = block_position_scores(job)  # (B or 1, nb or 1, 1 or H, 1 or b, K_i)
    pieces = [folded_blocks(piece.to(dtype).expand(batch, num_blocks, *piece.shape[2:]), batch, chosen) for piece in pieces]
    return folded_blocks(allowed, batch, chosen), pieces


class BlockTable(NamedTuple):
    """Where each block's queries and keys lie in the sequence [g globals | t tokens | compressed keys]
    the block backends gather from (`block_table`).

    columns: (nb, K) int64, each block's keys in key order (`KeyPattern.key_columns`); a key outside
    the sequence (past the tokens, before the first one, beyond a sparse window's edge) reads row 0;
    inside: (nb, K) bool, False for those (they must be masked); query_rows: (nb, b) int64, each block's
    queries (rows past the last token read it: their outputs are dropped).
    """

    columns: torch.Tensor
    inside: torch.Tensor
    query_rows: torch.Tensor


@shape_cached
def block_table(pattern: KeyPattern, num_blocks: int, num_tokens: int, num_compressed: int, device: torch.device) -> BlockTable:
    """The `BlockTable` of an input of `num_tokens` tokens in `num_blocks` blocks and `num_compressed`
    compressed keys: the one table every block backend gathers with, made once per shape and device."""
    columns = pattern.key_columns(torch.arange(num_blocks, device=device), num_tokens, num_compressed)
    inside = columns < pattern.num_global + num_tokens + num_compressed
    query_tokens = torch.arange(num_blocks * pattern.block_size, device=device).clamp(max=num_tokens - 1)
    query_rows = (pattern.num_global + query_tokens).view(num_blocks, pattern.block_size)
    return BlockTable(torch.where(inside, columns, 0), inside, query_rows)


@shape_cached
def causal_key_mask(pattern: KeyPattern, num_keys: int, device: torch.device) -> torch.Tensor:
    """(b, K) bool: which of its `num_keys` keys each row of a causal block sees: the global and sparse keys,
    and the local keys up to its own token (`local_causal_mask`)."""
    return F.pad(local_causal_mask(pattern, device), (num_keys - pattern.local_size, 0), value=True)


def gather_block_rows(
    sequence: torch.Tensor, columns: torch.Tensor, chosen: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """Rows of `sequence` (B, N, H, D) at `columns` (nb, K), one copy: (B nb, H, K, D), or for the
    `chosen` blocks ((batch index, block index) each (n,)) only, (n, H, K, D)."""
    if chosen is None:
        return sequence[:, columns].flatten(0, 1).transpose(1, 2)  # (B, nb, K, H, D) -> (B nb, H, K, D)
    rows, blocks = chosen
    return sequence[rows[:, None], columns[blocks]].transpose(1, 2)  # (n, K, H, D) -> (n, H, K, D)


def put_block_global_keys(
    keys: torch.Tensor, block_global_keys: torch.Tensor, blocks: tuple[torch.Tensor, torch.Tensor] | None
) -> None:
    """Writes each block's own global keys (`TokenAttention.block_global_keys`, (B, nb, g, H, D)) into the first
    g columns of its gathered keys `keys` (n, H, K, D), in place; `blocks`: (batch index, block index) of the n
    blocks, or None: every block (`folded_blocks`)."""
    own = folded_blocks(block_global_keys, block_global_keys.shape[0], blocks)  # (n, g, H, D)
    keys[:, :, : own.shape[1]] = own.transpose(1, 2)


@dataclass
class BlockKeys:
    """Each block's keys gathered for the block backends (sdpa, eager), blocks folded into the batch.

    queries: (n, H, b, D); keys, values: (n, H, K, D) in the order of `KeyPattern.key_columns` (values
    None where not asked for), gathered in one copy each with `block_table`; mask: (n, 1 or H, 1 or b,
    K), additive (DropKey and position terms applied). n = B * nb, or the number of blocks chosen.
    table: the `BlockTable` they were gathered with.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor | None
    mask: torch.Tensor
    table: BlockTable

    @classmethod
    def of(
        cls,
        job: TokenAttention,
        memo: dict | None,
        with_values: bool = True,
        chosen: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> BlockKeys:
        """The blocks of `job`: every block, or the `chosen` ones ((batch index, block index), as
        `PaddingPlan.query_blocks` gives them). The mask is made first, so that the position terms' pieces are
        freed before the keys are gathered; once per forward pass under `memo`, where every layer of the kind
        makes the same one (the memo `lsg_attention.choose_path` gives the path), else (None) in this call."""
        batch = job.token_keys.shape[0]
        make_mask = lambda: folded_blocks(block_additive_mask(job), batch, chosen)  # noqa: E731  (n, ., ., K)
        memo_key = ("block mask", job.positions, job.token_queries.dtype, chosen is None)
        mask = make_mask() if memo is None else made_once(memo, memo_key, make_mask)
        num_compressed = 0 if job.sparse is None else job.sparse.keys.shape[2]
        table = block_table(job.pattern, job.num_blocks, job.num_tokens, num_compressed, job.token_keys.device)
        # the sequences the blocks gather from, [g globals | t tokens | compressed keys], (B, N, H, D) each:
        # the layer's own where there are no sparse keys (no copy)
        key_sequence, value_sequence = job.sequence[1], job.sequence[2]
        if job.sparse is not None:
            key_sequence = torch.cat([key_sequence, job.sparse.keys.transpose(1, 2)], dim=1)
            value_sequence = torch.cat([value_sequence, job.sparse.values.transpose(1, 2)], dim=1) if with_values else None
        keys = gather_block_rows(key_sequence, table.columns, chosen)  # (n, H, K, D)
        if job.block_global_keys is not None:
            put_block_global_keys(keys, job.block_global_keys, chosen)
        # the queries: views of the tokens where the blocks cover them exactly, else gathered (the padding rows
        # reading the last token)
        if job.plan.token_mask.shape[1] == job.num_tokens:
            queries = job.token_queries.unflatten(1, (job.num_blocks, job.pattern.block_size))  # (B, nb, b, H, D)
            queries = folded_blocks(queries, batch, chosen).transpose(1, 2)
        else:
            queries = gather_block_rows(job.sequence[0], table.query_rows, chosen)
        values = gather_block_rows(value_sequence, table.columns, chosen) if with_values else None
        return cls(queries=queries, keys=keys, values=values, mask=mask, table=table)
