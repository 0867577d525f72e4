"""The ``sdpa`` backend of LSG attention: blocks batched through `scaled_dot_product_attention`.

Each block of b token queries gets its keys gathered in one copy from the layer's own sequence with
the one table of where they lie (`lsg_pattern.block_table`, `BlockKeys`), and the blocks run as one
batch of 4D inputs, (B * nb, H, b, D), so that SDPA's fused kernels run forward and backward (5D
inputs, and its own dropout, fall back to the O(n^2) math kernel: dropout is DropKey, drawn by the
core). Position terms join the additive mask; the blocks whose mask is all zero run without it
(`mask_runs`). The blocks of a padded batch that hold padding only are left out
(`PaddingPlan.real_blocks`). The default backend, on the CPU and on CUDA.

An input whose every key is seen (no padding, sparse keys, DropKey or position terms), the common
training and inference call, has masks that depend on its shape only (`ShapeBlocks`, made once per
shape): its middle blocks run in one SDPA call without a mask, its edge blocks in one with theirs, and
the core joins their outputs with the global queries' in one copy. No mask is read or built per layer,
and nothing waits on the device. That is the path of CUDA.

On the CPU, in every precision (without sparse keys, DropKey, a causal mask or position terms other
than a table's, which are the same over every block's local keys: T5's and MPNet's bias, and those
without gradients only), the blocks whose window holds real tokens only read their local keys as
overlapping views of the layer's keys, with no copy (`window_view_forward`): without gradients rounded
up to `KEY_MULTIPLE` keys with masked rows, and blocks of 161 to 191 queries run as 192 rows, the
kernel's wider tiles (`kernel_query_rows`). The global keys join through the log-sum-exp of each part
(`local_then_global`). The few others (at the edges, beside padding: `EdgeBlocks`) gather their own
queries and keys, the global ones among them, and run one kernel call with their mask. The edge blocks'
and the global queries' outputs are written into the one output of the layer
(`TokenOutput.is_layer_output`), which the core does not join again. Which blocks are viewed and which
are edges is the forward pass's plan (`padding_window_views`, made with its `PaddingPlan`). In training
the same forward runs through `WindowViewAttention`, whose backward runs the kernel's own and gathers the
edge blocks' keys again: no gathered copy is kept for the backward pass, and the output it keeps for its backward is the
layer's. A training call then keeps what dense SDPA keeps, and a second log-sum-exp per query.

Position terms being trained (T5's bias table, MPNet's, DeBERTa's projections) give the mask a gradient,
which SDPA computes with its math kernel only, keeping each block's gathered keys and values: on the
CPU those blocks run through `TrainedTermsAttention` instead, which reads each segment of a block's keys
(`KeyPattern.key_windows`: the global tokens, each sparse window, the local window) as a view of its
sequence, forward and backward, and keeps the softmax's weights and the layer's own keys.

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_pattern and
lsg_transformers only.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Iterator

import torch

from .lsg_pattern import (
    BlockKeys,
    KeyPattern,
    KeyWindow,
    block_table,
    folded_mask_parts,
    gather_block_rows,
    put_block_global_keys,
    local_causal_mask,
    shape_cached,
    TokenAttention,
    TokenOutput,
    additive_mask,
    fused_attention,
    local_windows,
    made_once,
    pad_rows,
    sdpa_dense_attention,
    shared_local_scores,
    token_global_scores,
    tracing,
)
from .lsg_transformers import CPU_FLASH_ATTENTION, CPU_FLASH_ATTENTION_BACKWARD

# The CPU flash kernel (CPU_FLASH_ATTENTION, absent from older torch builds) runs key counts of a multiple
# of 16 fastest (its vector width; measured: docs/benchmarks.md, "lsg_sdpa.KEY_MULTIPLE"):
# window views round the local keys up with the rows that follow, masked
KEY_MULTIPLE = 16
# It splits a call's queries into tiles of 32 rows below 192 of them and of 64 from 192 on, and each tile
# has a cost of its own besides its rows' (packing its keys and values): window views give it blocks of
# 161 to 191 queries as 192 rows, the block's own then those that follow it, whose outputs are dropped
# (3 tiles of 64 instead of 6 of 32; measured: docs/benchmarks.md, "lsg_sdpa.WIDE_TILE_QUERIES")
WIDE_TILE_QUERIES = 192


class SdpaBackend:
    """The dense attention of the sdpa backend (inputs of at most two blocks, the global queries); its paths
    for the token queries are the functions below that `lsg_attention.choose_path` chooses."""

    name = "sdpa"
    returns_weights = False
    dense_attention = staticmethod(sdpa_dense_attention)


def window_view_token_attention(job: TokenAttention, plan: WindowViewPlan) -> TokenOutput:
    """The window-view path (`lsg_attention.choose_path`): the layer's output (`window_view_forward`), into
    which the edge blocks' and the global queries' outputs are written; in training through
    `WindowViewAttention`."""
    if job.training:
        output = WindowViewAttention.apply(
            job.token_queries, job.sequence[1], job.sequence[2], job.global_output, job.block_global_keys, job, plan
        )
    else:
        output, _ = window_view_forward(job, plan, exact=False)
    return TokenOutput(output, None, is_layer_output=True)


def window_view_forward(job: TokenAttention, plan: WindowViewPlan, exact: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The layer's output (B, g + t, H, D) on the window-view path, and each query's log-sum-exps: over its
    local keys and over its global keys per run of viewed blocks, (n, H, b) each, then the edge blocks', (e,
    H, b). The global queries' output goes in its first rows; each run of blocks whose local keys are all
    real (`WindowViewPlan.viewed_runs`) reads its queries and local keys as overlapping views of the layer's
    (`run_views`), no copy, and joins its global keys (`local_then_global`); the edge blocks run one kernel
    call (`EdgeBlocks.attend_into`); the rows of blocks of padding only are zero.

    Without gradients (not `exact`) each block's queries are `kernel_query_rows` rows and its local keys
    are rounded up with the `extra_keys` rows after them, masked, the kernel's faster shapes, and position
    terms (a table's) join through masks shared by every block (`view_masks`);
    `exact` (training, `WindowViewAttention`, whose backward reads the same views without terms): b rows
    over the local keys alone."""
    pattern, scaling, block_global_keys = job.pattern, job.scaling, job.block_global_keys
    num_global, block = pattern.num_global, pattern.block_size
    queries, keys, values = job.token_queries, job.sequence[1], job.sequence[2]
    rows, size = (block, pattern.local_size) if exact else (plan.query_rows, plan.key_rows)
    local_mask, global_mask = (None, None) if exact else view_masks(job, rows, size)
    shape = (*keys.shape[:3], values.shape[-1])
    output = queries.new_empty(shape) if plan.every_block else queries.new_zeros(shape)  # (B, g + t, H, D)
    if job.global_output is not None:
        output[:, :num_global] = job.global_output
    local_lses, global_lses = [], []  # (n, H, b) per run
    for row, start, end in plan.viewed_runs:
        run_queries, run_keys, run_values = run_views(
            pattern, queries[row], keys[row, num_global:], values[row, num_global:], start, end, rows, size
        )  # (n, H, rows, D), (n, H, size, D) each
        first = num_global + start * block
        run_output = output[row, first : first + (end - start) * block].unflatten(0, (-1, block))  # (n, b, H, D)
        run_global_mask = None if global_mask is None else global_mask[:, :, start * block : end * block]
        local_lse, global_lse = local_then_global(
            run_queries, run_keys, run_values, local_mask, *run_global_keys(keys, values, block_global_keys, pattern, row, start, end),
            scaling, run_output, run_global_mask,
        )  # fmt: skip
        local_lses.append(local_lse)
        if global_lse is not None:
            global_lses.append(global_lse)
    lses = local_lses + global_lses
    if plan.edges is not None:
        mask = edge_mask(job, plan.edges)
        lses.append(plan.edges.attend_into(output, queries, keys, values, mask, scaling, block_global_keys))
    return output, lses


def gathered_token_attention(job: TokenAttention, memo: dict | None) -> TokenOutput:
    """The gathered path: every block that holds a real token (`PaddingPlan.query_blocks`) gets its keys
    gathered (`BlockKeys`) and runs through SDPA, the runs of blocks without a masked key without a mask
    (`mask_runs`); their mask and runs made once under `memo`, the forward pass's where every layer of the
    kind has the same (`lsg_attention.choose_path`), else (None) in this call."""
    chosen = job.plan.query_blocks  # None: every block
    blocks = BlockKeys.of(job, memo, chosen=chosen)
    queries, keys, values, mask = blocks.queries, blocks.keys, blocks.values, blocks.mask
    output = queries.new_empty(queries.shape[0], job.pattern.block_size, queries.shape[1], values.shape[-1])
    memo_key = ("mask runs", job.positions, chosen is None)
    runs = mask_runs(mask) if memo is None else made_once(memo, memo_key, lambda: mask_runs(mask))
    for start, end, masked in runs:
        output[start:end] = fused_attention(
            queries[start:end], keys[start:end], values[start:end], mask[start:end] if masked else None, job.scaling
        ).transpose(1, 2)
    return blocks_token_output(job, chosen, output)


def trained_terms_token_attention(job: TokenAttention) -> TokenOutput:
    """The path of position terms being trained on the CPU: the blocks that hold a real token through
    `TrainedTermsAttention`, which reads each segment of their keys as a view, forward and backward."""
    chosen = job.plan.query_blocks  # None: every block
    allowed, position_scores = folded_mask_parts(job, chosen)
    layout, sources = window_layout(job)
    output = TrainedTermsAttention.apply(
        job.padded()[0], allowed, layout, chosen_runs(job, chosen), job.scaling, *sources, *position_scores
    )  # (n, H, b, D)
    return blocks_token_output(job, chosen, output.transpose(1, 2))


def blocks_token_output(job: TokenAttention, chosen: tuple[torch.Tensor, torch.Tensor] | None, output: torch.Tensor) -> TokenOutput:
    """The token queries' output (B, t, H, D) from the `output` (n, b, H, D) of every block, or of the `chosen`
    ones ((batch index, block index)), the blocks of padding only left as zeros."""
    batch, padded_tokens, heads = job.token_queries.shape[0], job.plan.token_mask.shape[1], job.token_queries.shape[2]
    if chosen is not None:
        shape = (batch, job.num_blocks, job.pattern.block_size, heads, job.token_values.shape[-1])
        output = output.new_zeros(shape).index_put_(chosen, output)
    output = output.reshape(batch, padded_tokens, heads, -1)[:, : job.num_tokens]
    return TokenOutput(output, None)


@dataclass(frozen=True)
class WindowLayout:
    """How `TrainedTermsAttention` reads each block's keys: `windows`, the `KeyPattern.key_windows` in key
    order, their rows counted in their sequences padded with `padding` (before, after) zero rows, so that
    every block's window lies inside; `sources`: the index of each window's sequence (the global tokens,
    the tokens, the compressed keys, in the order of their first window)."""

    windows: tuple[KeyWindow, ...]
    sources: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]

    def padded(self, sequences: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
        """The keys and values of each sequence (B, L_i, H, D), keys then values, padded and in `dtype`."""
        return [pad_rows(x.to(dtype), *self.padding[index // 2]) for index, x in enumerate(sequences)]

    def unpadded(self, grads: list[torch.Tensor], sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """The rows of the padded sequences' gradients that are the `sequences`' own, in their dtypes."""
        return [
            grad[:, self.padding[index // 2][0] : self.padding[index // 2][0] + x.shape[1]].to(x.dtype)
            for index, (grad, x) in enumerate(zip(grads, sequences))
        ]


def window_layout(job: TokenAttention) -> tuple[WindowLayout, tuple[torch.Tensor, ...]]:
    """`job`'s `WindowLayout`, and the keys and values of each of its sequences in turn, (B, L_i, H, D) each
    (the compressed keys (B, H, T / f, D) transposed, a view)."""
    windows, num_blocks = job.pattern.key_windows(), job.num_blocks
    sequences = {"global": (job.global_keys, job.global_values), "local": (job.token_keys, job.token_values)}
    if job.sparse is not None:
        sequences["sparse"] = (job.sparse.keys.transpose(1, 2), job.sparse.values.transpose(1, 2))
    padding: dict[str, tuple[int, int]] = {}  # rows before and after each sequence, in the order of first use
    for window in windows:
        before, after = padding.get(window.source, (0, 0))
        last = window.first + (num_blocks - 1) * window.step + window.width
        padding[window.source] = max(before, -window.first), max(after, last - sequences[window.source][0].shape[1])
    names = list(padding)
    layout = WindowLayout(
        windows=tuple(dataclasses.replace(window, first=window.first + padding[window.source][0]) for window in windows),
        sources=tuple(names.index(window.source) for window in windows),
        padding=tuple(padding.values()),
    )
    return layout, tuple(x for name in names for x in sequences[name])


def chosen_runs(
    job: TokenAttention, chosen: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[tuple[int, int, int, int], ...]:
    """(row, start, end, at) of each run of consecutive blocks [start, end) of batch row `row` among every
    block (row by row) or the `chosen` ones (`PaddingPlan.query_blocks`, in that order, as `nonzero` gives
    them), `at` the index of its first block among them."""
    batch, num_blocks = job.token_keys.shape[0], job.num_blocks
    if chosen is None:
        return tuple((row, 0, num_blocks, row * num_blocks) for row in range(batch))

    def runs() -> tuple[tuple[int, int, int, int], ...]:
        flags = torch.zeros(batch, num_blocks, dtype=torch.bool, device=chosen[0].device)
        flags[chosen] = True
        found = block_runs(flags)
        starts = itertools.accumulate((end - start for _, start, end in found), initial=0)
        return tuple((row, start, end, at) for (row, start, end), at in zip(found, starts))

    return made_once(job.plan.memo, "chosen runs", runs)


def window_views(sequence: torch.Tensor, window: KeyWindow, start: int, end: int) -> torch.Tensor:
    """The `window`'s rows of `sequence` (L, H, D) for blocks [start, end), as views: (n, width, H, D)."""
    if not window.step:
        return sequence[window.first : window.first + window.width].expand(end - start, -1, -1, -1)
    first = window.first + start * window.step
    last = window.first + (end - 1) * window.step + window.width
    return sequence[first:last].unfold(0, window.width, window.step).permute(0, 3, 1, 2)


def add_windows(sequence_grad: torch.Tensor, window: KeyWindow, start: int, end: int, window_grads: torch.Tensor) -> None:
    """Adds the gradients of the `window`'s rows for blocks [start, end), (n, width, H, D), to the rows of
    `sequence_grad` (L, H, D) they were read from: windows overlap, so in slices no wider than the step,
    which do not."""
    if not window.step:
        sequence_grad[window.first : window.first + window.width] += window_grads.sum(dim=0)
        return
    for offset in range(0, window.width, window.step):
        width = min(window.step, window.width - offset)
        chunk = dataclasses.replace(window, first=window.first + offset, width=width)
        window_views(sequence_grad, chunk, start, end).add_(window_grads[:, offset : offset + width])


def block_rows(x: torch.Tensor, start: int, end: int, block: int, head: int) -> torch.Tensor:
    """Rows (T, H, D) of blocks [start, end) at one head, as a view: (n, b, D)."""
    return x[start * block : end * block].unflatten(0, (-1, block))[:, :, head]


class TrainedTermsAttention(torch.autograd.Function):
    """softmax(q k^T * scaling + position terms, masked) v of blocks of queries whose position terms are
    being trained (T5's bias table, MPNet's, DeBERTa's projections), on the CPU, without a copy of the
    blocks' keys: each segment of a block's keys (`KeyWindow`: the global tokens, each sparse window, the
    local window) is a view of its sequence, and each head's scores of a run of blocks over a segment are
    one batched product written into that segment's columns. SDPA computes a mask's gradient with its math
    kernel only, which keeps each block's gathered keys and values (every key three times and more). Kept
    here for the backward pass: the layer's queries, keys and values (each sequence is padded to its
    windows again in the backward), the position terms, the output and each query's log-sum-exp, from
    which the backward makes the softmax's weights again (as flash attention does: no (n, H, b, K) tensor
    is kept). The position terms are added to the scores segment by segment and their gradients read
    from the scores' gradient: no additive mask is made.

    queries: (B, T, H, D), the token queries padded to whole blocks; allowed: (n, 1 or H, 1 or b, K) bool,
    the keys each query may attend; layout: where each segment's keys lie (`window_layout`), the last
    segment the local window; runs: (row, start, end, at) of each run of blocks (`chosen_runs`);
    tensors: the keys and values of each of the layout's sequences in turn, (B, L_i, H, D) each, then the
    position terms of each segment of the keys, in key order, (n, 1 or H, 1 or b, K_i)
    (`folded_mask_parts`). Returns (n, H, b, D).
    """

    @staticmethod
    def forward(ctx, queries, allowed, layout: WindowLayout, runs, scaling: float, *tensors):
        num_sequences = 2 * len(layout.padding)
        sequences, position_scores = tensors[:num_sequences], tensors[num_sequences:]
        dtype = torch.promote_types(queries.dtype, torch.float32)  # as SDPA's math kernel: float32 at least
        padded, queries_cast = layout.padded(list(sequences), dtype), queries.to(dtype)
        hidden = allowed.logical_not()
        numerators = block_scores(queries_cast, padded, layout, runs, scaling, position_scores, hidden)  # (n, H, b, K)
        largest = numerators.amax(dim=-1, keepdim=True)
        sums = numerators.sub_(largest).exp_().sum(dim=-1, keepdim=True)  # in place: exp(scores - largest)
        heads = queries.shape[2]
        output = queries_cast.new_empty(*numerators.shape[:3], sequences[1].shape[-1])  # (n, H, b, D)
        for (row, start, end, at), head, source, window, segment in run_segments(runs, heads, layout):
            values = window_views(padded[2 * source + 1][row], window, start, end)[:, :, head]  # (m, w, D)
            head_output, head_weights = output[at : at + end - start, head], numerators[at : at + end - start, head, :, segment]
            if window is layout.windows[-1]:  # the local window, first: written, the others added
                torch.bmm(head_weights, values, out=head_output)
            else:
                head_output.baddbmm_(head_weights, values)
        output.div_(sums)  # the softmax's division, on the D columns of the output rather than the K of the weights
        log_sums = sums.log_().add_(largest)  # (n, H, b, 1): the weights are exp(scores - log_sums)
        ctx.save_for_backward(queries, hidden, output, log_sums, *sequences, *position_scores)
        ctx.layout, ctx.runs, ctx.scaling, ctx.num_sequences = layout, runs, scaling, num_sequences
        ctx.terms_shapes = [(terms.shape, terms.dtype) for terms in position_scores]
        return output.to(queries.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        queries, hidden, output, log_sums, *tensors = ctx.saved_tensors
        sequences, position_scores = tensors[: ctx.num_sequences], tensors[ctx.num_sequences :]
        layout, runs, scaling, dtype = ctx.layout, ctx.runs, ctx.scaling, log_sums.dtype
        heads, block = queries.shape[2], layout.windows[-1].step
        padded, queries_cast = layout.padded(sequences, dtype), queries.to(dtype)
        weights = block_scores(queries_cast, padded, layout, runs, scaling, position_scores, hidden)
        weights.sub_(log_sums).exp_()  # the forward's softmax again, from its scores made again
        grad_output = grad_output.to(dtype)
        grad_weights = torch.empty_like(weights)  # (n, H, b, K)
        for (row, start, end, at), head, source, window, segment in run_segments(runs, heads, layout):
            values = window_views(padded[2 * source + 1][row], window, start, end)[:, :, head]  # (m, w, D)
            blocks = slice(at, at + end - start)
            product_into(grad_weights[blocks, head, :, segment], grad_output[blocks, head], values.transpose(1, 2))
        # the softmax's backward, in place: w (dw - sum_k w_k dw_k), the sum read from the output (dO . O)
        grad_scores = grad_weights.sub_((grad_output * output).sum(dim=-1, keepdim=True)).mul_(weights)  # (n, H, b, K)
        needs = ctx.needs_input_grad
        terms_needs = needs[5 + len(sequences) :]
        grad_terms = [None] * len(ctx.terms_shapes)
        if any(terms_needs):
            # a masked key's weight is 0, and so its gradient, but in a query row whose every key is masked
            if tracing() or bool(hidden.all(dim=-1).any()):
                grad_scores = grad_scores.masked_fill_(hidden, 0)
            segments = key_segments([shape[-1] for shape, _ in ctx.terms_shapes])
            grad_terms = [
                grad_scores[..., segment].sum_to_size(shape).to(terms_dtype) if need else None
                for segment, (shape, terms_dtype), need in zip(segments, ctx.terms_shapes, terms_needs)
            ]
        if scaling != 1:
            grad_scores.mul_(scaling)
        # (B, H, T, D): every block's rows written where the runs cover them, else zero outside them
        covered = sum(end - start for _, start, end, _ in runs) * block == queries.shape[0] * queries.shape[1]
        allocate = queries_cast.new_empty if covered else queries_cast.new_zeros
        grad_queries = allocate(queries.shape[0], heads, queries.shape[1], queries.shape[3])
        for (row, start, end, at), head, source, window, segment in run_segments(runs, heads, layout):
            keys = window_views(padded[2 * source][row], window, start, end)[:, :, head]  # (m, w, D)
            head_grad_scores = grad_scores[at : at + end - start, head, :, segment]
            head_grad_queries = grad_queries[row, head, start * block : end * block].unflatten(0, (-1, block))  # (m, b, D)
            if window is layout.windows[-1]:
                torch.bmm(head_grad_scores, keys, out=head_grad_queries)
            else:
                head_grad_queries.baddbmm_(head_grad_scores, keys)
        grad_padded = [torch.zeros_like(x) for x in padded]
        columns = key_segments([window.width for window in layout.windows])
        for row, start, end, at in runs:
            blocks = slice(at, at + end - start)
            for source, window, segment in zip(layout.sources, layout.windows, columns):
                # the gradients of each block's window of rows, (H, m, w, D), then added to the rows read
                grad_keys, grad_values = (
                    x.new_empty(heads, end - start, window.width, x.shape[-1]) for x in padded[2 * source : 2 * source + 2]
                )
                for head in range(heads):
                    head_grad_scores = grad_scores[blocks, head, :, segment]  # (m, b, w)
                    block_queries = block_rows(queries_cast[row], start, end, block, head)
                    torch.bmm(head_grad_scores.transpose(1, 2), block_queries, out=grad_keys[head])
                    head_weights = weights[blocks, head, :, segment].transpose(1, 2)
                    torch.bmm(head_weights, grad_output[blocks, head], out=grad_values[head])
                add_windows(grad_padded[2 * source][row], window, start, end, grad_keys.permute(1, 2, 0, 3))
                add_windows(grad_padded[2 * source + 1][row], window, start, end, grad_values.permute(1, 2, 0, 3))
        grad_sequences = [
            grad if need else None for grad, need in zip(layout.unpadded(grad_padded, sequences), needs[5:])
        ]
        grad_queries = grad_queries.transpose(1, 2).to(queries.dtype) if needs[0] else None
        return grad_queries, None, None, None, None, *grad_sequences, *grad_terms


def block_scores(
    queries: torch.Tensor,
    padded: list[torch.Tensor],
    layout: WindowLayout,
    runs: tuple[tuple[int, int, int, int], ...],
    scaling: float,
    position_scores: list[torch.Tensor],
    hidden: torch.Tensor,
) -> torch.Tensor:
    """`TrainedTermsAttention`'s scores of each block over its keys, (n, H, b, K): q k^T * scaling plus the
    position terms, the `hidden` keys (n, 1 or H, 1 or b, K) at finfo.min. queries: (B, T, H, D) and the
    `padded` sequences in the scores' dtype."""
    heads, block = queries.shape[2], layout.windows[-1].step
    scores = queries.new_empty(hidden.shape[0], heads, block, hidden.shape[-1])
    for (row, start, end, at), head, source, window, segment in run_segments(runs, heads, layout):
        keys = window_views(padded[2 * source][row], window, start, end)[:, :, head]  # (m, w, D)
        block_queries = block_rows(queries[row], start, end, block, head)  # (m, b, D)
        product_into(scores[at : at + end - start, head, :, segment], block_queries, keys.transpose(1, 2))
    if scaling != 1:
        scores.mul_(scaling)
    for segment, terms in zip(key_segments([terms.shape[-1] for terms in position_scores]), position_scores):
        scores[..., segment].add_(terms)
    for start, end, masked in mask_runs(hidden):  # the blocks that hide keys (at the edges, beside padding)
        if masked:
            scores[start:end].masked_fill_(hidden[start:end], torch.finfo(scores.dtype).min)
    return scores


def product_into(out: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> None:
    """Writes the batched product first @ second, (m, r, c), into `out`, a view whose rows are not
    contiguous (columns of wider scores): through a product of its own, then copied, which runs on every
    thread (at::bmm writes such an `out` on one; measured: docs/benchmarks.md, "lsg_sdpa.product_into")."""
    out.copy_(torch.bmm(first, second))


def run_segments(
    runs: tuple[tuple[int, int, int, int], ...], heads: int, layout: WindowLayout
) -> Iterator[tuple[tuple[int, int, int, int], int, int, KeyWindow, slice]]:
    """Each (run of blocks, head, the window's sequence, window, its columns among the keys), runs outermost,
    the local window first (products summed over the windows write it, then add the others')."""
    segments = list(zip(layout.sources, layout.windows, key_segments([window.width for window in layout.windows])))
    segments = segments[-1:] + segments[:-1]
    for run, head in itertools.product(runs, range(heads)):
        yield from ((run, head, *segment) for segment in segments)


def key_segments(widths: list[int]) -> list[slice]:
    """The slices of the keys that consecutive segments of `widths` keys cover, in key order."""
    ends = list(itertools.accumulate(widths))
    return [slice(end - width, end) for end, width in zip(ends, widths)]


@dataclass(frozen=True)
class ShapeBlocks:
    """How the blocks of an input of a given shape whose every key may be seen run: the blocks whose keys
    all lie inside the sequence, a run in the middle (`unmasked`, blocks [start, end), or None), without
    a mask, SDPA's fastest path; the others (at the edges; causal: every block) with theirs.

    edge_columns: (e, K) the edge blocks' keys' rows in the layer's sequence; edge_queries:
    (e, b) their queries' rows in it (rows past the last token read it: their outputs are dropped);
    edge_mask: (B e, 1, 1 or b, K) additive; unmasked_columns: (n, K) the middle blocks' keys' rows;
    edge_rows: the rows of the layer's output (g + t rows) that the edge blocks' outputs of tokens go to,
    in their order (those before the middle run, then those after it; not the rows past the last token).
    """

    edge_columns: torch.Tensor
    edge_queries: torch.Tensor
    edge_mask: torch.Tensor
    unmasked: tuple[int, int] | None
    unmasked_columns: torch.Tensor | None
    edge_rows: torch.Tensor


@shape_cached
def shape_blocks(
    pattern: KeyPattern, batch: int, num_blocks: int, num_tokens: int, dtype: torch.dtype, device: torch.device
) -> ShapeBlocks:
    """The `ShapeBlocks` of an input of `batch` rows of `num_tokens` tokens: made once per shape and shared
    by the layers."""
    block = pattern.block_size
    table = block_table(pattern, num_blocks, num_tokens, 0, device)
    allowed = table.inside[:, None, :]  # (nb, 1, K)
    if pattern.causal:  # (nb, b, K): the local keys up to each query
        local = allowed[..., -pattern.local_size :] & local_causal_mask(pattern, device)
        allowed = torch.cat([allowed[..., : -pattern.local_size].expand(-1, block, -1), local], dim=-1)
    # the blocks whose window lies inside the tokens, [first, last]: none when causal (a block sees its own
    # keys up to each query only)
    first, last = pattern.blocks_before, num_tokens // block - 1 - pattern.blocks_after
    run = None if pattern.causal or last < first else (first, last + 1)
    unmasked = range(*run) if run else range(0)
    edges = torch.tensor([index for index in range(num_blocks) if index not in unmasked], dtype=torch.long, device=device)
    # (B e, 1, 1 or b, K)
    edge_mask = additive_mask(allowed[edges][None, :, None].expand(batch, -1, -1, -1, -1).flatten(0, 1), dtype)
    token_rows = torch.arange(pattern.num_global, pattern.num_global + num_tokens, device=device)
    return ShapeBlocks(
        edge_columns=table.columns[edges],
        edge_queries=table.query_rows[edges],
        edge_mask=edge_mask,
        unmasked=run,
        unmasked_columns=None if run is None else table.columns[run[0] : run[1]],
        edge_rows=token_rows if run is None else torch.cat([token_rows[: run[0] * block], token_rows[run[1] * block :]]),
    )


def unmasked_attention(job: TokenAttention) -> TokenOutput:
    """The token queries' output of an input whose every key may be seen (`lsg_attention.choose_path`), as
    pieces (B, t_i, H, D) in token order for the core to join: the middle blocks in one SDPA call without a
    mask, the edge blocks in one with theirs, each block's keys gathered from the layer's sequence in one
    copy (`gather_block_rows`): where the window views do not run (on CUDA, while tracing, a causal mask)."""
    pattern, queries = job.pattern, job.token_queries
    batch, _, heads, _ = queries.shape
    block = pattern.block_size
    plan = shape_blocks(pattern, batch, job.num_blocks, job.num_tokens, queries.dtype, queries.device)
    query_sequence, keys, values = job.sequence  # (B, g + t, H, D) each

    def run(block_queries, columns, mask) -> torch.Tensor:  # (B n, H, b, D) -> (B, n b, H, D)
        output = fused_attention(block_queries, gather_block_rows(keys, columns), gather_block_rows(values, columns), mask, job.scaling)
        return output.transpose(1, 2).reshape(batch, -1, heads, output.shape[-1])

    edge_queries = gather_block_rows(query_sequence, plan.edge_queries)  # (B e, H, b, D)
    edges = run(edge_queries, plan.edge_columns, plan.edge_mask)  # (B, e b, H, D)
    if plan.unmasked is None:
        return TokenOutput(edges[:, : job.num_tokens], None)
    start, end = plan.unmasked
    edge_outputs = edges[:, : len(plan.edge_rows)]  # (B, e b, H, D) -> (B, k, H, D): the tokens' rows
    middle_queries = queries[:, start * block : end * block].unflatten(1, (-1, block)).flatten(0, 1).transpose(1, 2)
    middle = run(middle_queries, plan.unmasked_columns, None)
    # the edge blocks before the middle, those after it
    before, after = edge_outputs.split([start * block, job.num_tokens - end * block], dim=1)
    return TokenOutput((before, middle, after), None)


@dataclass(frozen=True)
class EdgeBlocks:
    """The blocks of a call on the window-view path whose local window reaches outside the sequence or
    over padding (`WindowViewPlan.edges`): each gathers its own queries and keys, the global keys among
    them, in one copy (`gathered`) and runs through one kernel call with its mask; in training the copy is
    made again in the backward pass, not kept for it (`WindowViewAttention`).

    batch, blocks: (e,) each one's batch index and block index; query_rows: (e, b) its queries' rows
    among the tokens (those past the last token read it: their outputs are dropped); key_rows: (e, K) its
    keys' rows in the layer's sequence (g + t rows), in `KeyPattern.key_columns` order; allowed: (e, 1, 1, K)
    bool, the keys each may see (`edge_mask`: additive); kept: the rows of their outputs (e b) that
    are tokens', a slice where those come first, else (k,); dropped: the others, (e b - k,), or None; targets: (batch index, row) of each kept row in the
    layer's output (g + t rows), (k,) each."""

    batch: torch.Tensor
    blocks: torch.Tensor
    query_rows: torch.Tensor
    key_rows: torch.Tensor
    allowed: torch.Tensor
    kept: slice | torch.Tensor
    dropped: torch.Tensor | None
    targets: tuple[torch.Tensor, torch.Tensor]

    def gathered(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_global_keys: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        """The blocks' queries (e, H, b, D) from the token queries (B, t, H, D), and their keys and values
        (e, H, K, D) from the layer's (B, g + t, H, D), one copy each; the first g keys each block's own where
        it has (`block_global_keys` (B, nb, g, H, D))."""
        rows = self.batch[:, None]
        # (e, b or K, H, D) -> (e, H, b or K, D)
        gathered_queries = queries[rows, self.query_rows].transpose(1, 2)
        gathered_keys, gathered_values = (x[rows, self.key_rows].transpose(1, 2) for x in (keys, values))
        if block_global_keys is not None:
            put_block_global_keys(gathered_keys, block_global_keys, (self.batch, self.blocks))
        return gathered_queries, gathered_keys, gathered_values

    def attend_into(
        self, output: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
        mask: torch.Tensor, scaling: float, block_global_keys: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Runs the blocks' one kernel call with `mask` and writes their token rows into the layer's `output`
        (B, g + t, H, D); returns their log-sum-exps (e, H, b)."""
        edge_output, edge_lse = CPU_FLASH_ATTENTION(
            *self.gathered(queries, keys, values, block_global_keys), 0.0, False, attn_mask=mask, scale=scaling
        )  # (e, H, b, D), in the kernel's (e, b, H, D) memory
        output.index_put_(self.targets, edge_output.transpose(1, 2).flatten(0, 1)[self.kept])
        return edge_lse


def edge_blocks(
    pattern: KeyPattern, edges: tuple[torch.Tensor, torch.Tensor], local_mask: torch.Tensor, num_blocks: int, num_tokens: int
) -> EdgeBlocks:
    """The `EdgeBlocks` of the blocks `edges` ((batch index, block index), each (e,)), `local_mask` (e,
    local) bool the local keys each may see, every global key valid."""
    batch, blocks = edges
    block, num_global = pattern.block_size, pattern.num_global
    table = block_table(pattern, num_blocks, num_tokens, 0, batch.device)
    every_global = torch.ones(len(blocks), num_global, dtype=torch.bool, device=batch.device)
    allowed = torch.cat([every_global, local_mask], dim=1)  # (e, K)
    token_rows = (blocks[:, None] * block + torch.arange(block, device=batch.device)).flatten()  # (e b,)
    inside = token_rows < num_tokens
    num_kept = int(inside.sum())
    first_ones = bool(inside[:num_kept].all())
    kept = slice(0, num_kept) if first_ones else inside.nonzero().squeeze(1)
    dropped = None if num_kept == len(inside) else (~inside).nonzero().squeeze(1)
    return EdgeBlocks(
        batch=batch,
        blocks=blocks,
        query_rows=table.query_rows[blocks] - num_global,
        key_rows=table.columns[blocks],
        allowed=allowed[:, None, None, :],
        kept=kept,
        dropped=dropped,
        targets=(batch.repeat_interleave(block)[kept], num_global + token_rows[kept]),
    )


def edge_mask(job: TokenAttention, edges: EdgeBlocks) -> torch.Tensor:
    """The additive mask of the `edges` over their keys, (e, 1 or H, 1 or b, K): 0 where `EdgeBlocks.allowed`,
    plus `job`'s position terms where it has (a table's, the same in every block: `view_masks`); made once
    per forward pass (`made_once` with `PaddingPlan.memo`: the edges are its plan's)."""
    dtype, pattern = job.token_keys.dtype, job.pattern
    if job.positions is None:
        return made_once(job.plan.memo, ("edge mask", None, dtype), lambda: additive_mask(edges.allowed, dtype))

    def make() -> torch.Tensor:
        local_terms, global_terms = view_masks(job, pattern.block_size, pattern.local_size)
        terms = [local_terms.expand(len(edges.blocks), -1, -1, -1)]
        if global_terms is not None:  # (1, H, T, g) -> the edges' rows, (e, H, b, g)
            terms.insert(0, global_terms[0].unflatten(1, (job.num_blocks, pattern.block_size))[:, edges.blocks].transpose(0, 1))
        return additive_mask(edges.allowed, dtype) + torch.cat(terms, dim=-1)

    return made_once(job.plan.memo, ("edge mask", job.positions, dtype), make)


@dataclass(frozen=True)
class WindowViewPlan:
    """How the blocks of a call on the window-view path run (`padding_window_views`). viewed_runs: (row, start,
    end) of each run of blocks whose local window lies inside the sequence and holds real tokens only,
    whose keys `window_view_forward` reads as views; edges: the other blocks that hold a real token, or
    None; every_block: whether every block is computed (else the output starts as zeros, those of the
    blocks of padding only); query_rows, key_rows: the rows of each block's queries and local keys that
    the kernel reads without gradients (`kernel_query_rows`, the local keys and their `extra_keys`)."""

    viewed_runs: list[tuple[int, int, int]]
    edges: EdgeBlocks | None
    every_block: bool
    query_rows: int
    key_rows: int


def padding_window_views(
    pattern: KeyPattern, token_mask: torch.Tensor, global_mask: torch.Tensor, real_blocks: torch.Tensor | None,
    num_tokens: int, no_masked_keys: bool,
) -> WindowViewPlan | None:  # fmt: skip
    """The `WindowViewPlan` of a forward pass's padding (`PaddingPlan.window_views`: its token and global masks,
    real blocks), where the CPU flash kernel (which alone returns each query's log-sum-exp, which joins
    the views' two calls: CUDA gathers) can read the local keys as views: on the CPU, without sparse keys or a
    causal mask, every global key valid, not while tracing, for more than two blocks (the blocked path's);
    else None. Made once per shape where no key is masked."""
    device = token_mask.device
    if CPU_FLASH_ATTENTION is None or device.type != "cpu" or pattern.sparse_starts or pattern.causal or tracing():
        return None
    if num_tokens <= 2 * pattern.block_size:
        return None
    num_blocks = token_mask.shape[1] // pattern.block_size
    if no_masked_keys:
        return unmasked_window_view_plan(pattern, token_mask.shape[0], num_blocks, num_tokens, device)
    if not bool(global_mask.all()):
        return None
    local_mask = torch.cat(local_windows(pattern, token_mask, num_blocks, False), dim=2)  # (B, nb, local)
    return window_view_plan_of(pattern, local_mask, real_blocks, num_tokens)


@shape_cached
def unmasked_window_view_plan(
    pattern: KeyPattern, batch: int, num_blocks: int, num_tokens: int, device: torch.device
) -> WindowViewPlan:
    """The `WindowViewPlan` of an input of `batch` rows of `num_tokens` tokens whose every key may be seen:
    made once per shape and shared by the layers and the forwards that follow."""
    token_mask = (torch.arange(num_blocks * pattern.block_size, device=device) < num_tokens).expand(batch, -1)  # (B, T)
    local_mask = torch.cat(local_windows(pattern, token_mask, num_blocks, False), dim=2)  # (B, nb, local)
    return window_view_plan_of(pattern, local_mask, None, num_tokens)


def window_view_plan_of(
    pattern: KeyPattern, local_mask: torch.Tensor, real_blocks: torch.Tensor | None, num_tokens: int
) -> WindowViewPlan:
    """The `WindowViewPlan` of blocks whose local keys' mask is `local_mask` (B, nb, local) bool (which are
    real tokens), every global key valid, `real_blocks` (B, nb) bool the blocks that hold a real token (None:
    every block)."""
    num_blocks = local_mask.shape[1]
    rounded_ends = pattern.local_end(torch.arange(num_blocks, device=local_mask.device)) + extra_keys(pattern)
    viewed = local_mask.all(dim=-1) & (rounded_ends <= num_tokens)
    computed = torch.ones_like(viewed) if real_blocks is None else real_blocks
    edges = (computed & ~viewed).nonzero(as_tuple=True)
    found = edge_blocks(pattern, edges, local_mask[edges], num_blocks, num_tokens) if edges[0].numel() else None
    size = pattern.local_size + extra_keys(pattern)
    return WindowViewPlan(block_runs(viewed), found, bool(computed.all()), kernel_query_rows(pattern.block_size), size)


def kernel_query_rows(block: int) -> int:
    """The query rows a window view gives the CPU flash kernel for each block of `block` queries:
    `WIDE_TILE_QUERIES` for blocks of 161 to 191 queries (where the wider tiles save more than the extra
    rows cost: docs/benchmarks.md, "lsg_sdpa.WIDE_TILE_QUERIES"), else the block."""
    return WIDE_TILE_QUERIES if WIDE_TILE_QUERIES * 5 // 6 < block < WIDE_TILE_QUERIES else block


def extra_keys(pattern: KeyPattern) -> int:
    """The rows after each local window that round a window view's keys up to `KEY_MULTIPLE`."""
    return -pattern.local_size % KEY_MULTIPLE


def runs_of(flags: list[bool]) -> list[tuple[int, int, bool]]:
    """(start, end, flag) of each run of equal consecutive flags."""
    runs, start = [], 0
    for end in range(1, len(flags) + 1):
        if end == len(flags) or flags[end] != flags[start]:
            runs.append((start, end, flags[start]))
            start = end
    return runs


def block_runs(blocks: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of each run of consecutive True blocks in (B, nb) bool."""
    return [(row, start, end) for row, flags in enumerate(blocks.tolist()) for start, end, flag in runs_of(flags) if flag]


def run_global_keys(
    keys: torch.Tensor, values: torch.Tensor, block_global_keys: torch.Tensor | None, pattern: KeyPattern, row: int,
    start: int, end: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The global keys and values that blocks [start, end) of batch row `row` read, from the layer's `keys` and
    `values` (B, g + t, H, D): (1, g, H, D) each, every block's; where each block has its own global keys
    (`block_global_keys` (B, nb, g, H, D), `TokenAttention.block_global_keys`), (n, g, H, D) each."""
    num_global = pattern.num_global
    global_values = values[row : row + 1, :num_global]
    if block_global_keys is None:
        return keys[row : row + 1, :num_global], global_values
    return block_global_keys[row, start:end], global_values.expand(end - start, -1, -1, -1)


def view_masks(job: TokenAttention, rows: int, size: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The additive masks of the window views, the same in every block, each None where it adds nothing:

    * of every block's `rows` queries over its `size` local keys, (1, H or 1, rows or 1, size): the position
      terms (0 in the rows past b, whose outputs are dropped) and the keys past the local window
      (`extra_keys`) masked;
    * of the token queries over the global keys, (1, H, T, g) for the T tokens padded to whole blocks: the
      position terms.

    With position terms, made once per forward pass (`made_once` with `PaddingPlan.memo`)."""
    dtype, device, terms, pattern = job.token_keys.dtype, job.token_keys.device, job.positions, job.pattern
    extra = size - pattern.local_size
    if terms is None:
        return (extra_keys_mask(pattern.local_size, extra, dtype, device) if extra else None), None

    def make() -> tuple[torch.Tensor, torch.Tensor | None]:
        scores = shared_local_scores(terms, pattern, device).to(dtype)  # (1, H, b, local)
        scores = torch.nn.functional.pad(scores, (0, extra), value=torch.finfo(dtype).min)
        local = torch.nn.functional.pad(scores, (0, 0, 0, rows - pattern.block_size))
        if not pattern.num_global:
            return local, None
        padded_tokens = job.plan.token_mask.shape[1]
        return local, token_global_scores(terms, pattern.num_global, padded_tokens, device).to(dtype)

    return made_once(job.plan.memo, ("view masks", terms, dtype, rows, size), make)


@shape_cached
def extra_keys_mask(local_size: int, extra: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1, 1, 1, local_size + extra) additive: 0 over a local window's keys, finfo.min over the `extra`
    rows after it (`extra_keys`); made once per shape and shared by the layers and the forwards."""
    no_terms = torch.zeros(1, 1, 1, local_size, dtype=dtype, device=device)
    return torch.nn.functional.pad(no_terms, (0, extra), value=torch.finfo(dtype).min)


class WindowViewAttention(torch.autograd.Function):
    """A call in training on the window-view path (`WindowViewPlan`): the runs of blocks whose local windows
    lie inside the sequence and hold real tokens only read their local keys as overlapping views of the
    layer's keys, as `window_view_forward` reads them, with a backward, so that no gathered copy of the
    windows is made or kept for the backward pass (the gathered keys and values are twice the layer's
    keys and values per local block); the few edge blocks (`EdgeBlocks`) gather theirs in the forward
    pass and again in the backward pass, so that no copy is kept either. It writes the edge blocks' and
    the global queries' outputs into its own: the output it keeps for its backward is the layer's whole
    output (`TokenOutput.is_layer_output`), not a part of it that the core would copy again to join.

    Saved: the inputs (the layer's own tensors, which it keeps anyway), the output and each query's
    log-sum-exp over its keys. The backward runs the CPU flash kernel's backward over the local views and
    over the global keys, each with that output and log-sum-exp, which gives the gradients of the softmax
    over every key of the query restricted to those keys (as ring attention takes a softmax's gradients
    part by part), and adds each window's key gradients back to the rows it viewed; and over each edge
    block's gathered keys, its gradients added back to the rows they were gathered from.

    queries: the token queries (B, t, H, D); keys, values: the layer's (B, g + t, H, D), the global tokens'
    first; global_output: the global queries' output (B, g, H, D), or None without global tokens;
    block_global_keys: each block's own global keys (B, nb, g, H, D) (`TokenAttention.block_global_keys`), or
    None (the layer's serve every block): the tensors of `job` that gradients flow to; plan: its blocks
    (`WindowViewPlan`). Returns (B, g + t, H, D) (`window_view_forward`, `exact`)."""

    @staticmethod
    def forward(ctx, queries, keys, values, global_output, block_global_keys, job: TokenAttention, plan: WindowViewPlan):
        output, lses = window_view_forward(job, plan, exact=True)
        ctx.save_for_backward(queries, keys, values, output, block_global_keys, *lses)
        ctx.pattern, ctx.runs, ctx.edges, ctx.scaling = job.pattern, plan.viewed_runs, plan.edges, job.scaling
        ctx.edge_mask = None if plan.edges is None else edge_mask(job, plan.edges)
        ctx.has_global_output = global_output is not None
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        queries, keys, values, output, block_global_keys, *lses = ctx.saved_tensors
        pattern, runs, edges, scaling = ctx.pattern, ctx.runs, ctx.edges, ctx.scaling
        block, size, num_global = pattern.block_size, pattern.local_size, pattern.num_global
        local_lses, global_lses = lses[: len(runs)], lses[len(runs) : 2 * len(runs)] if num_global else []
        grad_queries, grad_keys, grad_values = (torch.zeros_like(x) for x in (queries, keys, values))
        grad_block_global_keys = None if block_global_keys is None else torch.zeros_like(block_global_keys)
        for index, (row, start, end) in enumerate(runs):
            token_keys, token_values = keys[row, num_global:], values[row, num_global:]
            row_queries, row_keys, row_values = run_views(pattern, queries[row], token_keys, token_values, start, end, block, size)
            # (n, H, b, D): the output and its gradient as the kernel laid them out
            first_row = num_global + start * block
            rows = slice(first_row, first_row + (end - start) * block)
            row_output, row_grad = (x[row, rows].unflatten(0, (-1, block)).transpose(1, 2) for x in (output, grad_output))
            # each query's log-sum-exp over all its keys
            lse = torch.logaddexp(local_lses[index], global_lses[index]) if num_global else local_lses[index]
            # the gradients of the softmax over all the queries' keys, at their local keys
            query_grad, key_grad, value_grad = CPU_FLASH_ATTENTION_BACKWARD(
                row_grad, row_queries, row_keys, row_values, row_output, lse, 0.0, False, scale=scaling
            )
            # (n, H, b, D) -> the rows of the blocks' queries
            row_query_grad = grad_queries[row, start * block : end * block].unflatten(0, (-1, block)).transpose(1, 2)
            if block_global_keys is not None:  # at each block's own global keys
                global_keys, global_values = run_global_keys(keys, values, block_global_keys, pattern, row, start, end)
                global_query_grad, global_key_grad, global_value_grad = CPU_FLASH_ATTENTION_BACKWARD(
                    row_grad, row_queries, global_keys.transpose(1, 2), global_values.transpose(1, 2), row_output, lse,
                    0.0, False, scale=scaling,
                )  # fmt: skip
                torch.add(query_grad, global_query_grad, out=row_query_grad)
                grad_block_global_keys[row, start:end] = global_key_grad.transpose(1, 2)  # (n, H, g, D) -> (n, g, H, D)
                grad_values[row, :num_global].add_(global_value_grad.sum(0).transpose(0, 1))
            elif num_global:  # at the global keys: the blocks' queries as one sequence over the row's
                global_query_grad, global_key_grad, global_value_grad = CPU_FLASH_ATTENTION_BACKWARD(
                    *(as_one_sequence(x) for x in (row_grad, row_queries)),
                    *(x[row : row + 1, :num_global].transpose(1, 2) for x in (keys, values)),
                    as_one_sequence(row_output), lse.transpose(0, 1).reshape(1, lse.shape[1], -1), 0.0, False, scale=scaling,
                )  # fmt: skip
                torch.add(query_grad, as_blocks(global_query_grad, block), out=row_query_grad)
                grad_keys[row, :num_global].add_(global_key_grad[0].transpose(0, 1))  # (1, H, g, D) -> (g, H, D)
                grad_values[row, :num_global].add_(global_value_grad[0].transpose(0, 1))
            else:
                row_query_grad.copy_(query_grad)
            # each window's key rows add to the rows it viewed: (n, H, w b, D) -> (n w, b, H, D), into (n + w - 1, b, H, D)
            windowed_rows = slice(num_global + pattern.local_start(start), num_global + pattern.local_start(end - 1) + size)
            window_blocks = window_block_indices(end - start, size // block, keys.device)
            for rows_grad, window_grad in ((grad_keys[row], key_grad), (grad_values[row], value_grad)):
                window_grad = window_grad.transpose(1, 2).reshape(-1, block, *window_grad.shape[1:2], window_grad.shape[-1])
                rows_grad[windowed_rows].unflatten(0, (-1, block)).index_add_(0, window_blocks, window_grad)
        if edges is not None:
            edge_rows = (edges.batch[:, None], num_global + edges.query_rows)  # (e, b) each
            # the output and its gradient at the edge blocks' rows, (e, b, H, D); the rows past the last
            # token (which read it) get no gradient: their keys' and queries' gradients are then zero
            edge_output, edge_grad = output[edge_rows], grad_output[edge_rows]
            if edges.dropped is not None:
                edge_grad.flatten(0, 1)[edges.dropped] = 0
            gathered = edges.gathered(queries, keys, values, block_global_keys)
            query_grad, key_grad, value_grad = CPU_FLASH_ATTENTION_BACKWARD(
                edge_grad.transpose(1, 2), *gathered, edge_output.transpose(1, 2), lses[-1], 0.0, False,
                attn_mask=ctx.edge_mask, scale=scaling,
            )  # fmt: skip
            if block_global_keys is not None:  # the global columns' gradients are those of the blocks' own keys
                grad_block_global_keys.index_put_(
                    (edges.batch, edges.blocks), key_grad[:, :, :num_global].transpose(1, 2), accumulate=True
                )
                key_grad[:, :, :num_global] = 0
            gathered_rows = edges.batch[:, None], edges.key_rows
            grad_queries.index_put_((edges.batch[:, None], edges.query_rows), query_grad.transpose(1, 2), accumulate=True)
            grad_keys.index_put_(gathered_rows, key_grad.transpose(1, 2), accumulate=True)
            grad_values.index_put_(gathered_rows, value_grad.transpose(1, 2), accumulate=True)
        grad_global_output = grad_output[:, :num_global] if ctx.has_global_output else None
        return grad_queries, grad_keys, grad_values, grad_global_output, grad_block_global_keys, None, None


@shape_cached
def window_block_indices(windows: int, blocks_per_window: int, device: torch.device) -> torch.Tensor:
    """(n w,): the block of the windowed rows each block of each window lies at, i + c for block c of
    window i (the windows start a block apart)."""
    return (torch.arange(windows, device=device)[:, None] + torch.arange(blocks_per_window, device=device)).flatten()


def run_views(
    pattern: KeyPattern, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, end: int,
    rows: int, size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """One row's queries, keys and values (t, H, D) of blocks [start, end) as the kernel reads them, as
    overlapping views: each block's `rows` queries from its first (n, H, rows, D), and its `size` local keys
    and values from its `KeyPattern.local_start` (n, H, size, D)."""
    block = pattern.block_size
    first = (start - pattern.blocks_before) * block  # the first local key of block `start` (`KeyPattern.local_start`)
    last_query, last_key = (end - 1) * block + rows, first + (end - 1 - start) * block + size
    # unfold: (m, H, D) -> (n, H, D, width), the width last; transposed to (n, H, width, D)
    return (
        queries[start * block : last_query].unfold(0, rows, block).transpose(2, 3),
        keys[first:last_key].unfold(0, size, block).transpose(2, 3),
        values[first:last_key].unfold(0, size, block).transpose(2, 3),
    )


def as_one_sequence(blocks: torch.Tensor) -> torch.Tensor:
    """Blocks of consecutive rows (n, H, b, D) as one sequence (1, H, n b, D): a view where they lie in
    the layer's (t, H, D) rows, as window views and gathered blocks do."""
    return blocks.transpose(0, 1).flatten(1, 2).unsqueeze(0)


def as_blocks(sequence: torch.Tensor, block: int) -> torch.Tensor:
    """(1, H, n b, ...) -> (n, H, b, ...), a view: the inverse of `as_one_sequence`."""
    return sequence[0].unflatten(1, (-1, block)).transpose(0, 1)


def local_then_global(
    queries,
    keys,
    values,
    mask: torch.Tensor | None,
    global_keys,
    global_values,
    scaling: float,
    out: torch.Tensor,
    global_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of queries (n, H, b, D) over their local keys and values (n, H, local, D) and the g
    global ones (n or 1, g, H, D), written into `out` (n, b, H, D). Queries of more rows than b (see
    `kernel_query_rows`) run through the kernel whole; only their first b rows are kept. `mask`: additive,
    over the local keys, broadcast to (n, H, rows, local); `global_mask`: additive, over the global keys,
    (1, H or 1, n b, g) for global keys of every block (1, g, H, D), else (n, H or 1, b, g). Returns each
    query's log-sum-exp over its local keys and over its global keys (None without global keys), (n, H, b)
    each.

    Each part runs through the CPU flash kernel, which returns its output and its log-sum-exp, L_local
    and L_global. The softmax over both is their outputs weighted by their shares of the total:
    O = O_local + sigmoid(L_global - L_local) (O_global - O_local)."""
    local_output, local_lse = CPU_FLASH_ATTENTION(queries, keys, values, 0.0, False, attn_mask=mask, scale=scaling)
    block = out.shape[1]
    queries, local_output, local_lse = queries[:, :, :block], local_output[:, :, :block], local_lse[:, :, :block]
    if not global_keys.shape[1]:
        out.copy_(local_output.transpose(1, 2))
        return local_lse, None
    global_keys, global_values = global_keys.transpose(1, 2), global_values.transpose(1, 2)  # (n or 1, H, g, D)
    if global_keys.shape[0] == 1:  # every block's: the blocks' queries as one sequence
        global_output, global_lse = CPU_FLASH_ATTENTION(
            as_one_sequence(queries), global_keys, global_values, 0.0, False, attn_mask=global_mask, scale=scaling
        )
        global_output, global_lse = as_blocks(global_output, block), as_blocks(global_lse.unsqueeze(-1), block).squeeze(-1)
    else:
        global_output, global_lse = CPU_FLASH_ATTENTION(
            queries, global_keys, global_values, 0.0, False, attn_mask=global_mask, scale=scaling
        )
    global_share = torch.sigmoid(global_lse - local_lse).to(local_output.dtype).unsqueeze(-1)
    torch.lerp(local_output, global_output, global_share, out=out.transpose(1, 2))
    return local_lse, global_lse


def mask_runs(mask: torch.Tensor) -> list[tuple[int, int, bool]]:
    """The blocks of an additive block mask (n, 1 or H, 1 or b, K), or of a bool one (True: hidden), as
    runs of consecutive ones, (start, end, whether they need the mask): a block whose mask is all zero
    (every key allowed, no position terms: a block away from the edges and the padding) runs SDPA without
    one, the fused kernels' faster path, with the same result. Masks with rows per query (DropKey, a
    causal mask), and additive masks with rows per head (position terms, nowhere zero), are not scanned:
    one run that needs its mask. A bool mask with rows per head (sparse keys selected per head) is: away
    from the edges and the padding its blocks hide no key."""
    per_head_terms = mask.shape[1] != 1 and mask.dtype != torch.bool
    if mask.shape[2] != 1 or per_head_terms or tracing():
        return [(0, mask.shape[0], True)]
    return runs_of(mask.flatten(1).ne(0).any(dim=1).tolist())
