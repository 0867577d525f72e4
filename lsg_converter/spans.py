"""Span vectors from one pass over a long text ("late chunking", Günther et al. 2024).

An LSG embedder reads a whole long text at once: each token's vector then carries what the rest of the text
says around it. `encode_spans` pools those token vectors over spans of the text (fixed-size runs of tokens,
or character spans the caller gives) as the model's pipeline pools a text, giving one vector per span, each
with its character offsets: the pieces a retrieval index holds, read in context rather than cut out first.

Texts longer than the model reads are read in overlapping windows; each token's vector comes from the window
in which it lies farthest from an edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from .errors import InvalidSettingsError, UnsupportedModelError, is_count, require

logger = logging.get_logger(__name__)

# Windows of a text longer than the model reads overlap by this share of a window's body.
WINDOW_OVERLAP = 0.25


@dataclass
class SpanEmbeddings:
    """The span vectors of one text: `embeddings` (spans, dimension), and each span's (start, end) character
    offsets in the text (`text[start:end]` is the span, from its first token's start to its last token's end)."""

    embeddings: torch.Tensor
    offsets: list[tuple[int, int]]


def encode_spans(
    model: Any,
    texts: str | Sequence[str],
    span_tokens: int | None = None,
    spans: Sequence[Sequence[tuple[int, int]]] | None = None,
    show_progress_bar: bool | None = None,
    batch_size: int = 8,
) -> list[SpanEmbeddings]:
    """Vectors of the spans of each text, from one pass of `model` over the whole text (late chunking).

    Args:
        model: a SentenceTransformer whose first module is a Transformer (a converted LSG model, or any).
        texts: a text, or texts.
        span_tokens: the spans are consecutive runs of this many tokens (the last one shorter); default: the
            window body of the source the model was converted from (its ``pretrained_positions`` less the
            tokenizer's special tokens: 510 for a BERT-like source of 512 positions), else of the model.
        spans: instead, the spans of each text as (start, end) character offsets; a span holds the tokens that
            overlap it.
        show_progress_bar: a progress bar over the texts (default: where sentence-transformers' logging is at
            INFO or below, as its encode does).
        batch_size: inputs the model reads at once, in one padded forward (right padding, attention mask):
            the texts, longest first (by tokens) as sentence-transformers' encode sorts them, `batch_size` at a
            time, a text longer than the model reads giving one input per window. The results come back in the
            caller's order.

    Returns:
        One `SpanEmbeddings` per text, in order. A span vector is the span's token vectors pooled as the
        pipeline's Pooling module pools ("mean", "max", "weightedmean" as they are; "cls" and "lasttoken",
        which name one token of the whole text, as "mean", said once), then through the modules after it
        (Dense, Normalize) as a text's would be.

    Raises:
        UnsupportedModelError: `model` is no SentenceTransformer with a Transformer and a Pooling module.
        InvalidSettingsError: both or an invalid `span_tokens` / `spans`; a span that holds no token; a
            `batch_size` below 1.
        MissingDependencyError: sentence-transformers is not installed.
    """
    require("sentence_transformers", "Span vectors")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if spans is not None and span_tokens is not None:
        raise InvalidSettingsError("encode_spans got span_tokens= and spans=: give one of them.")
    if spans is not None and len(spans) != len(texts):
        raise InvalidSettingsError(f"encode_spans got {len(spans)} span lists for {len(texts)} texts: give one per text.")
    if not is_count(batch_size):
        raise InvalidSettingsError(f"batch_size={batch_size!r} is no number of texts: give a whole number of at least 1.")
    pooling, after_pooling = pooling_modules(model)
    special_tokens = special_tokens_around(model.tokenizer)
    span_tokens = default_span_tokens(model, special_tokens) if span_tokens is None and spans is None else span_tokens
    if spans is None and not is_count(span_tokens):
        raise InvalidSettingsError(f"span_tokens={span_tokens!r} is no number of tokens: give a whole number of at least 1.")
    if show_progress_bar is None:
        show_progress_bar = logging.get_logger("sentence_transformers").getEffectiveLevel() <= logging.INFO
    tokenized = _tokenized(model.tokenizer, texts)  # (ids, offsets) per text
    token_runs = []  # per text, the tokens of each span: a span without tokens is refused before the model runs
    for index, (_, offsets) in enumerate(tokenized):
        if spans is None:
            token_runs.append(fixed_spans(len(offsets), span_tokens))
        else:
            token_runs.append([_tokens_in(offsets, span, index) for span in spans[index]])
    order = sorted(range(len(texts)), key=lambda index: -len(tokenized[index][0]))  # longest first, stable
    results: list[SpanEmbeddings | None] = [None] * len(texts)
    model.eval()
    with torch.no_grad(), tqdm(total=len(texts), desc="span vectors", unit="text", disable=not show_progress_bar) as progress:
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            batch_vectors = _token_vectors_of(model, [tokenized[index][0] for index in batch], special_tokens, batch_size)
            for index, vectors in zip(batch, batch_vectors):
                offsets, runs = tokenized[index][1], token_runs[index]
                pooled = torch.stack([pooled_tokens(vectors, run, pooling) for run in runs]) if runs else vectors[:0]
                features = {"sentence_embedding": pooled}
                for module in after_pooling:
                    features = module(features)
                results[index] = SpanEmbeddings(features["sentence_embedding"], [(offsets[r[0]][0], offsets[r[-1]][1]) for r in runs])
            progress.update(len(batch))
    return results


def token_vectors(model: Any, text: str) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """Each token of `text` (special tokens left out): its (start, end) characters, and its vector from the
    model's Transformer module (T, dimension), read in one window where the text fits the model, else in
    windows overlapping by `WINDOW_OVERLAP`, each token's vector from the window where it lies farthest from
    an edge."""
    ((ids, offsets),) = _tokenized(model.tokenizer, [text])
    (vectors,) = _token_vectors_of(model, [ids], special_tokens_around(model.tokenizer), batch_size=1)
    return offsets, vectors


def special_tokens_around(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own ([CLS] and [SEP], <s> and </s>, ...)."""
    word = tokenizer("a", add_special_tokens=False)["input_ids"]
    framed = tokenizer("a", add_special_tokens=True)["input_ids"]
    start = next(i for i in range(len(framed)) if framed[i : i + len(word)] == word)
    return framed[:start], framed[start + len(word) :]


def _tokenized(tokenizer: Any, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each text's token ids (special tokens left out) and their (start, end) characters."""
    if not texts:
        return []
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return [(ids, [tuple(span) for span in offsets]) for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"])]


def _token_vectors_of(
    model: Any, texts_ids: list[list[int]], special_tokens: tuple[list[int], list[int]], batch_size: int
) -> list[torch.Tensor]:
    """The vectors (T, dimension) of each text's T token ids (special tokens left out) from the model's
    Transformer module: a text that fits the model is one window, a longer one windows overlapping by
    `WINDOW_OVERLAP`, each token's vector from the window where it lies farthest from an edge. The windows of
    all the texts are read `batch_size` at a time, in their order (texts longest first: least padding)."""
    before, after = special_tokens
    body = model.max_seq_length - len(before) - len(after)
    step = max(1, int(body * (1 - WINDOW_OVERLAP)))
    windows = []  # (text, start of the window in the text's tokens)
    for text, ids in enumerate(texts_ids):
        starts = [0] if len(ids) <= body else [*range(0, len(ids) - body, step), len(ids) - body]
        windows += [(text, start) for start in starts]
    window_vectors = []
    for first in range(0, len(windows), batch_size):
        chunk = [texts_ids[text][start : start + body] for text, start in windows[first : first + batch_size]]
        read = _window_vectors(model, [before + window_ids + after for window_ids in chunk])
        window_vectors += [vectors[len(before) : len(before) + len(window_ids)] for vectors, window_ids in zip(read, chunk)]
    results: list[torch.Tensor | None] = [None] * len(texts_ids)
    distances = [torch.full((len(ids),), -1) for ids in texts_ids]
    for (text, start), window in zip(windows, window_vectors):  # a text's windows in order, as they start
        if results[text] is None:
            results[text] = window.new_empty(len(texts_ids[text]), window.shape[-1])
        vectors, distance_to_edge = results[text], distances[text]
        positions = torch.arange(window.shape[0])
        distance = torch.minimum(positions, window.shape[0] - 1 - positions)  # to the window's nearer edge
        better = distance > distance_to_edge[start : start + window.shape[0]]
        vectors[start : start + window.shape[0]][better] = window[better]
        distance_to_edge[start : start + window.shape[0]][better] = distance[better]
    return results


def _window_vectors(model: Any, windows: list[list[int]]) -> list[torch.Tensor]:
    """The vectors (w, dimension) of each window's w token ids (the special tokens around them included), read
    by the model's Transformer module as one batch: right padding, an attention mask."""
    device = next(model.parameters()).device
    pad_id = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    longest = max(len(ids) for ids in windows)
    input_ids = torch.tensor([ids + [pad_id] * (longest - len(ids)) for ids in windows], device=device)
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (longest - len(ids)) for ids in windows], device=device)
    features = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in model.tokenizer.model_input_names:
        features["token_type_ids"] = torch.zeros_like(input_ids)
    token_embeddings = model[0](features)["token_embeddings"].cpu()
    return [token_embeddings[row, : len(ids)] for row, ids in enumerate(windows)]


def _tokens_in(offsets: list[tuple[int, int]], span: tuple[int, int], text_index: int) -> range:
    """The tokens whose characters overlap the character span (start, end) of a text."""
    start, end = span
    inside = [i for i, (first, last) in enumerate(offsets) if first < end and last > start]
    if not inside:
        raise InvalidSettingsError(
            f"The span ({start}, {end}) of text {text_index} holds no token: give (start, end) character offsets "
            "with start < end, within the text."
        )
    return range(inside[0], inside[-1] + 1)


def fixed_spans(num_tokens: int, span_tokens: int) -> list[range]:
    """The tokens of each span of a text of `num_tokens` tokens cut into runs of `span_tokens` (the last one
    shorter)."""
    return [range(start, min(start + span_tokens, num_tokens)) for start in range(0, num_tokens, span_tokens)]


def pooled_tokens(vectors: torch.Tensor, tokens: range, modes: tuple[str, ...]) -> torch.Tensor:
    """The vectors of `tokens` pooled by each of `modes`, joined as sentence-transformers' Pooling joins them."""
    span = vectors[tokens.start : tokens.stop]
    pieces = []
    for mode in modes:
        if mode == "max":
            pieces.append(span.max(dim=0).values)
        elif mode == "weightedmean":  # sentence-transformers weighs the tokens by their position, from 1
            weights = torch.arange(1, len(span) + 1, dtype=span.dtype, device=span.device)[:, None]
            pieces.append((span * weights).sum(dim=0) / weights.sum())
        else:
            pieces.append(span.mean(dim=0))
    return torch.cat(pieces)


def pooling_modules(model: Any) -> tuple[tuple[str, ...], list[Any]]:
    """The pooling modes of the model's Pooling module, and the modules after it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    modules = list(model) if isinstance(model, SentenceTransformer) else []
    where = next((i for i, module in enumerate(modules) if isinstance(module, Pooling)), None)
    if not modules or not isinstance(modules[0], Transformer) or where is None:
        raise UnsupportedModelError(
            "encode_spans reads a SentenceTransformer whose first module is a Transformer and which pools with a "
            "Pooling module: load one with SentenceTransformer(folder, trust_remote_code=True)."
        )
    mode = modules[where].pooling_mode
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    for unsupported in sorted({"cls", "lasttoken"} & set(modes)):
        logger.warning_once(
            f"The model pools with {unsupported!r}, one token of the whole text: its span vectors are the mean of their "
            "tokens' vectors instead."
        )
    return modes, modules[where + 1 :]


def default_span_tokens(model: Any, special_tokens: tuple[list[int], list[int]]) -> int:
    """The window body of the source the model was converted from (its pretrained positions), else of the
    model; `special_tokens`: the ids the tokenizer puts before and after a text (`special_tokens_around`)."""
    config = getattr(model[0].auto_model, "config", None)
    positions = getattr(config, "pretrained_positions", None)
    before, after = special_tokens
    return (positions or model.max_seq_length) - len(before) - len(after)
