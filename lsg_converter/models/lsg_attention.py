"""LSG attention: Local + Sparse + Global (Condevaux & Harispe, PAKDD 2023), the one shared core.

The sequence seen by every layer is ``g`` global tokens followed by ``t`` real tokens. Each block of
``b`` query tokens attends to

    bidirectional:  [ g global keys | s sparse keys left | s sparse keys right | 3b local keys ]
    causal:         [ g global keys | s sparse keys left | 2b local keys, up to the query itself ]

where the local keys are the previous, own (and next) blocks and the sparse keys are a compressed
copy of the context just outside the local window (lsg_sparse). Global queries attend to everything
(causal: to the global tokens before them). lsg_pattern describes these keys once (`KeyPattern`).

`lsg_attention` is the core: it takes the padding and the global tokens apart, pads the tokens to
whole blocks, compresses the sparse context, draws the dropout once, and hands the token queries to
a backend through one contract (`lsg_pattern.TokenAttention` -> `TokenOutput`); the global queries
then attend to the keys the backend holds. The backends, one file each (`BACKENDS`):

* ``"sdpa"`` (lsg_sdpa): blocks batched through `scaled_dot_product_attention` on 4D tensors, so
  its fused kernels run forward and backward (the default, on the CPU and on CUDA);
* ``"flex_attention"`` (lsg_flex): one `flex_attention` call over a block-sparse mask, compiled;
* ``"eager"`` (lsg_eager): explicit weights, returned as ``output_attentions=True`` asks, O(n^2).

Relative position terms (`lsg_pattern.PositionTerms`), for models whose attention adds them (MPNet,
DeBERTa), are evaluated for the (query, key) pairs each backend evaluates, never as an (L, L) tensor.

In training, attention dropout is DropKey (keys hidden before the softmax, `lsg_pattern.drop_keys`),
which keeps the kernels fused; every backend hides the same keys for the same random state. No tensor
of size ``t x t`` is ever built (except by the eager backend).

This file travels with saved models as remote code: it imports torch, transformers and, of this folder,
lsg_eager, lsg_flex, lsg_pattern, lsg_rotary, lsg_sdpa, lsg_settings, lsg_sparse and lsg_transformers only.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.utils import logging

from .lsg_eager import EagerBackend, eager_token_attention, explicit_softmax, weighted_values
from .lsg_flex import (
    FLEX_ATTENTION_AVAILABLE,
    FLEX_FORWARD_ONLY_DEVICES,
    FlexBackend,
    flex_token_attention,
)
from .lsg_pattern import (
    Backend,
    BackendUnavailable,
    PaddingPlan,
    PositionTerms,
    RowLookup,
    TokenAttention,
    TokenOutput,
    block_dropout,
    causal_mask,
    dense_position_scores,
    drop_keys,
    far_sparse_scores,
    give_padding_plans,
    is_exporting,
    made_once,
    padding_plans_of,
    relative_scores,
    sdpa_dense_attention,
    sequence_positions,
    shape_cached,
    tracing,
)
from .lsg_sdpa import (
    SdpaBackend,
    gathered_token_attention,
    padding_window_views,
    trained_terms_token_attention,
    unmasked_attention,
    window_view_token_attention,
)
from .lsg_rotary import GlobalDistanceClamp
from .lsg_settings import LSGSettings
from .lsg_sparse import sparse_context
from .lsg_transformers import ALL_ATTENTION_FUNCTIONS, CPU_FLASH_ATTENTION_BACKWARD, attn_implementation, shape_check

logger = logging.get_logger(__name__)

# Prefix of the attentions registered with transformers, one per backend. It names this copy of the code
# (the package's, or the remote code of a saved model, each its own module), so that models saved by
# different versions, loaded in one process, each run their own attention: transformers' registry is
# one dictionary, and a shared name would run the copy loaded last for all of them.
LSG_ATTENTION = "lsg_" + hashlib.sha256(__name__.encode()).hexdigest()[:12]
# The backend of a model whose attn_implementation is left unset: chosen per call (`choose_path`).
DEFAULT_BACKEND = "default"
# The shortest input that the default backend runs with flex_attention (`prefers_flex_attention`): measured
# faster than sdpa on CUDA from there (docs/benchmarks.md, "lsg_attention.prefers_flex_attention")
FLEX_MEASURED_FASTER_FROM_TOKENS = 4096


def prefers_flex_attention(device_type: str, dtype: torch.dtype, num_tokens: int, unmasked: bool) -> bool:
    """Whether the default backend runs a call with flex_attention rather than the sdpa backend: on CUDA in
    bfloat16 from `FLEX_MEASURED_FASTER_FROM_TOKENS` tokens on, for an input whose every key is seen and
    whose scores nothing else changes (`unmasked`: no padding, sparse keys, DropKey or position terms: see
    `choose_path`), where its mask reads no tensor. Everywhere else sdpa (on the CPU flex_attention has no
    backward pass). Where it was measured faster, and only there:
    docs/benchmarks.md, "lsg_attention.prefers_flex_attention"."""
    return (
        FLEX_ATTENTION_AVAILABLE
        and device_type == "cuda"
        and dtype == torch.bfloat16
        and num_tokens >= FLEX_MEASURED_FASTER_FROM_TOKENS
        and unmasked
    )


# attn_implementation value -> the backend of its token queries; None -> DEFAULT_BACKEND. Each is registered
# with transformers (`registered_attention`).
# (Imported by name: transformers copies a model's remote code by following `from .module import` lines.)
BACKENDS: dict[str, Backend] = {"eager": EagerBackend(), "sdpa": SdpaBackend(), "flex_attention": FlexBackend()}
LSG_BACKENDS = tuple(BACKENDS)  # the values a user may give, and what an LSG model's config names
BACKENDS[DEFAULT_BACKEND] = BACKENDS["sdpa"]  # its dense attention; its token queries: `choose_path`
# What a config names for a model whose attn_implementation was left unset: transformers' own default.
UNSET_NAME = "sdpa"
# backend -> how its registered name ends. Not "sdpa" nor "flex_attention": transformers runs its support
# checks of those on every name containing them, and a model whose source attention is hand-written (MPNet,
# DeBERTa-v2: LSG swaps it) would refuse them when built, while LSG attention runs every backend itself.
REGISTERED_SUFFIXES = {"eager": "eager", "sdpa": "sdp", "flex_attention": "flex", DEFAULT_BACKEND: "default"}
# The registered name of a backend in any copy of this code (a config may come from another copy's model).
REGISTERED_NAME = re.compile(r"lsg_[0-9a-f]{12}_(?P<suffix>\w+)")


def lsg_backend(attn_implementation: str | None) -> str:
    """The backend an LSG model runs for `attn_implementation`: a value of `LSG_BACKENDS` is itself, a
    registered name (`registered_attention`, what a config holds while its model is built) its backend, None
    `DEFAULT_BACKEND` (chosen per call: `choose_path`); anything else raises ValueError naming the valid values."""
    if attn_implementation is None:
        return DEFAULT_BACKEND
    if attn_implementation in BACKEND_OF_NAME:  # a lookup: every LSG layer asks at every call, compiled too
        return BACKEND_OF_NAME[attn_implementation]
    registered = REGISTERED_NAME.fullmatch(attn_implementation)
    if registered is not None:
        suffixes = {suffix: backend for backend, suffix in REGISTERED_SUFFIXES.items()}
        attn_implementation = suffixes.get(registered["suffix"], attn_implementation)
        if attn_implementation == DEFAULT_BACKEND:  # a name users do not give: only registered
            return DEFAULT_BACKEND
    if attn_implementation not in LSG_BACKENDS:
        choices = ", ".join(f'"{name}"' for name in LSG_BACKENDS)
        raise ValueError(
            f'Specified `attn_implementation="{attn_implementation}"` is not supported by LSG models: use one of '
            f"{choices}, or leave it unset (sdpa, or flex_attention on CUDA where it is faster)."
        )
    if attn_implementation == "flex_attention" and not FLEX_ATTENTION_AVAILABLE:
        raise ValueError(
            f"attn_implementation='flex_attention' needs torch >= 2.6 (installed: {torch.__version__}): "
            "upgrade torch or use attn_implementation='sdpa'."
        )
    return attn_implementation


def public_name(backend: str) -> str:
    """What a config names for `backend`, as transformers names it: the backend itself, `UNSET_NAME` for
    `DEFAULT_BACKEND` (an implementation left unset)."""
    return UNSET_NAME if backend == DEFAULT_BACKEND else backend


def registered_attention(backend: str) -> str:
    """The name under which the attention of an LSG model running `backend` is registered with
    transformers (`registered_attention_forward`): what its attention layers dispatch on (`DispatchConfig`),
    and what its config holds while the model is built (every source class accepts it)."""
    return f"{LSG_ATTENTION}_{REGISTERED_SUFFIXES[backend]}"


# a name a config or a layer holds -> its backend (`lsg_backend`): this copy's registered names, and the
# backends' own names (flex_attention only where torch has it)
BACKEND_OF_NAME = {registered_attention(backend): backend for backend in REGISTERED_SUFFIXES}
BACKEND_OF_NAME.update((name, name) for name in LSG_BACKENDS if name != "flex_attention" or FLEX_ATTENTION_AVAILABLE)


class DispatchConfig:
    """What an attention layer of an LSG model that runs LSG (its ``lsg_role``) holds as its ``config``: the
    model's config, read through, except that ``_attn_implementation`` names the LSG attention registered
    for the backend the model's config names (`registered_attention`), which transformers' layers dispatch on.

    The model's config names "eager", "sdpa" or "flex_attention" as transformers' own models do, and
    ``set_attn_implementation`` (or a change of ``config._attn_implementation``) reaches the layers at their
    next call. `device_default` marks a model whose implementation was left unset: its config names "sdpa",
    transformers' default, and its layers run `DEFAULT_BACKEND`, chosen per call (`choose_path`).
    """

    def __init__(self, config: Any, device_default: bool = False) -> None:
        vars(self).update(model_config=config, device_default=device_default)

    def __getattr__(self, name: str) -> Any:  # only for what this object does not hold itself
        if name.startswith("__") or name in ("model_config", "device_default"):
            raise AttributeError(name)
        return getattr(self.model_config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "device_default":
            vars(self)[name] = value
        else:
            setattr(self.model_config, name, value)

    @property
    def _attn_implementation(self) -> str:
        backend = lsg_backend(attn_implementation(self.model_config))
        if self.device_default and backend == UNSET_NAME:
            backend = DEFAULT_BACKEND
        return registered_attention(backend)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_config!r})"


# --------------------------------------------------------------------------------------------------
# The core
# --------------------------------------------------------------------------------------------------


def lsg_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    settings: LSGSettings | Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    causal: bool = False,
    backend: str = "sdpa",
    position_terms: PositionTerms | None = None,
    padding_plans: dict | None = None,
    global_clamp: GlobalDistanceClamp | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LSG attention over ``g`` global tokens followed by ``t`` tokens.

    Args:
        query: (B, H, q, D): the last q of the g + t positions (q < g + t only when decoding with a cache).
        key, value: (B, H, g + t, D).
        padding_mask: (B, g + t) bool, True for tokens that may be attended; None = no padding.
        settings: the LSG settings (`LSGSettings`), or anything carrying their keys (an LSG config).
        dropout: attention dropout probability, applied as DropKey (see `lsg_pattern.drop_keys`).
        scaling: factor of the scores (default D ** -0.5).
        causal: decoder attention: local window = previous and own block up to the query, sparse keys
            on the left only, global tokens form a causal prefix.
        backend: one of `LSG_BACKENDS`, or `DEFAULT_BACKEND` (one of them per call). Same keys, same
            DropKey draws, same results. Inputs of at most two blocks run plain attention (flex_attention:
            through SDPA), and so do cached decoding steps; flex_attention runs sdpa where it cannot
            (gradients on the CPU, a call its compiled kernel cannot take: see
            `lsg_flex.CompiledFlexAttention`).
        position_terms: relative position score terms (see `lsg_pattern.PositionTerms`), or None.
        padding_plans: the forward pass's `PaddingPlan`s, made where its padding mask was made, by
            (settings, causal, g + t) (`plan_padding`), or None: the call makes its own. Where they hold
            this call's, `padding_mask` is not read.
        global_clamp: an encoder with rotary positions: the clamp of the global tokens' distances to the
            trained length (`lsg_rotary.GlobalDistanceClamp`), or None.
    Returns:
        The output (B, H, q, D), a transposed view of a contiguous (B, q, H, D) tensor, and, with the
        "eager" backend, the weights of the token queries over the tokens, (B, H, q', t) with q' = q - g
        (the global queries and keys left out, as the model's outputs leave out the global tokens):
        zero outside the LSG pattern, a sparse key's weight spread over the tokens it compresses, on
        the output's autograd path. None with the other backends.
    """
    batch, heads, length, head_dim = key.shape
    scaling = head_dim**-0.5 if scaling is None else scaling
    if not isinstance(settings, LSGSettings):  # an LSG config
        settings = LSGSettings.of(settings)
    num_global, block = settings.num_global_tokens, settings.block_size
    num_tokens = length - num_global
    exporting = is_exporting()
    num_queries, rows_kept = query.shape[2], None
    if causal and num_queries < length and BACKENDS[backend].returns_weights:
        # a cached step's weights are those of the last rows of the whole causal pass: run it, keep them
        query = torch.cat([query.new_zeros(batch, heads, length - num_queries, head_dim), query], dim=2)
        num_queries, rows_kept = length, num_queries
    if causal and num_queries < length:  # a cached decoding step: masks of the keys its queries see alone
        output = _cached_step(query, key, value, padding_mask, settings, dropout, scaling, position_terms, padding_plans)
        return output, None
    plan = None if padding_plans is None else padding_plans.get((settings, causal, length))
    if plan is None:  # a mask no recorder made, or a kind of layer its model did not plan for
        plan = padding_plan(padding_mask, settings, causal, batch, length, key.device)
        if padding_plans is not None:
            padding_plans[settings, causal, length] = plan
    # Short input: the local window already covers everything, plain attention is exact. (A program
    # torch.export traces takes the blocked path at every length: the same keys, one graph for all.)
    if not exporting and num_tokens <= 2 * block:
        output, weights = _dense_attention(
            BACKENDS[backend], query, key, value, plan.key_mask, causal, dropout, scaling, position_terms, num_global
        )
        if weights is not None:  # the token block of the weights, on the output's autograd path
            output, weights = weighted_values(weights, value, num_global, global_rows=num_global)
    else:
        if not settings.adaptive and -num_tokens % block:
            raise ValueError(
                f"Input length {num_tokens} is not a multiple of block_size {block}: pad it, or set adaptive=True."
            )
        if exporting:
            shape_check((num_tokens + plan.padding) // block >= 2)
        output, weights = _blocked_attention(
            query, key, value, plan, settings, dropout, scaling, causal, backend, position_terms, global_clamp
        )
    if rows_kept is not None:
        return output[:, :, -rows_kept:], weights[:, :, -rows_kept:]
    return output, weights


def _cached_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    settings: LSGSettings,
    dropout: float,
    scaling: float,
    position_terms: PositionTerms | None,
    padding_plans: dict | None,
) -> torch.Tensor:
    """A cached causal decoding step of q queries (B, H, q, D), the last q of the g + t positions
    (`_cached_causal_attention`): (B, H, q, D); a query in a block of padding only (so far) gets zeros, as
    in a whole pass. The blocks of its queries that hold a real token are found once for the step's layers
    (in `padding_plans`, where the recorder made the mask)."""
    batch, _, num_queries, _ = query.shape
    num_global, block = settings.num_global_tokens, settings.block_size
    num_tokens = key.shape[2] - num_global
    key_mask, _ = _padded_masks(padding_mask, batch, num_global, num_tokens, 0, key.device, settings.mask_first_token)
    step = _cached_causal_attention(
        *(x.transpose(1, 2) for x in (query, key, value)), key_mask, settings, dropout, scaling, position_terms
    )  # (B, q, H, D)
    first = (num_tokens - num_queries) // block * block  # the first block of the step's queries
    real_blocks = made_once(
        padding_plans,
        ("real blocks of a step", settings, first),
        lambda: _real_blocks(padding_mask, num_global, first, -num_tokens % block, block),
    )
    if real_blocks is not None:
        step_blocks = (torch.arange(num_tokens - num_queries, num_tokens, device=query.device) - first) // block
        step = torch.where(real_blocks[:, step_blocks, None, None], step, 0)
    return step.transpose(1, 2)


def _blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: PaddingPlan,
    settings: LSGSettings,
    dropout: float,
    scaling: float,
    causal: bool,
    backend: str,
    position_terms: PositionTerms | None,
    global_clamp: GlobalDistanceClamp | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`lsg_attention` of every one of the g + t queries (B, H, g + t, D), the tokens in blocks: the token
    queries' job (`TokenAttention`) made, with its sparse keys and DropKey; the global queries' output; the
    token queries' path chosen (`choose_path`) and run; the two outputs joined. `plan` holds the call's
    masks (`padding_plan`). Where `global_clamp` moves the global keys of the blocks past the trained length,
    each block gets its own (`block_global_keys`) and the global queries read the tokens' keys rotated back."""
    kernel = BACKENDS[backend]
    heads = key.shape[1]
    num_global, block = settings.num_global_tokens, settings.block_size
    num_tokens = key.shape[2] - num_global
    pattern = plan.pattern
    # Sequence-major (B, L, H, D) views. Split (not slice) into global tokens and tokens: the backward
    # pass then joins the two gradients with one copy instead of zero-filling two full-size ones.
    global_queries, token_queries = query.transpose(1, 2).split([num_global, num_tokens], dim=1)
    global_keys, token_keys = key.transpose(1, 2).split([num_global, num_tokens], dim=1)
    global_values, token_values = value.transpose(1, 2).split([num_global, num_tokens], dim=1)
    job = TokenAttention(
        token_queries=token_queries,
        token_keys=token_keys,
        token_values=token_values,
        global_keys=global_keys,
        global_values=global_values,
        sparse=None,
        pattern=pattern,
        scaling=scaling,
        num_tokens=num_tokens,
        num_blocks=plan.token_mask.shape[1] // block,
        positions=position_terms,
        sequence=(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)),
        plan=plan,
        training=torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad),
        terms_trained=position_terms is not None
        and torch.is_grad_enabled()
        and any(rows.requires_grad for _, rows, _ in position_terms.parts()),
    )
    if pattern.sparse_starts:
        job.sparse = sparse_context(
            *(x.transpose(1, 2) for x in job.padded()),
            plan.token_mask,
            settings,
            scaling,
            key_rows=None if position_terms is None else job.token_key_rows,
            with_positions=position_terms is not None,
            with_token_weights=kernel.returns_weights,
            every_token_valid=plan.no_masked_keys and not plan.padding,
            made_once=functools.partial(made_once, job.plan.memo),
        )
    if dropout:
        job.kept = block_dropout(job, heads, dropout)
    global_query_keys = key
    shifts = None if global_clamp is None or not num_global else global_clamp.block_shifts(job.num_blocks, block, key.device)
    if shifts is not None:
        job.block_global_keys = global_clamp.block_global_keys(global_keys, shifts)
        far_keys = global_clamp.keys_for_global_queries(job.padded()[1], shifts, block)[:, :num_tokens]
        global_query_keys = torch.cat([global_keys, far_keys], dim=1).transpose(1, 2)  # (B, H, g + t, D)

    if num_global:  # every key, causal: the global tokens before them; before the token queries, whose path
        # may write it into the layer's output (`TokenOutput.is_layer_output`)
        every_key = plan.no_masked_keys and not causal and not dropout
        global_output, _ = _dense_attention(
            kernel, global_queries.transpose(1, 2), global_query_keys, value, None if every_key else plan.key_mask, causal,
            dropout, scaling, position_terms, num_global,
        )  # fmt: skip
        job.global_output = global_output.transpose(1, 2)  # (B, g, H, D)
    path, detail = choose_path(backend, job)
    try:
        tokens = PATH_FUNCTIONS[path](job, detail)
    except BackendUnavailable:  # compiled flex_attention cannot take the call after all: sdpa's path runs it
        path, detail = choose_path("sdpa", job)
        tokens = PATH_FUNCTIONS[path](job, detail)
    if tokens.is_layer_output:
        return tokens.output.transpose(1, 2), tokens.weights
    pieces = list(tokens.output) if isinstance(tokens.output, tuple) else [tokens.output]  # (B, t_i, H, D)
    if job.plan.real_rows is not None:  # the rows of blocks of padding only are zero, as the sdpa backend leaves them
        token_output = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        pieces = [torch.where(job.plan.real_rows[:, :, None, None], token_output, 0)]
    if num_global:
        pieces.insert(0, job.global_output)
    output = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)  # (B, g + t, H, D)
    return output.transpose(1, 2), tokens.weights


@shape_cached
def _unpadded_masks(batch: int, num_global: int, num_tokens: int, padding: int, device: torch.device):
    key_mask = torch.ones(batch, num_global + num_tokens, dtype=torch.bool, device=device)
    return key_mask, F.pad(key_mask[:, num_global:], (0, padding), value=False)


def _padded_masks(
    padding_mask, batch: int, num_global: int, num_tokens: int, padding: int, device: torch.device, mask_first_token: bool
):
    """The key mask (B, g + t) bool (every key where `padding_mask` is None) and the tokens' mask padded at
    the end to whole blocks, (B, t + padding), the first token masked in both with `mask_first_token`.
    Without a padding mask or a masked first token they depend on the shape only: made once per shape
    (outside compiled graphs) and shared by the layers."""
    if padding_mask is None:
        key_mask, token_mask = _unpadded_masks(batch, num_global, num_tokens, padding, device)
    else:
        key_mask, token_mask = padding_mask, padding_mask[:, num_global:]
        if padding or is_exporting():
            token_mask = F.pad(token_mask, (0, padding), value=False)
    if mask_first_token and num_tokens > 0:
        key_mask = key_mask.clone()
        key_mask[:, num_global] = False
        token_mask = token_mask.clone()
        token_mask[:, 0] = False
    return key_mask, token_mask


def _real_blocks(padding_mask: torch.Tensor | None, num_global: int, first: int, padding: int, block: int):
    """`PaddingPlan.real_blocks` of the blocks from token `first` (a block start) on: (B, nb) bool, the
    blocks that hold a real token; None without a padding mask, or where every block holds one (checked
    outside compiled graphs only, which always carry the mask and zero the rows without a branch)."""
    if padding_mask is None:
        return None
    tokens = F.pad(padding_mask[:, num_global + first :], (0, padding), value=False)
    real = tokens.unflatten(1, (-1, block)).any(dim=-1)
    return None if not tracing() and bool(real.all()) else real


def padding_plan(
    padding_mask: torch.Tensor | None, settings: LSGSettings, causal: bool, batch: int, length: int, device: torch.device
) -> PaddingPlan:
    """The `PaddingPlan` of the layers with `settings` (`causal` or not) over `length` = g + t keys of `batch`
    rows, `padding_mask` (B, g + t) bool the keys that may be attended (None: every key)."""
    num_global, block = settings.num_global_tokens, settings.block_size
    num_tokens = length - num_global
    padding = -num_tokens % block
    if is_exporting():  # one more block of padding: the traced graph then never holds a single block (a size-1
        # dimension, which torch specialises), so it serves every length from 1 token on
        padding = padding + block
    key_mask, token_mask = _padded_masks(padding_mask, batch, num_global, num_tokens, padding, device, settings.mask_first_token)
    real_blocks = _real_blocks(padding_mask, num_global, 0, padding, block)
    real_rows = query_blocks = None
    if real_blocks is not None:
        real_rows = real_blocks.repeat_interleave(block, dim=1)[:, :num_tokens]
        query_blocks = None if tracing() else real_blocks.nonzero(as_tuple=True)
    no_masked_keys = padding_mask is None and not settings.mask_first_token
    global_mask = key_mask[:, :num_global]
    pattern = settings.pattern(causal)
    window_views = padding_window_views(pattern, token_mask, global_mask, real_blocks, num_tokens, no_masked_keys)
    return PaddingPlan(
        pattern, key_mask, global_mask, token_mask, padding, no_masked_keys, real_blocks, real_rows, query_blocks,
        window_views,
    )  # fmt: skip


def plan_padding(mask: torch.Tensor | None, kinds: Iterable[tuple[LSGSettings, bool]]) -> None:
    """Makes the `PaddingPlan` of each kind of LSG layer of a model, (settings, causal) in `kinds`, for the
    forward pass whose padding mask its recorder made, `mask` (B, 1, 1, g + t) (`lsg_recorder.padding_mask_view`),
    and gives them to it (`give_padding_plans`): the layers of the pass then read what they share, rather than
    the first of them making it. Nothing while tracing (each call makes its own)."""
    if mask is None or tracing():
        return
    length, plans = mask.shape[-1], {}
    for settings, causal in kinds:
        padding_mask = key_padding_mask(mask, length, settings.num_global_tokens)
        plans[settings, causal, length] = padding_plan(padding_mask, settings, causal, mask.shape[0], length, mask.device)
    give_padding_plans(mask, plans)


class AttentionPath(enum.Enum):
    """How the token queries of an LSG call of more than two blocks run, each path one function
    (`PATH_FUNCTIONS`), chosen by `choose_path`. (Inputs of at most two blocks run plain attention and a
    cached decoding step `_cached_causal_attention`, whatever the backend: `lsg_attention`.)"""

    EAGER = "eager"  # lsg_eager.eager_token_attention: the gathered blocks with explicit weights
    WINDOW_VIEWS = "sdpa window views"  # lsg_sdpa.window_view_token_attention: the CPU, local keys as views
    UNMASKED = "sdpa unmasked"  # lsg_sdpa.unmasked_attention: every key seen, masks of the shape alone
    TRAINED_TERMS = "sdpa trained terms"  # lsg_sdpa.trained_terms_token_attention: CPU, terms being trained
    GATHERED = "sdpa gathered"  # lsg_sdpa.gathered_token_attention: each block's keys gathered
    FLEX = "flex"  # lsg_flex.flex_token_attention: one kernel call over the layer's own keys


def choose_path(backend: str, job: TokenAttention) -> tuple[AttentionPath, Any]:
    """The one place where the path of a call's token queries is chosen, with what it needs (the window
    views' plan, the forward pass's memo, or None), from the backend the model runs, the device, the
    dtype, the length, the padding, the sparse keys, DropKey, the position terms and the gradients:

    * "eager": `AttentionPath.EAGER`;
    * left unset (`DEFAULT_BACKEND`): flex_attention where it was measured faster
      (`prefers_flex_attention`), else sdpa;
    * "flex_attention": sdpa while gradients are needed on a device without flex's backward pass
      (`FLEX_FORWARD_ONLY_DEVICES`); else flex;
    * "sdpa": the window views where the forward pass's padding plans them (`PaddingPlan.window_views`: on
      the CPU, no sparse keys, not causal, every global key valid) and the call allows them (no DropKey,
      values of the keys' size, no position terms but a table's, the same in every block, without
      gradients; in training, a torch with the CPU flash kernel's backward); else unmasked where every key
      is seen (no padding, sparse keys, DropKey or position terms); else, on the CPU, trained terms where
      position terms are being trained (`TokenAttention.terms_trained`); else gathered.

    Each block with its own global keys (`TokenAttention.block_global_keys`) runs sdpa's window views where
    they apply, else the gathered blocks, whatever the backend but eager.

    The gathered and eager paths get the forward pass's memo (`PaddingPlan.memo`) where every layer of the
    kind makes the same masks of its blocks, so that they are made once per pass: no DropKey, the sparse
    keys' mask of the padding alone (`SparseContext.mask_of_tokens_alone`), and no position terms, or terms
    of a table alone that give the mask no gradient and whose sparse keys' terms do not depend on the keys'
    positions (no sparse keys, or `far_sparse_scores`). Else None: each call makes its own.
    """
    queries, terms, sparse = job.token_queries, job.positions, job.sparse
    if backend != "eager":
        own_global_keys = job.block_global_keys is not None
        # every key may be seen and nothing else changes the scores: masks of the input's shape alone (not while
        # exporting, whose one graph serves every length)
        unmasked = not is_exporting() and job.plan.no_masked_keys and sparse is None and job.kept is None and terms is None
        if backend == DEFAULT_BACKEND:
            flex = prefers_flex_attention(queries.device.type, queries.dtype, job.num_tokens, unmasked)
            backend = "flex_attention" if flex else "sdpa"
        if backend == "flex_attention" and not own_global_keys:
            if not (job.training and queries.device.type in FLEX_FORWARD_ONLY_DEVICES):
                return AttentionPath.FLEX, None
            logger.warning_once(
                f"flex_attention has no backward pass on {queries.device.type}: LSG runs its sdpa backend while "
                "gradients are needed (same results)."
            )
        views = job.plan.window_views
        if (
            views is not None
            and job.kept is None
            and job.token_values.shape[-1] == queries.shape[-1]
            and (not job.training or CPU_FLASH_ATTENTION_BACKWARD is not None)
            and (terms is None or (terms.same_in_every_block and not job.training and not job.terms_trained))
        ):
            return AttentionPath.WINDOW_VIEWS, views
        if unmasked and not own_global_keys:
            return AttentionPath.UNMASKED, None
        if job.terms_trained and not queries.is_cuda and not own_global_keys:
            return AttentionPath.TRAINED_TERMS, None
    shared = (
        job.kept is None
        and (sparse is None or sparse.mask_of_tokens_alone)
        and (
            terms is None
            or (
                terms.same_in_every_block
                and not job.terms_trained
                and (sparse is None or far_sparse_scores(terms, job.pattern, queries.device, job.plan.memo) is not None)
            )
        )
    )
    return (AttentionPath.EAGER if backend == "eager" else AttentionPath.GATHERED), (job.plan.memo if shared else None)


# Each path's function: (job, what `choose_path` gave with the path) -> the token queries' output
PATH_FUNCTIONS: dict[AttentionPath, Callable[[TokenAttention, Any], TokenOutput]] = {
    AttentionPath.EAGER: eager_token_attention,
    AttentionPath.WINDOW_VIEWS: window_view_token_attention,
    AttentionPath.UNMASKED: lambda job, _: unmasked_attention(job),
    AttentionPath.TRAINED_TERMS: lambda job, _: trained_terms_token_attention(job),
    AttentionPath.GATHERED: gathered_token_attention,
    AttentionPath.FLEX: lambda job, _: flex_token_attention(job),
}


def _dense_attention(kernel, queries, keys, values, key_mask, causal, dropout, scaling, terms, num_global):
    """Attention of the first q of the g + t positions, queries (B, H, q, D), over the keys and values
    (B, H, g + t, D) they see: every key; causal, each the keys up to its own position (the g global queries:
    the global tokens before them). The g global queries (q = g), and every query of an input of at most two
    blocks (q = g + t), where it is exact. Returns the kernel's output (B, H, q, D) and weights, or None.

    key_mask: (B, g + t) bool, or None where every key is seen (not causal, no dropout): no mask then. Dropout
    is DropKey drawn on the keys seen (`drop_keys`), after the token queries' (`block_dropout`), in every backend.
    """
    num_queries = queries.shape[2]
    if causal:  # no query sees a key past the last of them
        keys, values = keys[:, :, :num_queries], values[:, :, :num_queries]
    num_keys = keys.shape[2]
    allowed = None
    if key_mask is not None:
        allowed = key_mask[:, None, None, :num_keys]  # (B, 1, 1, k)
        if causal:
            allowed = allowed & causal_mask(num_queries, num_keys, keys.device)
        if dropout:
            allowed = drop_keys(allowed, queries.shape[:2], num_keys, dropout)
    scores = None
    if terms is not None:
        positions = torch.arange(num_keys, device=keys.device)
        scores = dense_position_scores(terms, positions[:num_queries], positions, num_global, num_keys)  # (B or 1, H, q, k)
    return kernel.dense_attention(queries, keys, values, allowed, scaling, scores)


def _cached_causal_attention(query, key, value, key_mask, settings, dropout, scaling, terms) -> torch.Tensor:
    """Causal LSG for queries that are the last q of the cached keys (decoding).

    Each query gathers the keys of its block in the layout every backend uses (`KeyPattern.key_columns`)
    from the sequence [g globals | T tokens | the compressed keys its sparse windows reach | a masked
    row for the keys outside], and sees the local ones up to itself: the keys a query at the same
    position gets in a whole causal pass. query: (B, q, H, D); key, value: (B, g + T, H, D); key_mask:
    (B, g + T) bool. Returns (B, q, H, D).
    """
    pattern = settings.pattern(causal=True)
    block, num_global, factor = pattern.block_size, pattern.num_global, settings.sparsity_factor
    batch, num_queries, heads, _ = query.shape
    num_tokens = key.shape[1] - num_global
    if num_tokens < num_queries:
        raise ValueError("A cached causal LSG step must not start inside the global tokens: run the prompt first.")
    device = query.device
    positions = torch.arange(num_tokens - num_queries, num_tokens, device=device)  # (q,) token position of each query
    key_rows = None if terms is None else terms.key_rows  # (B, H, g + T, R) or None

    # The sequence the columns index, piece by piece, holding the tokens of the last q + (blocks before
    # + 1) b positions, which cover every local window of the step (the history before them is reached
    # through compressed keys only): keys and values (B, N_i, H, D), mask (B, 1 or H, N_i), positions
    # (B or 1, 1 or H, N_i), key rows (B, H, N_i, R).
    first_local = max(num_tokens - num_queries - (pattern.blocks_before + 1) * block, 0)
    held = torch.cat([torch.arange(num_global, device=device), torch.arange(num_global + first_local, num_global + num_tokens, device=device)])

    def held_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
        return x.index_select(dim, held)

    keys, values, masks = [held_rows(key, 1)], [held_rows(value, 1)], [held_rows(key_mask, 1)[:, None]]
    key_positions = []
    if terms is not None:
        key_positions.append(held_rows(sequence_positions(terms, num_global, num_tokens, device), 0)[None, None])
    row_pieces = [] if key_rows is None else [held_rows(key_rows, 2)]
    # Sparse: every sparsity type compresses whole blocks independently, so only the blocks under the
    # windows of the step's queries are compressed, tokens [first, last): O(s f) per step, not the history.
    first_block = (num_tokens - num_queries) // block
    first = max((first_block * pattern.compressed_per_block + min(pattern.sparse_starts, default=0)) * factor // block * block, 0)
    last = max((num_tokens - 1) // block * block - block, 0)  # the complete blocks before the last local window
    compressed = (0, 0)  # compressed positions [start, end) in the sequence
    if pattern.sparse_starts and last > first:
        token_keys, token_values = key[:, num_global + first : num_global + last], value[:, num_global + first : num_global + last]
        sparse = sparse_context(
            query.transpose(1, 2),
            token_keys.transpose(1, 2),
            token_values.transpose(1, 2),
            key_mask[:, num_global + first : num_global + last],
            settings,
            scaling,
            key_rows=None if key_rows is None else key_rows[:, :, num_global + first : num_global + last],
            with_positions=terms is not None,
        )
        keys.append(sparse.keys.transpose(1, 2))
        values.append(sparse.values.transpose(1, 2))
        masks.append(sparse.mask)
        if terms is not None:
            key_positions.append(sparse.positions + first)
        if key_rows is not None:
            row_pieces.append(sparse.key_rows)
        compressed = (first // factor, last // factor)
    keys.append(key.new_zeros(batch, 1, *key.shape[2:]))
    values.append(value.new_zeros(batch, 1, *value.shape[2:]))
    masks.append(key_mask.new_zeros(batch, 1, 1))
    if terms is not None:
        key_positions.append(positions.new_zeros(1, 1, 1))
    if key_rows is not None:
        row_pieces.append(key_rows.new_zeros(*key_rows.shape[:2], 1, key_rows.shape[3]))

    columns = pattern.key_columns(positions // block, num_tokens, compressed[1], compressed[0])  # (q, K)
    token_column = columns - num_global  # a token's position, or past the tokens for a compressed key
    is_token = (token_column >= 0) & (token_column < num_tokens)
    causal = ~is_token | (token_column <= positions[:, None])  # (q, K): local keys up to the query
    columns = torch.where(columns >= num_global, columns - first_local, columns)  # in the sequence held

    def joined(pieces: list[torch.Tensor], dim: int) -> torch.Tensor:  # pieces broadcast, then concatenated
        shape = list(torch.broadcast_shapes(*(piece.shape[:dim] for piece in pieces)))
        return torch.cat([piece.expand(*shape, *piece.shape[dim:]) for piece in pieces], dim=dim)

    def gathered(pieces: list[torch.Tensor]) -> torch.Tensor:  # (B, N, H, D) -> (B * q, H, K, D)
        sequence = joined(pieces, 1)
        return sequence.index_select(1, columns.flatten()).unflatten(1, columns.shape).flatten(0, 1).transpose(1, 2)

    allowed = joined(masks, 2)[:, :, columns] & causal  # (B, 1 or H, q, K)
    allowed = allowed.transpose(1, 2).flatten(0, 1)[:, :, None]  # (B * q, 1 or H, 1, K)
    if dropout:
        allowed = drop_keys(allowed, (allowed.shape[0], heads), allowed.shape[-1], dropout)
    scores = None
    if terms is not None:
        sequence_rows = None if key_rows is None else RowLookup(joined(row_pieces, 2), columns.view(1, num_queries, 1, 1, -1))
        query_rows = None
        if terms.query_rows is not None:  # (B, H, q, R): one row per query of the step
            query_rows = RowLookup(terms.query_rows, torch.arange(num_queries, device=device).view(1, -1, 1, 1, 1))
        seen_positions = joined(key_positions, 2)[:, :, columns].transpose(1, 2)[:, :, :, None]  # (B or 1, q, 1 or H, 1, K)
        scores = relative_scores(terms, positions.view(1, -1, 1, 1, 1), seen_positions, query_rows, sequence_rows)
        scores = scores.expand(batch, -1, heads, -1, -1).flatten(0, 1)  # (B * q, H, 1, K)
    output, _ = sdpa_dense_attention(
        query.flatten(0, 1)[:, :, None], gathered(keys), gathered(values), allowed, scaling, scores
    )  # (B * q, H, 1, D)
    return output.view(query.shape)


# --------------------------------------------------------------------------------------------------
# transformers' attention interface
# --------------------------------------------------------------------------------------------------


def padding_rows(mask: torch.Tensor) -> torch.Tensor:
    """A padding mask -> (B, L): one given with unit dimensions between its rows and columns, (B, 1, 1, L),
    is read as the (B, L) one it stands for; any other shape (a mask of every query and key) raises
    ValueError, saying what to pass."""
    if mask.dim() > 2 and all(size == 1 for size in mask.shape[1:-1]):
        mask = mask.reshape(mask.shape[0], mask.shape[-1])
    if mask.dim() != 2:
        raise ValueError(
            f"LSG attention takes a (batch, length) padding mask, got one of shape {tuple(mask.shape)}: "
            "pass attention_mask as a 2D tensor of 1s (tokens) and 0s (padding)."
        )
    return mask


def key_padding_mask(attention_mask: torch.Tensor | None, num_keys: int, num_global: int) -> torch.Tensor | None:
    """The mask a model hands its LSG layers -> (B, g + t) bool, True for the keys that may be attended.

    It arrives as the (B, 1, 1, g + t) view the recorder made, the global tokens' columns included, and
    transformers' mask creation passed through (see lsg_recorder.padding_mask_view), or as that view
    with more unit dimensions (`padding_rows`); `num_keys` = g + t, `num_global` = g.
    None where no key is masked: no mask, or one True broadcast to every column (stride 0 wherever the
    size is not 1: the recorder's stand-in for a call without a mask), so the core knows it without
    reading the mask.
    """
    if attention_mask is None:
        return None
    attention_mask = padding_rows(attention_mask)
    if attention_mask.shape[-1] != num_keys:
        raise ValueError(
            f"attention_mask has {attention_mask.shape[-1] - num_global} columns for {num_keys - num_global} tokens: "
            "give exactly one column per input token."
        )
    if attention_mask.dtype == torch.bool and all(
        stride == 0 for size, stride in zip(attention_mask.shape, attention_mask.stride()) if size > 1
    ) and attention_mask.shape[-1] > 1:
        return None
    return attention_mask.bool()


@dataclass(frozen=True)
class SelfAttentionRole:
    """The role of an LSG self-attention layer (its ``lsg_role``, given when the model is built): LSG
    attention with the model's `settings` (or the layer's own: ModernBERT's sliding-window layers), `causal`
    in a decoder-only LSG model (BertLMHeadModel), and the `position_terms` that `position_terms(query)` makes
    at each call where the layer's scores have some (ModernBERT's window), and, in an encoder with rotary
    positions, the clamp of the global tokens' distances (`lsg_rotary.GlobalDistanceClamp`)."""

    settings: LSGSettings
    causal: bool = False
    position_terms: Callable[[torch.Tensor], PositionTerms] | None = None
    global_clamp: GlobalDistanceClamp | None = None


@dataclass(frozen=True)
class CrossAttentionRole:
    """The role of a decoder's cross-attention layer over an encoder output that keeps its
    `num_global_tokens` global states in front (``pass_global_tokens_to_decoder``): `global_state_cross_attention`."""

    num_global_tokens: int


def registered_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    backend: str = "sdpa",
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention registered as `registered_attention(backend)`, which the attention layers of an LSG
    model that hold a role (``lsg_role``, given when the model was built) dispatch on (`DispatchConfig`):
    `lsg_attention_forward` for a `SelfAttentionRole`, `global_state_cross_attention` with the
    decoder's `dense_backend` for a `CrossAttentionRole`. Returns (output (B, q, H, D), weights or None)."""
    role = module.lsg_role
    if isinstance(role, SelfAttentionRole):
        if role.position_terms is not None:
            kwargs["position_terms"] = role.position_terms(query)
        if role.global_clamp is not None:
            kwargs["global_clamp"] = role.global_clamp
        return lsg_attention_forward(
            module, query, key, value, attention_mask, role.settings, causal=role.causal, backend=backend, **kwargs
        )
    backend = dense_backend(module.config, backend)
    return global_state_cross_attention(module, query, key, value, attention_mask, role.num_global_tokens, backend, **kwargs)


def dense_backend(config: Any, backend: str) -> str:
    """transformers' implementation that the dense attention layers (and their masks) of a model running
    `backend` use, `config` being theirs: `backend`, where the architecture's dense layers run it (its
    config's ``lsg_dense_implementations``), else sdpa, or eager where they do not run sdpa either."""
    if backend == DEFAULT_BACKEND:  # its dense layers run sdpa, on every device
        backend = "sdpa"
    supported = getattr(config, "lsg_dense_implementations", None)
    if supported is None or backend in supported:
        return backend
    return "sdpa" if "sdpa" in supported else "eager"


def lsg_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    settings: LSGSettings,
    dropout: float = 0.0,
    scaling: float | None = None,
    causal: bool = False,
    backend: str = "sdpa",
    position_terms: PositionTerms | None = None,
    global_clamp: GlobalDistanceClamp | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The self-attention of the LSG layers (their `SelfAttentionRole`), and what a swapped attention module
    calls: LSG attention with the model's `settings`, bidirectional in encoders, `causal` in decoder-only
    models (e.g. BertLMHeadModel). Returns (output (B, N, H, D), weights): the token weights (B, H, q, t)
    with the "eager" backend, None with the others.
    """
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped key/value heads (EuroBERT): (B, H / groups, N, D) -> (B, H, N, D), as transformers' repeat_kv
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if backend != "eager" and kwargs.get("output_attentions"):
        logger.warning_once(
            f"LSG attention returns no attention weights with attn_implementation={backend!r}: call "
            "model.set_attn_implementation('eager') for output_attentions=True (O(n^2) memory)."
        )
    plans = padding_plans_of(attention_mask)  # this forward pass's, shared by its layers
    padding_mask = None  # read by the core where the pass holds no plan for this layer
    if plans is None or (settings, causal, key.shape[2]) not in plans:
        padding_mask = key_padding_mask(attention_mask, key.shape[2], settings.num_global_tokens)
    output, weights = lsg_attention(
        query, key, value, padding_mask, settings, dropout, scaling, causal, backend, position_terms, plans, global_clamp
    )
    return output.transpose(1, 2).contiguous(), weights


def global_state_cross_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_global_tokens: int,
    backend: str = "sdpa",
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The decoder's cross-attention over an encoder output that keeps its `num_global_tokens` global
    states in front (``pass_global_tokens_to_decoder``). It is dense: transformers' implementation of
    `backend`, except that with "eager" the weights returned leave the g global columns out, (B, H, q, t),
    so that column j is input token j as in the source model; the output is computed from them."""
    if backend != "eager":
        return ALL_ATTENTION_FUNCTIONS[backend](module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (query @ key.transpose(-1, -2)) * scaling
    if attention_mask is not None:  # transformers' eager mask: additive, (B, 1, q, g + t)
        scores = scores + attention_mask
    weights = explicit_softmax(scores, query.dtype)
    weights = F.dropout(weights, p=kwargs.get("dropout", 0.0), training=module.training)  # (B, H, q, g + t)
    output, token_columns = weighted_values(weights, value, num_global_tokens)
    return output.transpose(1, 2).contiguous(), token_columns


def _register_with_transformers() -> None:
    """Register, for every backend, the attention of LSG models (`registered_attention_forward`) under its
    name (`registered_attention`)."""
    for backend in REGISTERED_SUFFIXES:
        AttentionInterface.register(registered_attention(backend), functools.partial(registered_attention_forward, backend=backend))


_register_with_transformers()
