"""LSG attention: Local + Sparse + Global (Condevaux & Harispe, PAKDD 2023), the one shared core.

Everything an LSG model needs beyond its Hugging Face parent lives here, in pure torch:

* the configuration keys (`LSGConfigMixin`),
* the attention itself (`lsg_attention_forward`), registered with transformers as the attention
  implementation ``"lsg"`` together with its mask function (`lsg_attention_mask`), which hands the
  attention the O(n) ``(batch, length)`` padding mask instead of an O(n^2) one,
* the global tokens: prepended to the embeddings before their normalisation, dropped from the
  encoder output (`LSGModelMixin`).

The sequence seen by every layer is ``g`` global tokens followed by ``t`` real tokens. Each block of
``b`` query tokens attends to

    [ g global keys | s sparse keys left | s sparse keys right | 3b local keys ]

where the local keys are the previous, own and next blocks and the sparse keys are a compressed
copy of the context just outside the local window (see `SPARSE_COMPRESSORS`). Global queries attend
to everything. Blocks are batched through `scaled_dot_product_attention` on 4D tensors; no tensor of
size ``t x t`` is ever built.

This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, sdpa_mask

LSG_ATTENTION = "lsg"
SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")
MAX_GLOBAL_TOKENS = 512  # rows of the global embedding table, as in the 2023 reference checkpoints

LSG_DEFAULTS: dict[str, Any] = {
    "adaptive": True,
    "block_size": 128,
    "sparse_block_size": 128,
    "sparsity_factor": 2,
    "sparsity_type": "norm",
    "num_global_tokens": 1,
    "pool_with_global": True,
    "mask_first_token": False,
    "lsh_num_pre_rounds": 1,
    "lsh_seed": 0,
}
# Keys the 2023 reference wrote into its configs that mean nothing here.
LEGACY_CONFIG_KEYS = ("base_model_prefix",)


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


class LSGConfigMixin:
    """Adds the LSG keys to a Hugging Face configuration class.

    Keys (defaults of the 2023 reference):
        block_size (128): local block size ``b``; each block sees its previous, own and next block.
        sparse_block_size (128): ``s``, sparse keys taken on each side of the local window.
        sparsity_factor (2): ``f``, compression of the sparse context (``f`` tokens -> 1 key).
        sparsity_type ("norm"): one of `SPARSITY_TYPES`.
        num_global_tokens (1): ``g`` global tokens prepended to the sequence (0 to 512).
        pool_with_global (True): output of the first real token := output of global token 0.
        mask_first_token (False): hide the first real token as a key (it duplicates global 0).
        adaptive (True): pad inputs to a multiple of ``block_size`` instead of refusing them.
        lsh_num_pre_rounds (1): hashing rounds before the final one for ``sparsity_type="lsh"``.
        lsh_seed (0): seed of the random hyperplanes of ``sparsity_type="lsh"``.

    Subclasses set ``model_type`` (``"lsg-<base>"``) and ``lsg_auto_map`` (Auto class -> class path),
    and define ``__init__(self, **kwargs)`` calling super() in their own body: transformers turns config
    classes into dataclasses and replaces an inherited ``__init__`` with a generated one.
    """

    lsg_auto_map: dict[str, str] = {}

    def __init__(self, **kwargs: Any) -> None:
        lsg_values = {key: kwargs.pop(key, default) for key, default in LSG_DEFAULTS.items()}
        for key in LEGACY_CONFIG_KEYS:
            kwargs.pop(key, None)
        kwargs.pop("model_type", None)  # legacy checkpoints say "bert", "roberta", ...
        kwargs.pop("auto_map", None)
        super().__init__(**kwargs)
        self.auto_map = dict(self.lsg_auto_map)
        if lsg_values["sparsity_type"] is None:
            lsg_values["sparsity_type"] = "none"
        for key, value in lsg_values.items():
            setattr(self, key, value)
        validate_lsg_settings(self)

    @property
    def _attn_implementation(self) -> str:
        """Always "lsg": the global tokens and blocks only work with the LSG attention function.

        (The attribute is not serialised by transformers, so it cannot be stored in config.json.)
        """
        return LSG_ATTENTION

    @_attn_implementation.setter
    def _attn_implementation(self, value: Any) -> None:
        self._attn_implementation_internal = value


def validate_lsg_settings(config: Any) -> None:
    """Raise ValueError, saying what to change, if the LSG keys of `config` cannot work."""
    for key in ("block_size", "sparse_block_size", "sparsity_factor", "num_global_tokens", "lsh_num_pre_rounds"):
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, got {value!r}.")
    if config.block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {config.block_size}.")
    if config.sparse_block_size < 0 or config.sparsity_factor < 0 or config.lsh_num_pre_rounds < 0:
        raise ValueError("sparse_block_size, sparsity_factor and lsh_num_pre_rounds must be >= 0.")
    if not 0 <= config.num_global_tokens <= MAX_GLOBAL_TOKENS:
        raise ValueError(f"num_global_tokens must be between 0 and {MAX_GLOBAL_TOKENS}, got {config.num_global_tokens}.")
    if config.sparsity_type not in SPARSITY_TYPES:
        raise ValueError(f"Unknown sparsity_type {config.sparsity_type!r}: use one of {', '.join(SPARSITY_TYPES)}.")
    if uses_sparse_keys(config) and config.block_size % config.sparsity_factor:
        raise ValueError(
            f"block_size ({config.block_size}) must be a multiple of sparsity_factor ({config.sparsity_factor})."
        )


def uses_sparse_keys(config: Any) -> bool:
    """Whether the blocks get sparse keys at all (otherwise: local + global only)."""
    return config.sparsity_type != "none" and config.sparse_block_size > 0 and config.sparsity_factor > 0


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
    """In each window of f tokens, mean weighted by softmax(q_first . k * scaling), q_first = first real token."""
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
# Attention
# --------------------------------------------------------------------------------------------------


def _windows(x: torch.Tensor, size: int, step: int, count: int, start: int = 0) -> torch.Tensor:
    """Views of `count` windows of `size` rows, `step` apart, starting at row `start` of x (..., L, D).

    Returns (..., count, size, D).
    """
    return x[..., start:, :].unfold(-2, size, step)[..., :count, :, :].transpose(-1, -2)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask -> 0 / finfo.min. Finite, so a query whose keys are all masked gets no NaN."""
    return torch.zeros((), dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _sdpa(query, key, value, additive_mask, dropout: float, scaling: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=additive_mask, dropout_p=dropout, scale=scaling)


def _block_attention(query, key, value, key_mask, config, dropout: float, scaling: float) -> torch.Tensor:
    """Attention of the token queries (everything after the global tokens), block by block.

    query, key, value: (B, H, g + T, D) with T a multiple of b; key_mask: (B, g + T) bool.
    Returns (B, H, T, D).
    """
    batch, heads, _, head_dim = query.shape
    block, num_global = config.block_size, config.num_global_tokens
    token_queries, token_keys, token_values = (x[:, :, num_global:] for x in (query, key, value))
    token_mask = key_mask[:, num_global:]  # (B, T)
    num_tokens = token_queries.shape[2]
    num_blocks = num_tokens // block

    # Local: block i sees tokens [(i - 1) b, (i + 2) b), zero-padded and masked outside the sequence.
    def local(x):  # (B, H', T, D') -> (B, H', nb, 3b, D')
        return _windows(F.pad(x, (0, 0, block, block)), 3 * block, block, num_blocks)

    local_mask = local(token_mask[:, None, :, None]).squeeze(-1)  # (B, 1, nb, 3b)
    block_keys = [local(token_keys)]
    block_values = [local(token_values)]
    block_masks = [local_mask]

    # Sparse: block i also sees the s compressed positions left of its local window,
    # [(i - 1) c - s, (i - 1) c), and the s right of it, [(i + 2) c, (i + 2) c + s), with c = b / f.
    if uses_sparse_keys(config):
        compress = sparse_every_token if config.sparsity_factor == 1 else SPARSE_COMPRESSORS[config.sparsity_type]
        sparse = compress(token_queries, token_keys, token_values, token_mask, config, scaling)
        span, step = config.sparse_block_size, block // config.sparsity_factor
        margin = step + span

        def sparse_windows(x):  # (B, H', T / f, D') -> (B, H', nb, 2s, D')
            padded = F.pad(x, (0, 0, margin, margin))
            left = _windows(padded, span, step, num_blocks)
            right = _windows(padded, span, step, num_blocks, start=3 * step + span)
            return torch.cat([left, right], dim=-2)

        block_keys.insert(0, sparse_windows(sparse.keys))
        block_values.insert(0, sparse_windows(sparse.values))
        block_masks.insert(0, sparse_windows(sparse.mask[..., None]).squeeze(-1))

    # Global: every block sees every global key.
    if num_global:
        block_keys.insert(0, key[:, :, None, :num_global].expand(-1, -1, num_blocks, -1, -1))
        block_values.insert(0, value[:, :, None, :num_global].expand(-1, -1, num_blocks, -1, -1))
        block_masks.insert(0, key_mask[:, None, None, :num_global].expand(-1, -1, num_blocks, -1))

    mask_heads = max(m.shape[1] for m in block_masks)
    block_mask = torch.cat([m.expand(-1, mask_heads, -1, -1) for m in block_masks], dim=-1)  # (B, H', nb, K)
    block_mask = _additive_mask(block_mask, query.dtype).expand(-1, heads, -1, -1)
    # Fold batch and heads: SDPA's fused kernels take 4D inputs (B * H, nb, rows, D).
    output = _sdpa(
        token_queries.reshape(batch * heads, num_blocks, block, head_dim),
        torch.cat(block_keys, dim=-2).reshape(batch * heads, num_blocks, -1, head_dim),
        torch.cat(block_values, dim=-2).reshape(batch * heads, num_blocks, -1, head_dim),
        block_mask.reshape(batch * heads, num_blocks, 1, -1),
        dropout,
        scaling,
    )
    return output.view(batch, heads, num_tokens, head_dim)


def lsg_self_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    config: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """Bidirectional LSG attention over ``g`` global tokens followed by ``t`` tokens.

    Args:
        query, key, value: (B, H, g + t, D).
        padding_mask: (B, g + t) bool, True for tokens that may be attended; None = no padding.
        config: anything carrying the LSG keys of `LSGConfigMixin`.
    Returns:
        (B, H, g + t, D).
    """
    batch, heads, length, head_dim = query.shape
    scaling = head_dim**-0.5 if scaling is None else scaling
    num_global, block = config.num_global_tokens, config.block_size
    key_mask = (
        torch.ones(batch, length, dtype=torch.bool, device=query.device) if padding_mask is None else padding_mask
    )
    if config.mask_first_token and length > num_global:
        key_mask = key_mask.clone()
        key_mask[:, num_global] = False
    num_tokens = length - num_global

    # Short input: the local window already covers everything, plain attention is exact.
    if num_tokens <= 2 * block:
        return _sdpa(query, key, value, _additive_mask(key_mask[:, None, None, :], query.dtype), dropout, scaling)

    padding = -num_tokens % block
    if padding and not config.adaptive:
        raise ValueError(
            f"Input length {num_tokens} is not a multiple of block_size {block}: pad it, or set adaptive=True."
        )
    query, key, value = (F.pad(x, (0, 0, 0, padding)) for x in (query, key, value))
    key_mask = F.pad(key_mask, (0, padding), value=False)

    token_output = _block_attention(query, key, value, key_mask, config, dropout, scaling)
    if not num_global:
        return token_output[:, :, :length]
    global_output = _sdpa(
        query[:, :, :num_global], key, value, _additive_mask(key_mask[:, None, None, :], query.dtype), dropout, scaling
    )
    return torch.cat([global_output, token_output], dim=2)[:, :, :length]


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

    Encoder self-attention runs LSG. Decoder self-attention and cross-attention (modules with
    ``is_decoder``) stay dense and go to SDPA. Returns (output (B, N, H, D), None).
    """
    if attention_mask is not None and attention_mask.dim() == 2:
        attention_mask = _cover_global_tokens(attention_mask, key.shape[2], module.config)
    if getattr(module, "is_decoder", False):
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = attention_mask[:, None, None, :]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"LSG attention takes the (batch, length) padding mask, got a {attention_mask.dim()}D mask: "
            "pass attention_mask as a 2D tensor of 1s (tokens) and 0s (padding)."
        )
    output = lsg_self_attention(query, key, value, attention_mask, module.config, dropout, scaling)
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

    For bidirectional attention it returns the user's (B, t) bool padding mask, O(n) instead of the
    (B, 1, q, kv) matrix; the attention extends it over the global tokens. Causal masks are SDPA's.
    """
    if mask_function is not bidirectional_mask_function:
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


# --------------------------------------------------------------------------------------------------
# Global tokens in a model
# --------------------------------------------------------------------------------------------------


def _prepend_global_tokens(global_embeddings: nn.Embedding, config: Any, norm: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of the embedding norm: (B, t, E) -> (B, g + t, E)."""
    embeddings = args[0]
    global_tokens = global_embeddings.weight[: config.num_global_tokens].to(embeddings.dtype)
    global_tokens = global_tokens.unsqueeze(0).expand(embeddings.shape[0], -1, -1)
    return (torch.cat([global_tokens, embeddings], dim=1), *args[1:])


def _drop_global_tokens(config: Any, encoder: nn.Module, args: tuple, output: Any) -> Any:
    """Forward hook of the encoder: (B, g + t, E) -> (B, t, E), after pool_with_global."""
    num_global = config.num_global_tokens
    hidden_states = output.last_hidden_state
    if config.pool_with_global and num_global:
        # the first real token's state becomes global token 0's
        hidden_states = torch.cat([hidden_states[:, :1], hidden_states[:, num_global + 1 :]], dim=1)
    else:
        hidden_states = hidden_states[:, num_global:]
    output.last_hidden_state = hidden_states
    return output


class LSGModelMixin:
    """Turns the Hugging Face model built by ``super().__init__`` into an LSG model, in place.

    The architecture file names, relative to the base model (``self.<base_model_prefix>`` for heads):
        lsg_embeddings: module that holds ``global_embeddings`` (where the reference stored it),
        lsg_embedding_norm: normalisation before which the global tokens are prepended,
        lsg_encoder: module whose output drops the global tokens again.
    The hooks are partials of module-level functions, so copies and pickles of the model stay whole.
    """

    lsg_embeddings: str = "embeddings"
    lsg_embedding_norm: str = "embeddings.LayerNorm"
    lsg_encoder: str = "encoder"

    def __init__(self, config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        base = getattr(self, self.base_model_prefix, self)
        norm = base.get_submodule(self.lsg_embedding_norm)
        global_embeddings = nn.Embedding(MAX_GLOBAL_TOKENS, norm.normalized_shape[0])
        nn.init.normal_(global_embeddings.weight, std=getattr(config, "initializer_range", 0.02))
        base.get_submodule(self.lsg_embeddings).global_embeddings = global_embeddings
        norm.register_forward_pre_hook(partial(_prepend_global_tokens, global_embeddings, config))
        base.get_submodule(self.lsg_encoder).register_forward_hook(partial(_drop_global_tokens, config))


def lsg_auto_classes(config_class: type) -> dict[str, str]:
    """Auto class name -> LSG class name, for every head in `config_class.lsg_auto_map`."""
    return {
        auto_class: path.rsplit(".", 1)[-1]
        for auto_class, path in config_class.lsg_auto_map.items()
        if auto_class != "AutoConfig"
    }


def register_for_auto_classes(config_class: type, namespace: dict[str, Any]) -> None:
    """Mark the config and every head of `config_class.lsg_auto_map` for remote-code saving.

    `save_pretrained` then copies the architecture's files (and this one) next to the weights.
    """
    config_class.register_for_auto_class()
    for auto_class, class_name in lsg_auto_classes(config_class).items():
        namespace[class_name].register_for_auto_class(auto_class)
