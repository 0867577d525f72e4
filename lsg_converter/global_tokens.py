"""The converter's initial global tokens: the source's [CLS] and [MASK] embeddings plus source positions."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .architectures import Architecture
from .models.lsg_defaults import MAX_GLOBAL_TOKENS

logger = logging.get_logger(__name__)


def fill_global_tokens(
    model: PreTrainedModel,
    arch: Architecture,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    keep_first: bool,
    random_init: bool,
    positional_stride: int,
    use_token_ids: bool,
) -> None:
    """Fill `model`'s table of global tokens, in place: global 0 = [CLS]/<s> + position 0; global k =
    [MASK] + a strided source position (+ type 0); no position in a model without a position table. See LSGConverter for the settings (`random_init`:
    its random_global_init, `positional_stride`: its global_positional_stride); `keep_first` leaves
    global 0 as it is."""
    words = model.get_input_embeddings().weight.detach()
    position_rows = arch.position_rows(model)
    positions = 0 if position_rows is None else _strided_positions(position_rows, positional_stride)
    first_id, mask_id = _global_token_ids(tokenizer, model.config)
    if random_init:
        word_part = torch.distributions.MultivariateNormal(words.mean(0).float(), torch.cov(words.T.float()))
        word_part = word_part.sample((MAX_GLOBAL_TOKENS,)).to(words.dtype)
    else:
        word_part = words[mask_id].expand(MAX_GLOBAL_TOKENS, -1).clone()
    word_part[0] = words[first_id]
    global_tokens = word_part + positions
    token_type = arch.token_type_row(model)
    if use_token_ids and token_type is not None:
        global_tokens += token_type
    weight = model.lsg_global_embeddings.weight
    with torch.no_grad():
        start = 1 if keep_first else 0
        weight[start:] = global_tokens[start:].to(weight.dtype)


def _global_token_ids(tokenizer: PreTrainedTokenizerBase | None, config: Any) -> tuple[int, int]:
    """(word of global token 0: bos or cls, word of global tokens k > 0: mask).

    Taken from the tokenizer (one that fits the model, see `loading.load_tokenizer`), else from the
    config, with a warning that names what is missing (no tokenizer, no mask id).
    """
    ids = config if tokenizer is None else tokenizer
    first_name = next((name for name in ("bos_token_id", "cls_token_id") if getattr(ids, name, None) is not None), None)
    first_id = 0 if first_name is None else getattr(ids, first_name)
    mask_id = getattr(ids, "mask_token_id", None)
    if config.num_global_tokens and (tokenizer is None or first_name is None or mask_id is None):
        origin = "the config's ids (no tokenizer)" if tokenizer is None else "the tokenizer's ids"
        first = f"{first_name} {first_id}" if first_name else "token 0 (no bos_token_id or cls_token_id)"
        others = f"mask_token_id {mask_id}" if mask_id is not None else f"token {first_id} (no mask_token_id)"
        logger.warning(f"Global tokens use {origin}: {first} for global token 0, {others} for the others.")
    return first_id, first_id if mask_id is None else mask_id


def _strided_positions(table: torch.Tensor, stride: int) -> torch.Tensor:
    """512 position vectors for the global tokens: global k gets a source position `stride` apart.

    The table is brought to 512 rows (cropped to a multiple of 512 and subsampled, or completed with
    draws from its per-dimension normal), then read column-major with `stride` rows per column:
    global 0 -> position 0, global 1 -> position stride, ..., as the 2023 reference does.
    """
    rows, width = table.shape
    if rows % MAX_GLOBAL_TOKENS:
        if rows > MAX_GLOBAL_TOKENS:
            table = table[: MAX_GLOBAL_TOKENS * (rows // MAX_GLOBAL_TOKENS)]
        else:
            mean, std = table.mean(0, keepdim=True), table.std(0, keepdim=True)
            fill = torch.normal(mean.expand(MAX_GLOBAL_TOKENS - rows, -1), std.expand(MAX_GLOBAL_TOKENS - rows, -1))
            table = torch.cat([table, fill.to(table.dtype)])
    factor = table.shape[0] // MAX_GLOBAL_TOKENS
    table = table[::factor]  # (512, E)
    step = max(stride // factor, 1)
    return table.reshape(-1, step, width).transpose(0, 1).reshape(-1, width)
