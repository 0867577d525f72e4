"""Long-document adaptation: a converted sentence-transformers model trained a little on the user's own
long, unlabeled texts, with sentence-transformers' trainer, so that one pass over a document does better
than embedding its chunks.

Converted without training, an LSG embedder is about as good as chunk-and-average; the gain of long-context embedders
comes from a little training at the long length (LongEmbed, Zhu et al. 2024: tuning only the position
vectors past the pretrained ones). The objective here is self-supervised, from the texts alone: a
passage of a document must find that document among the other documents of the batch (in-batch
negatives, `MultipleNegativesRankingLoss`; its cached variant where memory demands it). A quarter of
the passages are cut out of their document (only their context can match), three quarters left in it:
measured on held-out plays, training on cut-out passages alone gained on one kind of query at a time,
and three quarters in the document (at 3e-5) gained more on both kinds than half. Every epoch
cuts the texts afresh into other documents and passages (with one fixed cut the same pairs came back
every epoch, and the training loss fell from 1.2 to 0.2 within two). The whole model is trained by
default (measured: training only the new position rows and the global tokens, as LongEmbed does, gained
nothing over chunking here); ``train="positions"`` keeps a text the source could read exactly as it was.
After training, the weights move a fifth of the way back to the converted ones (``source_share=0.2``,
WiSE-FT): short texts stay nearer the source's embedding, the long-document gain stays.

``objective="spans"`` trains for late-chunked span vectors (`encode_spans`) instead: each passage must find
the span of its document where it lies among every span of the batch's documents (`SpanRankingLoss`),
with ``passages_per_document`` passages of each document as queries (docs/adaptation.md: measured, level
with the source adapted at its own length and run on chunks).

    from lsg_converter.adaptation import adapt_to_long_documents
    model = adapt_to_long_documents("./minilm-4096", texts="./my-documents", output_path="./minilm-4096-adapted")
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from .errors import InvalidSettingsError, TrainingTextsError, UnsupportedModelError, is_count, require
from .positions import PRETRAINED_POSITIONS_KEY
from .saving import check_output_folder, staged_folder
from .sbert import MODULES_FILE
from .sources import local_source
from .spans import default_span_tokens, fixed_spans, pooled_tokens, pooling_modules, special_tokens_around
from .training_budget import LearningRatePlan, TimeBudget, TrainingProgress, planned_trainer

logger = logging.get_logger(__name__)

# What the adaptation trains (see `trainable_parameters`).
TRAINABLE_PARTS = ("all", "positions+global", "positions", "global")
# AdamW's learning rate for each part where none is given: the whole model moves little, the new rows more.
LEARNING_RATES = {"all": 3e-5, "positions+global": 1e-3, "positions": 1e-3, "global": 1e-3}
TEXT_SUFFIXES = (".txt", ".md")  # the files a folder of texts is read from
# What a passage must find (see `adapt_to_long_documents`): its document among the batch's documents, or the span
# of its document where it lies among every span of the batch's documents
OBJECTIVES = ("documents", "spans")
# Where a step's negatives come from (see `adapt_to_long_documents`): documents of any text, or of the same text
NEGATIVES = ("any", "same-text")
# torch's vector capability (`torch.backends.cpu.get_cpu_capability`) of the x86 CPUs without AVX512, where
# oneDNN has no bfloat16 kernels: bfloat16 matrix products run without them, far slower than float32 (measured:
# benchmarks/RESULTS.md, "Adaptation step, float32 against bfloat16, a CPU without AVX512")
CPU_CAPABILITIES_WITHOUT_BF16 = ("NO AVX", "AVX2")


@dataclass(frozen=True)
class Adaptation:
    """What `adapt_to_long_documents` did, as the model card says it (the adapted LSG model's `lsg_adaptation`)."""

    texts: str  # what was read: "4 texts from `my-documents`" (a folder's or a file's name, never its path)
    documents: int  # the documents cut from the texts at each reading
    max_tokens: int  # the documents' length, at most
    steps: int  # the optimizer steps done
    batch_size: int
    train: str  # the part trained, one of TRAINABLE_PARTS
    learning_rate: float
    source_share: float
    objective: str = "documents"  # one of OBJECTIVES
    passages_per_document: int = 1
    short_steps: int = 0  # of `steps`, those done first on documents of the source's own length
    short_tokens: int = 0  # the length of those documents, at most
    negatives: str = "any"  # one of NEGATIVES
    short_batch_size: int = 0  # documents per step of the `short_steps` (`batch_size`: of the others)


@dataclass(frozen=True)
class DocumentPair:
    """One training example: a document and its passages, left in it or cut out of it; `places`: for each
    passage, the token of the document (special tokens left out) where it lies (its middle token) or lay
    (the first token after its cut); `text`: the index of the text it was cut from."""

    passages: tuple[str, ...]
    document: str
    places: tuple[int, ...]
    text: int = 0


def texts_description(texts: str | os.PathLike | Iterable[str], count: int) -> str:
    """How the model card names the `count` texts read from `texts`: "4 texts from `my-documents`" for a
    folder or a file (its name, never its path), "4 texts" for strings given."""
    plural = "text" if count == 1 else "texts"
    if isinstance(texts, (str, os.PathLike)):
        return f"{count} {plural} from `{Path(texts).resolve().name}`"
    return f"{count} {plural}"


def ranking_loss(model: Any, batch_size: int, mini_batch_size: int | None) -> Any:
    """The in-batch loss of `model`'s training: CachedMultipleNegativesRankingLoss, which holds
    `mini_batch_size` documents in memory at once (the same gradients), when that is fewer than the
    `batch_size` of a step; MultipleNegativesRankingLoss otherwise."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    if mini_batch_size is not None and mini_batch_size < batch_size:
        return CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini_batch_size)
    return MultipleNegativesRankingLoss(model)


class SpanRankingLoss(torch.nn.Module):
    """The in-batch loss of the "spans" objective: each passage (k per document) must find the span of its
    document where it lies (or lay, cut out: the dataset's ``label``, the span's index) among every span of
    every document of the batch, the other spans of its own document among them. The spans are runs of
    `span_tokens` tokens of one pass over each document, pooled as `encode_spans` pools them (late
    chunking); scored by cosine times `scale`, as MultipleNegativesRankingLoss scores."""

    def __init__(self, model: Any, span_tokens: int, scale: float = 20.0):
        super().__init__()
        self.model, self.span_tokens, self.scale = model, span_tokens, scale
        self.pooling_modes, self.after_pooling = pooling_modules(model)
        self.special_tokens = tuple(len(ids) for ids in special_tokens_around(model.tokenizer))

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        """sentence_features: k columns of passages, then the documents, B each; labels: (B, k) or (B,) for
        k = 1, the span index of each passage's place."""
        *passages, documents = sentence_features
        queries = torch.cat([self.model(column)["sentence_embedding"] for column in passages])  # (k B, d)
        read = self.model(documents)
        vectors, lengths = read["token_embeddings"], read["attention_mask"].sum(dim=1).tolist()  # (B, L, d)
        before, after = self.special_tokens
        labels = labels.view(len(lengths), len(passages)).tolist()
        spans, targets = [], []  # every document's span vectors in turn; each passage's among them, (B, k)
        for row, (length, row_labels) in enumerate(zip(lengths, labels)):
            body = vectors[row, before : length - after]  # the document's own tokens
            runs = fixed_spans(len(body), self.span_tokens)
            targets.append([len(spans) + min(label, len(runs) - 1) for label in row_labels])
            spans += [pooled_tokens(body, run, self.pooling_modes) for run in runs]
        features = {"sentence_embedding": torch.stack(spans)}
        for module in self.after_pooling:  # Dense, Normalize: as a text's embedding
            features = module(features)
        span_vectors = torch.nn.functional.normalize(features["sentence_embedding"], dim=-1)
        scores = torch.nn.functional.normalize(queries, dim=-1) @ span_vectors.T * self.scale  # (k B, spans)
        targets = torch.tensor(targets, device=scores.device).T.flatten()  # (B, k) -> (k B,), as the queries
        return torch.nn.functional.cross_entropy(scores, targets)


def read_texts(texts: str | os.PathLike | Iterable[str]) -> list[str]:
    """The texts to adapt on: a folder (every .txt and .md file under it, in sorted order), one file, or
    the strings given; TrainingTextsError when there are none."""
    if isinstance(texts, (str, os.PathLike)) and Path(texts).exists():
        path = Path(texts)
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
        read = [file.read_text(encoding="utf-8", errors="replace") for file in files]
    elif isinstance(texts, (str, os.PathLike)):
        raise TrainingTextsError(f"No texts at {texts}: give a folder of .txt or .md files, a file, or a list of strings.")
    else:
        read = list(texts)
    read = [text for text in read if isinstance(text, str) and text.strip()]
    if not read:
        raise TrainingTextsError("No texts to adapt on: give a folder of .txt or .md files, a file, or a list of strings.")
    return read


def document_rounds(
    texts: Sequence[str],
    tokenizer: Any,
    document_tokens: int,
    passage_tokens: int,
    min_tokens: int,
    *,
    rounds: int = 1,
    in_document_share: float = 0.0,
    passages_per_document: int = 1,
    seed: int = 0,
) -> list[list[DocumentPair]]:
    """`rounds` rounds of training pairs, each made afresh from all of `texts`. In a round, each text is cut
    into documents of `document_tokens` tokens, the first ending at a random token (so each round cuts
    other documents; a piece shorter than `min_tokens` or than its passages and one more is left out), and
    in each document `passages_per_document` passages of `passage_tokens` tokens are picked at random places
    that do not overlap: (the passages, the document's text without them), or, for a share
    `in_document_share` of the documents drawn at random, (the passages, the whole document). The cuts
    follow the tokenizer's character offsets, so both are pieces of the original text."""
    generator = random.Random(seed)
    token_offsets = [
        tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        for text in texts
    ]
    made = []
    for _ in range(rounds):
        pairs = []
        # offsets: each token's (start, end) characters
        for text_index, (text, offsets) in enumerate(zip(texts, token_offsets)):
            first_end = generator.randrange(1, document_tokens + 1)
            starts = [0] + list(range(first_end, len(offsets), document_tokens))
            for start, end in zip(starts, starts[1:] + [len(offsets)]):
                window = offsets[start:end]
                if len(window) < max(min_tokens, (passages_per_document + 1) * passage_tokens):
                    continue
                # the tokens outside the passages, split at random: the passages' first tokens
                free = len(window) - passages_per_document * passage_tokens
                lefts = sorted(generator.randrange(free + 1) for _ in range(passages_per_document))
                cuts = [left + index * passage_tokens for index, left in enumerate(lefts)]
                passages = tuple(text[window[cut][0] : window[cut + passage_tokens - 1][1]].strip() for cut in cuts)
                if generator.random() < in_document_share:
                    document, places = text[window[0][0] : window[-1][1]], [cut + passage_tokens // 2 for cut in cuts]
                else:  # the text between the passages, joined
                    kept, previous_end = [], window[0][0]
                    for cut in cuts:
                        kept.append(text[previous_end : window[cut][0]])
                        previous_end = window[cut + passage_tokens - 1][1]
                    kept.append(text[previous_end : window[-1][1]] if cuts[-1] + passage_tokens < len(window) else "")
                    document = " ".join(piece for piece in (piece.strip() for piece in kept) if piece)
                    places = [cut - index * passage_tokens for index, cut in enumerate(cuts)]
                pairs.append(DocumentPair(passages, document.strip(), tuple(places), text_index))
        made.append(pairs)
    return made


def counted(number: int, noun: str) -> str:
    """`number` and `noun`, plural unless it is one: "1 text", "0 documents", "3 texts"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def round_batch_sampler(round_sizes: Sequence[int], row_texts: Sequence[int] | None = None) -> type:
    """A sentence-transformers batch sampler class for a dataset made of rounds, `round_sizes[r]` rows
    each, one after the other (every round holds each document once): each round is shuffled and cut
    into batches on its own (its last, short batch dropped with drop_last), so a batch never holds two
    pairs of one document, each other's in-batch negatives. `row_texts`, the text each row was cut from:
    each round's rows then come text by text (the texts in a random order, each one's rows shuffled), so a
    batch holds documents of one text, or of two where one text's rows run out."""
    from sentence_transformers.base.sampler import DefaultBatchSampler

    class RoundBatchSampler(DefaultBatchSampler):
        def __iter__(self) -> Iterator[list[int]]:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            start = 0
            for size in round_sizes:
                order = (start + torch.randperm(size, generator=generator)).tolist()
                if row_texts is not None:  # a stable sort by the texts' drawn ranks keeps each text's rows shuffled
                    text_rank = torch.randperm(max(row_texts) + 1, generator=generator).tolist()
                    order.sort(key=lambda row: text_rank[row_texts[row]])
                start += size
                for first in range(0, size, self.batch_size):
                    batch = order[first : first + self.batch_size]
                    if len(batch) == self.batch_size or not self.drop_last:
                        yield batch

        def __len__(self) -> int:
            if self.drop_last:
                return sum(size // self.batch_size for size in round_sizes)
            return sum(-(-size // self.batch_size) for size in round_sizes)

    return RoundBatchSampler


@contextlib.contextmanager
def trained_part(transformer: torch.nn.Module, part: str) -> Iterator[list[torch.nn.Parameter]]:
    """Within the block, everything in the LSG model `transformer` is frozen but `part` (`TRAINABLE_PARTS`),
    which the block gets: "positions": the rows of the position tables past the source's pretrained length
    (a gradient hook zeroes the rows before them); "global": the global token table; "all": every
    parameter. After it, every parameter is trainable again as it was, and the hooks are gone."""
    if part not in TRAINABLE_PARTS:
        raise InvalidSettingsError(f"train={part!r} is unknown: use one of {', '.join(TRAINABLE_PARTS)}.")
    was_trained = {parameter: parameter.requires_grad for parameter in transformer.parameters()}
    hooks = []
    try:
        for parameter in transformer.parameters():
            parameter.requires_grad_(part == "all")
        trained = list(transformer.parameters()) if part == "all" else []
        if "global" in part and transformer.lsg_global_embeddings is not None:
            trained.append(transformer.lsg_global_embeddings.weight.requires_grad_(True))
        if "positions" in part:
            for table, kept_rows in _position_tables(transformer):
                mask = torch.ones(table.shape[0], 1, dtype=table.dtype, device=table.device)
                mask[:kept_rows] = 0
                hooks.append(table.requires_grad_(True).register_hook(lambda gradient, mask=mask: gradient * mask.to(gradient)))
                trained.append(table)
        yield trained
    finally:
        for hook in hooks:
            hook.remove()
        for parameter, requires_grad in was_trained.items():
            parameter.requires_grad_(requires_grad)


def _position_tables(transformer: torch.nn.Module) -> list[tuple[torch.nn.Parameter, int]]:
    """The position tables of `transformer`, each with its first rows to keep (the offset rows and the
    source's pretrained positions)."""
    layout, config = transformer.lsg_layout, transformer.config
    modules = dict(transformer.base_model.named_modules())
    pretrained = getattr(config, PRETRAINED_POSITIONS_KEY, None) or layout.max_input_length(config)
    offset = lambda table: table.shape[0] - layout.max_input_length(config)  # noqa: E731
    return [
        (modules[name].weight, offset(modules[name].weight) + pretrained)
        for name in layout.position_tables
        if name in modules
    ]


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of `model`'s parameters, by name (what `blend_weights` moves back to)."""
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def blend_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], share: float) -> None:
    """Move each parameter of `model` named in `weights` the `share` of the way to it, in place:
    (1 - share) * trained + share * given (weight-space ensembling, WiSE-FT)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in weights:
                parameter.lerp_(weights[name].to(parameter), share)


def adapt_to_long_documents(
    model: Any,
    texts: str | os.PathLike | Iterable[str],
    *,
    output_path: str | os.PathLike | None = None,
    overwrite: bool = False,
    train: str = "all",
    passage_tokens: int = 64,
    in_document_share: float = 0.75,
    objective: str = "documents",
    passages_per_document: int = 1,
    negatives: str = "any",
    short_share: float = 0.0,
    batch_size: int = 8,
    long_batch_size: int | None = None,
    mini_batch_size: int | None = None,
    epochs: float = 4.0,
    max_steps: int = -1,
    max_minutes: float | None = None,
    learning_rate: float | None = None,
    bf16: bool = False,
    source_share: float = 0.2,
    seed: int = 0,
    callbacks: Sequence[TrainerCallback] = (),
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Adapt a converted sentence-transformers model to long documents, on the user's own texts.

    Args:
        model: a SentenceTransformer whose first module reads text with an LSG model, or the folder or
            Hub id of one (loaded with trust_remote_code=True), as `lsg-convert` writes it.
        texts: unlabeled long texts: a folder (its .txt and .md files), a file, or a list of strings.
            Each is cut into documents of the model's max_seq_length tokens.
        output_path: where to save the adapted model (sentence-transformers' layout and model card, which
            describes the training; nothing is written if the adaptation fails); None: not saved.
        overwrite: replace an earlier output at `output_path` (a folder holding a model's config.json);
            a file or a folder of anything else is never replaced (see `saving.check_output_folder`).
        train: what is trained, one of `TRAINABLE_PARTS`: "all" (default: the whole model; measured on
            held-out plays, benchmarks/RESULTS.md, the only choice that gained over chunking),
            "positions+global" (the position rows past the source's pretrained length and the global
            tokens: a text the source could read keeps its positions), "positions" or "global".
        passage_tokens: length of the passage picked in each document, the query it must answer.
        in_document_share: the share of the documents whose passage is left in them (the others are
            given without it, so only its context can match): both kinds of query are learnt.
        objective: what a passage must find, one of `OBJECTIVES`: "documents" (default), its document among
            the documents of its step (`MultipleNegativesRankingLoss`); "spans", the span of its document where
            it lies (or lay) among every span of the step's documents, its own document's other spans
            among them (`SpanRankingLoss`): the spans `encode_spans` gives, of the source's window body.
        passages_per_document: passages picked in each document (at places that do not overlap; all left in
            it or all cut out), each a query of the step: more than one with the "spans" objective only.
        negatives: where the documents of a step come from, one of `NEGATIVES`: "any" (default), drawn at random
            from every text; "same-text", from one text as far as it holds them (hard negatives: documents
            that share their names and setting, told apart by what else they hold; measured: docs/adaptation.md).
        short_share: the share of the training (of `max_minutes`, the long part getting what the short one
            leaves; else of the epochs or `max_steps`) spent first on documents of the source's own length
            (its window body: `encode_spans`'s spans), the rest at the model's: the short steps cost about
            what the source's do, so the budget buys many of them to learn the texts, and the long steps
            that follow learn what the rest of a document adds (measured: docs/adaptation.md). Each part
            has its own optimizer and warm-up. 0 (default): every step at the model's length; a model
            adapted at its own length has no shorter documents, and trains as with 0.
        batch_size: documents per step, each the others' negatives.
        long_batch_size: documents per step at the model's length (None: `batch_size`, which is then the short
            part's, with `short_share`). Fewer fit the long part in less memory (the spans objective has no
            cached loss) and buy more long steps in the same minutes, but lowered retrieval of cut-out passages
            (measured: docs/adaptation.md).
        mini_batch_size: run the cached in-batch loss (CachedMultipleNegativesRankingLoss) with this many
            documents in memory at once, for a batch larger than memory allows (the same gradients, a little
            more time); None: the plain loss.
        epochs: how many times the texts are read, each time cut into other documents and passages
            (a fraction reads part of the last time); max_steps > 0: optimizer steps instead.
        max_minutes: a time budget: the first step is timed, the learning rate's warm-up is planned on the
            steps the budget then buys (logged, as a warning when they are fewer than the epochs hold), and
            the training stops when the next step would not fit.
        learning_rate: AdamW's, without weight decay; None: `LEARNING_RATES` of `train` (3e-5 for "all").
        bf16: train in bfloat16 mixed precision (torch.autocast; the weights and the optimizer stay in
            float32): about a quarter less time per step on a CPU with AVX512-BF16 or AMX, measured
            (benchmarks/RESULTS.md), so more steps in `max_minutes`; on an x86 CPU without AVX512 many times
            slower (said in a warning).
        source_share: after training, move every weight this share of the way back to the model as it
            was given (weight-space ensembling, WiSE-FT, Wortsman et al. 2022); 0 keeps the trained
            weights. Measured on held-out plays (benchmarks/RESULTS.md), 0.2 lifted the lowest
            short-text cosine to the source's embedding from 0.949 to 0.961 and kept the retrieval gain
            (in-document +0.043 -> +0.050 MRR over chunk-and-average, cut-out +0.077 -> +0.075).
        seed: of the cuts, the shuffling and the training.
        callbacks: more transformers TrainerCallbacks for the trainer.
        clock: the time source of `max_minutes`, in seconds.

    The learning rate rises linearly over the first tenth of the planned steps, then stays at its peak. The
    training's progress bar follows transformers' switch (`transformers.utils.logging.disable_progress_bar`)
    and its logged losses are info logs of this module. The adapted LSG model (``model[0].auto_model``)
    records what was done as `lsg_adaptation` (an `Adaptation`), which its model card then says.

    Returns:
        The adapted SentenceTransformer (the one given, trained in place).

    Raises:
        TrainingTextsError: no texts, or too few long enough to cut documents of two blocks from (of a whole
            window's body, where it holds fewer tokens: a model adapted at its own length).
        UnsupportedModelError: `model` is no sentence-transformers model over an LSG model.
        InvalidSettingsError: an unknown `train`, `objective` or `negatives`, `in_document_share` / `source_share` /
            `short_share` out of range (or documents of the source's length too short for its passages),
            `mini_batch_size` with the "spans" objective (which has no cached variant), or
            `passages_per_document` other than 1 without it, a `long_batch_size` below 1.
        MissingDependencyError: sentence-transformers or datasets is not installed.
        OutputExistsError: `output_path` holds a model and `overwrite` is False; its subclass
            OutputNotReplaceableError: `output_path` is a file or a folder of anything else.
    """
    require("sentence_transformers", "Adapting a model to long documents")
    require("datasets", "Adapting a model to long documents")
    from sentence_transformers import SentenceTransformer

    given_texts, texts = texts, read_texts(texts)
    if output_path is not None:
        source = model if isinstance(model, (str, os.PathLike)) else None
        target = check_output_folder(output_path, overwrite, source=source)
    if not isinstance(model, SentenceTransformer):
        folder = local_source(str(model))
        if folder is not None and not (folder / MODULES_FILE).is_file():
            raise UnsupportedModelError(
                f"{model} is no sentence-transformers model (no {MODULES_FILE}): adapt_to_long_documents adapts one "
                "converted by lsg-convert from a sentence-transformers source."
            )
        model = SentenceTransformer(str(model), trust_remote_code=True)
    transformer = getattr(model[0], "auto_model", None) if len(model) else None
    if transformer is None or not hasattr(transformer, "lsg_layout"):
        raise UnsupportedModelError(
            "adapt_to_long_documents adapts a sentence-transformers model over an LSG model: convert it first "
            "(lsg-convert <model> --max-len 4096)."
        )
    if not 0.0 <= in_document_share <= 1.0:
        raise InvalidSettingsError(f"in_document_share={in_document_share} is no share: give a number from 0 to 1.")
    if objective not in OBJECTIVES:
        raise InvalidSettingsError(f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}: give one of them.")
    if negatives not in NEGATIVES:
        raise InvalidSettingsError(f"negatives={negatives!r} is not one of {', '.join(NEGATIVES)}: give one of them.")
    if objective == "spans" and mini_batch_size is not None:
        raise InvalidSettingsError(
            "The spans objective has no cached loss: leave mini_batch_size unset, or give a smaller batch_size."
        )
    if not is_count(passages_per_document):
        raise InvalidSettingsError(
            f"passages_per_document={passages_per_document!r} is no number of passages: give a whole number of at least 1."
        )
    if passages_per_document > 1 and objective != "spans":
        raise InvalidSettingsError("Several passages per document need objective='spans': give it, or one passage per document.")
    if long_batch_size is not None and not is_count(long_batch_size):
        raise InvalidSettingsError(
            f"long_batch_size={long_batch_size!r} is no number of documents: give a whole number of at least 1, or None."
        )
    if not 0.0 <= source_share < 1.0:
        raise InvalidSettingsError(f"source_share={source_share} is no share: give a number from 0 (the trained weights) up to 1.")
    if not 0.0 <= short_share < 1.0:
        raise InvalidSettingsError(
            f"short_share={short_share} is no share: give a number from 0 (every step at the model's length) up to 1."
        )
    capability = torch.backends.cpu.get_cpu_capability()
    if bf16 and not torch.cuda.is_available() and capability in CPU_CAPABILITIES_WITHOUT_BF16:
        logger.warning(
            f"bf16=True on a CPU without AVX512 (torch reports {capability}): its bfloat16 "
            "matrix products have no fast kernels here and a step takes many times longer than in float32; leave bf16 off."
        )
    document_tokens = model.max_seq_length - 2  # a window's body, between its first and last token
    span_tokens = default_span_tokens(model, special_tokens_around(model.tokenizer))
    long_batch_size = batch_size if long_batch_size is None else long_batch_size
    # (document tokens, share of the training, seed of the cuts, documents per step): the source's own length
    # first, where asked
    phases = [(document_tokens, 1.0, seed, long_batch_size)]
    if short_share and span_tokens < document_tokens:
        if span_tokens < (passages_per_document + 1) * passage_tokens:
            raise InvalidSettingsError(
                f"short_share needs documents of the source's own length ({span_tokens} tokens) to hold "
                f"{counted(passages_per_document, 'passage')} of {passage_tokens} tokens and as many more: give a "
                "smaller passage_tokens, or leave short_share at 0."
            )
        phases = [(span_tokens, short_share, seed + 1, batch_size), (document_tokens, 1.0 - short_share, seed, long_batch_size)]
    phase_rounds, batch_sizes = [], []
    for tokens, share, cut_seed, phase_batch_size in phases:
        # two blocks, or a whole window's body where it holds fewer (a model adapted at its own length)
        min_tokens = min(2 * transformer.config.block_size, tokens)
        rounds = document_rounds(
            texts, model.tokenizer, tokens, passage_tokens, min_tokens,
            rounds=max(1, math.ceil(epochs * share)), in_document_share=in_document_share,
            passages_per_document=passages_per_document, seed=cut_seed,
        )  # fmt: skip
        smallest_round = min(len(made) for made in rounds)
        if smallest_round < 2:
            what = "two blocks" if min_tokens < tokens else "a whole window"
            raise TrainingTextsError(
                f"The texts given ({counted(len(texts), 'text')}) give {counted(smallest_round, 'document')} of at "
                f"least {min_tokens} tokens ({what}): adapting needs two or more; give longer texts."
            )
        batch_sizes.append(min(phase_batch_size, smallest_round))
        phase_rounds.append(rounds)
    learning_rate = LEARNING_RATES[train] if learning_rate is None else learning_rate
    if objective == "spans":
        loss = SpanRankingLoss(model, span_tokens)
    else:
        loss = ranking_loss(model, max(batch_sizes), mini_batch_size)
    phase_max_steps = [max_steps] * len(phases)  # -1: the epochs decide
    if max_steps > 0 and len(phases) > 1:
        short_steps = max(1, round(max_steps * short_share))
        phase_max_steps = [short_steps, max(1, max_steps - short_steps)]
    with trained_part(transformer, train) as trained:
        logger.info(
            f"Adapting on {len(phase_rounds[-1][0])} documents of up to {model.max_seq_length} tokens from {len(texts)} "
            f"texts ({len(phase_rounds[-1])} times cut)"
            + (f", after {len(phase_rounds[0][0])} of up to {span_tokens + 2} tokens" if len(phases) > 1 else "")
            + f"; training {train} ({sum(p.numel() for p in trained):,} values)."
        )
        as_given = weights_of(model) if source_share else {}
        started, steps = clock(), []
        for index, ((_, share, _, _), rounds, phase_batch_size, phase_steps) in enumerate(
            zip(phases, phase_rounds, batch_sizes, phase_max_steps)
        ):
            minutes = max_minutes
            if max_minutes is not None and len(phases) > 1:  # the short part its share, the long what is left
                minutes = max_minutes * share if index == 0 else max_minutes - (clock() - started) / 60
            steps.append(_train(
                model, loss, rounds, span_tokens, passages_per_document, same_text=negatives == "same-text",
                batch_size=phase_batch_size, epochs=epochs * share,
                max_steps=phase_steps, minutes=minutes, learning_rate=learning_rate, bf16=bf16, seed=seed,
                callbacks=callbacks, clock=clock, cards_the_training=output_path is not None,
            ))  # fmt: skip
    blend_weights(model, as_given, source_share)
    transformer.lsg_adaptation = Adaptation(
        texts=texts_description(given_texts, len(texts)), documents=len(phase_rounds[-1][0]),
        max_tokens=model.max_seq_length, steps=sum(steps), batch_size=batch_sizes[-1], train=train,
        learning_rate=learning_rate, source_share=source_share, objective=objective,
        passages_per_document=passages_per_document, short_steps=steps[0] if len(steps) > 1 else 0,
        short_tokens=span_tokens + 2 if len(steps) > 1 else 0, negatives=negatives,
        short_batch_size=batch_sizes[0] if len(steps) > 1 else 0,
    )
    model.eval()
    if output_path is not None:
        with staged_folder(target, overwrite) as staging:
            model.save(str(staging))
    return model


def _train(
    model: Any,
    loss: torch.nn.Module,
    rounds: list[list[DocumentPair]],
    span_tokens: int,
    passages_per_document: int,
    *,
    same_text: bool,
    batch_size: int,
    epochs: float,
    max_steps: int,
    minutes: float | None,
    learning_rate: float,
    bf16: bool,
    seed: int,
    callbacks: Sequence[TrainerCallback],
    clock: Callable[[], float],
    cards_the_training: bool,
) -> int:
    """One training of `adapt_to_long_documents` on `rounds` of pairs, its own optimizer, warm-up and
    `minutes` (`same_text`: each step's documents cut from one text as far as it holds them); returns the
    optimizer steps done."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainingArguments
    from transformers import PrinterCallback

    pairs = [pair for made in rounds for pair in made]
    # the queries first, then what they must find (the order the losses read the columns in)
    columns = {f"passage_{index}": [pair.passages[index] for pair in pairs] for index in range(passages_per_document)}
    columns["document"] = [pair.document for pair in pairs]
    if isinstance(loss, SpanRankingLoss):  # the span that holds each passage's place
        columns["label"] = [[place // span_tokens for place in pair.places] for pair in pairs]
    with tempfile.TemporaryDirectory() as scratch:
        arguments = SentenceTransformerTrainingArguments(
            output_dir=scratch,
            num_train_epochs=epochs / len(rounds),  # the rounds are one epoch of the dataset
            max_steps=max_steps,
            per_device_train_batch_size=batch_size,
            learning_rate=learning_rate,
            weight_decay=0.0,
            batch_sampler=round_batch_sampler(
                [len(made) for made in rounds], [pair.text for pair in pairs] if same_text else None
            ),
            dataloader_drop_last=True,
            save_strategy="no",
            logging_steps=max(1, len(pairs) // batch_size // 10),
            report_to=[],
            seed=seed,
            bf16=bf16,
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,  # the trainer's bar and printed logs: TrainingProgress instead
        )
        plan = LearningRatePlan()
        trainer = planned_trainer(plan, cards_the_training)(
            model=model, args=arguments, train_dataset=Dataset.from_dict(columns), loss=loss,
            callbacks=[TimeBudget(minutes, plan, clock), TrainingProgress(), *callbacks],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        # bf16: the trainer's accelerator wrapped the model's forward in autocast; it runs in float32 again
        trainer.accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    return trainer.state.global_step


def check_can_adapt(source: str, token: str | bool | None = None, architecture: str | None = None) -> None:
    """UnsupportedModelError where the model converted from `source` (as `architecture`, default the
    source's head) could not be adapted (`adapt_converted_model`): the source is no sentence-transformers
    model (no modules.json: a T5 or any plain transformers model), or `architecture` is a head, whose
    conversion carries no pipeline. Reads the source's config and modules.json only: called before converting."""
    from .architectures import find_architecture
    from .sbert import has_pipeline
    from .sources import load_source_config

    if not has_pipeline(source, token):
        raise UnsupportedModelError(
            f"{source} is no sentence-transformers model (no {MODULES_FILE}): only a model converted from a "
            "sentence-transformers source can be adapted to long documents; convert it without texts="
        )
    if architecture is not None:
        arch = find_architecture(load_source_config(source, token).model_type)
        if arch.lsg_class(architecture) is not arch.lsg_class(arch.base_head):
            raise UnsupportedModelError(
                f"architecture={architecture!r} is a head, which carries no sentence-transformers pipeline: only "
                f"the bare model ({arch.base_head}) can be adapted to long documents; convert the head without texts="
            )


def adapt_converted_model(model: Any, tokenizer: Any, texts: str | os.PathLike | Iterable[str], **options: Any) -> Any:
    """`adapt_to_long_documents` for a converted model as `LSGConverter.convert_from_pretrained` returns it
    (with its sentence-transformers pipeline): trained through sentence-transformers, in place (`options`
    as `adapt_to_long_documents` takes them, without output_path). Returns `model`, with what was done as its
    `lsg_adaptation` (an `Adaptation`: `model_card` says it)."""
    from .sbert import pipeline_of

    if pipeline_of(model) is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no sentence-transformers pipeline: only a model converted from a "
            "sentence-transformers source (modules.json) can be adapted to long documents."
        )
    from .saving import save_converted

    with tempfile.TemporaryDirectory() as scratch:
        folder = save_converted(model, tokenizer, Path(scratch) / "converted")
        adapted = adapt_to_long_documents(folder, texts, **options)
        model.load_state_dict(adapted[0].auto_model.state_dict())
    model.lsg_adaptation = adapted[0].auto_model.lsg_adaptation
    return model
