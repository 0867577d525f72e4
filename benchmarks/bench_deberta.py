"""LSG-DeBERTa against the dense DeBERTa it was converted from: time and peak memory, side by side in one run.

    python benchmarks/bench_deberta.py                      # 12 layers: dense and LSG at 1k-4k, LSG to 16k
    python benchmarks/bench_deberta.py --layers 2 --results "CPU, 2 layers"

The source is a randomly initialised DeBERTa-v3-base (hidden 768, 12 heads, intermediate 3072,
``--layers`` layers, 256 log buckets up to 512, c2p and p2c from shared, normalised relative
embeddings, no absolute positions), saved, then converted by `LSGConverter` with the library's
defaults (local blocks of 170, one global token) to the longest length measured. Inputs are random
token ids, batch 1.

For each length it measures, each model in a process of its own (peak memory is a process-wide
figure): the forward pass (eval mode, no grad) and a training step (train mode, activation
checkpointing on, forward + backward of the mean square of the last hidden states): the median
time of ``--repeats`` runs after one warm-up run at the same length, and the peak resident set of one run
above the resident set before it (Linux: the peak is reset through /proc/self/clear_refs first; the
gradients the warm-up allocated are kept, zeroed, so the training peak is the step's activations).
``--results`` writes the tables into benchmarks/RESULTS.md under that title.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

V3_BASE = dict(
    hidden_size=768, num_attention_heads=12, intermediate_size=3072, vocab_size=128100, max_position_embeddings=512,
    relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
    norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False, type_vocab_size=0,
)
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def resident_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in MiB."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def step(model: torch.nn.Module, input_ids: torch.Tensor, mode: str) -> None:
    if mode == "forward":
        with torch.no_grad():
            model(input_ids=input_ids)
    else:
        model.zero_grad(set_to_none=False)  # the gradients of the warm-up stay: the peak is the step's own
        model(input_ids=input_ids).last_hidden_state.square().mean().backward()


def measure(folder: str, mode: str, length: int, repeats: int) -> dict[str, float]:
    """In a child process: load the model in `folder`, time `mode` at `length` tokens, read its peak memory."""
    if "lsg" in Path(folder).name:
        import lsg_converter  # noqa: F401  (registers the LSG classes with the Auto classes)
    model = transformers.AutoModel.from_pretrained(folder)
    if mode == "forward":
        model.eval()
    else:
        model.train().activation_checkpointing_enable()
    input_ids = torch.randint(5, 128000, (1, length), generator=torch.Generator().manual_seed(0))
    step(model, input_ids, mode)  # warm-up: a first step at a new length peaks higher (allocations, gradients)
    times, peaks = [], []
    for _ in range(repeats):
        before = resident_mib("VmRSS")
        reset_peak()
        start = time.perf_counter()
        step(model, input_ids, mode)
        times.append(time.perf_counter() - start)
        peaks.append(resident_mib("VmHWM") - before)
    return {"seconds": statistics.median(times), "peak_mib": max(peaks)}


def measure_in_child(folder: Path, mode: str, length: int, repeats: int) -> dict[str, float] | None:
    command = [sys.executable, __file__, "--measure", str(folder), mode, str(length), "--repeats", str(repeats)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  {folder.name} {mode} {length}: failed ({result.stderr.strip().splitlines()[-1]})", flush=True)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def build_models(folder: Path, layers: int, max_length: int) -> tuple[Path, Path]:
    """(dense source folder, LSG folder): the random v3-base source and its conversion with the defaults."""
    from lsg_converter import LSGConverter, save_converted

    torch.manual_seed(0)
    source = transformers.DebertaV2Model(transformers.DebertaV2Config(**V3_BASE, num_hidden_layers=layers))
    source.save_pretrained(folder / "dense")
    model, tokenizer = LSGConverter(max_sequence_length=max_length).convert_from_pretrained(str(folder / "dense"))
    save_converted(model, tokenizer, folder / "lsg")
    return folder / "dense", folder / "lsg"


def cell(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:,.0f} MiB" if unit == "MiB" else f"{value:.2f} s"


def ratio(dense: float | None, lsg: float | None) -> str:
    return "-" if dense is None or lsg is None else f"{dense / lsg:.1f}x"


def table(rows: dict, lengths: list[int], mode: str) -> list[str]:
    lines = [
        "| tokens | dense time | LSG time | dense / LSG | dense peak | LSG peak | dense / LSG |",
        "|---|---|---|---|---|---|---|",
    ]
    for length in lengths:
        dense, lsg = rows.get(("dense", mode, length)), rows.get(("lsg", mode, length))
        figures = []
        for key, unit in (("seconds", "s"), ("peak_mib", "MiB")):
            d, l = (None if r is None else r[key] for r in (dense, lsg))
            figures += [cell(d, unit), cell(l, unit), ratio(d, l)]
        lines.append(f"| {length:,} | " + " | ".join(figures) + " |")
    return lines


def write_results(title: str, lines: list[str]) -> None:
    marker = f"<!-- {title} -->"
    text = RESULTS.read_text() if RESULTS.exists() else ""
    section = "\n".join([marker, *lines, f"<!-- end {title} -->", ""])
    pattern = re.compile(re.escape(marker) + r".*?" + re.escape(f"<!-- end {title} -->") + r"\n?", re.DOTALL)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dense-lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--lsg-lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--train-lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--results", metavar="TITLE", help="write the tables into benchmarks/RESULTS.md under TITLE")
    parser.add_argument("--measure", nargs=3, metavar=("FOLDER", "MODE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        folder, mode, length = args.measure
        print(json.dumps(measure(folder, mode, int(length), args.repeats)))
        return

    lengths = sorted(set(args.dense_lengths) | set(args.lsg_lengths))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = dict(zip(("dense", "lsg"), build_models(Path(tmp), args.layers, max(lengths))))
        plan = [("forward", length) for length in lengths] + [("train", length) for length in args.train_lengths]
        for mode, length in plan:
            for name, folder in folders.items():
                if name == "dense" and length not in args.dense_lengths:
                    continue
                rows[(name, mode, length)] = measure_in_child(folder, mode, length, args.repeats)
                print(f"{name} {mode} {length}: {rows[(name, mode, length)]}", flush=True)

    machine = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; float32, batch 1, DeBERTa-v3-base dimensions, {args.layers} layers; "
        f"LSG: the conversion defaults (local 170, 1 global token); median of {args.repeats} after a warm-up run"
    )
    lines = [
        f"## DeBERTa-v3 against LSG-DeBERTa ({args.results or 'this run'})",
        "",
        machine,
        "",
        f"`python benchmarks/bench_deberta.py {shlex.join(sys.argv[1:])}`",
        "",
        "Forward (eval, no grad); peak: resident set above the loaded model",
        "",
        *table(rows, lengths, "forward"),
        "",
        "Training step (activation checkpointing on, forward + backward)",
        "",
        *table(rows, args.train_lengths, "train"),
    ]
    print("\n".join(lines))
    if args.results:
        write_results(args.results, lines)


if __name__ == "__main__":
    main()
