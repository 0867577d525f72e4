"""LSG-T5 against transformers' LongT5 and dense T5 encoders: time and peak memory, side by side in one run.

    python benchmarks/bench_t5.py --results "LSG-T5 against LongT5 and dense T5"   # 2 layers, 4k and 16k
    python benchmarks/bench_t5.py --lengths 256 --scaling-lengths 256 512 --layers 1 --repeats 1   # smoke test
    python benchmarks/bench_t5.py --device cuda --dtype bfloat16 --skip-scaling   # on a GPU

Every model is a randomly initialised T5-base-sized encoder (d_model 768, 12 heads of 64, d_ff 2048,
gated-gelu, ``--layers`` layers, dropout 0, batch 1) fed random token ids:

* ``lsg-t5 norm 128/128 f2 g1``: LSGT5EncoderModel (sdpa backend) holding the dense model's weights
  (its one extra table, the global token's embedding, stays random); every ratio is taken against it;
* ``lsg-t5 local 128/0 g1``: the same with local attention only (no sparse keys);
* ``longt5 tglobal``, ``longt5 local``: LongT5EncoderModel, local radius 127, transient-global blocks
  of 16 (the published LongT5 settings; LongT5 has eager attention only);
* ``t5 dense``: T5EncoderModel with SDPA, up to ``--max-dense-length`` tokens (its (1, H, L, L)
  position bias alone is 12 GiB at 16,384 tokens).

For each length: the median time of ``--repeats`` calls after a warm-up call of the forward pass (eval
mode, no grad) and of a training step (train mode, forward + backward of the mean square of the last
hidden states), interleaved: each round calls every model's forward and training step in turn, starting
one model later than the round before, each timed call right after an untimed one of the same step
(`interleaved_seconds`);
then the peak memory of each above the loaded model (rise of the resident set over one call after a
warm-up call, each model in a process of its own; on CUDA, the allocator's peak over one call). A second
table gives the LSG forward peaks at ``--scaling-lengths``. Ratios, not absolute times, carry over between
machines.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import LongT5Config, LongT5EncoderModel, T5Config, T5EncoderModel

from bench_speed import cuda_peak_mib, fmt, machine_description, ratio, record_results, resident_kib
from encoder_steps import step_function
from lsg_converter.models.configuration_lsg_t5 import LSGT5Config
from lsg_converter.models.modeling_lsg_t5 import LSGT5EncoderModel

T5_BASE = dict(d_model=768, num_heads=12, d_kv=64, d_ff=2048, feed_forward_proj="gated-gelu", vocab_size=32128,
               dropout_rate=0.0)
LSG_SETTINGS = {
    "lsg-t5 norm 128/128 f2 g1": dict(block_size=128, sparse_block_size=128, sparsity_factor=2, sparsity_type="norm"),
    "lsg-t5 local 128/0 g1": dict(block_size=128, sparse_block_size=0, sparsity_type="none"),
}
LONGT5_SETTINGS = {"longt5 tglobal": "transient-global", "longt5 local": "local"}
MODELS = [*LSG_SETTINGS, *LONGT5_SETTINGS, "t5 dense"]
REFERENCE = MODELS[0]
TOKEN_IDS_BELOW = 32000  # random input ids in [5, 32000) of T5's 32,128


def build_model(name: str, layers: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return built_on_cpu(name, layers).to(device, dtype)


def built_on_cpu(name: str, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name in LONGT5_SETTINGS:
        config = LongT5Config(**T5_BASE, num_layers=layers, encoder_attention_type=LONGT5_SETTINGS[name],
                              local_radius=127, global_block_size=16)
        return LongT5EncoderModel(config)
    dense = T5EncoderModel(T5Config(**T5_BASE, num_layers=layers, attn_implementation="sdpa"))
    if name == "t5 dense":
        return dense
    config = LSGT5Config(**dense.config.to_dict(), max_position_embeddings=16384, num_global_tokens=1,
                         **LSG_SETTINGS[name])
    config._attn_implementation = "sdpa"
    model = LSGT5EncoderModel(config)
    missing, unexpected = model.load_state_dict(dense.state_dict(), strict=False)
    assert missing == ["encoder.global_embeddings.weight"] and not unexpected, (missing, unexpected)
    return model


def interleaved_seconds(
    names: list[str], length: int, layers: int, repeats: int, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> dict[tuple[str, str], float]:
    """Median seconds of each model's forward pass and training step: a warm-up round, then `repeats`
    rounds, each calling every model's forward and training step in turn, so that a machine that slows
    down or speeds up during the run weighs on every model alike; each round starts one model later than
    the one before. Each timed call follows an untimed call of the same step, as in a loop that runs one
    model: a call right after another model's pays for faulting in again the memory that model's step
    freed (the largest steps free the most), a cost of the order of the benchmark, not of the model."""
    models = {name: build_model(name, layers, device, dtype) for name in names}
    steps = [((name, mode), step_function(model, length, mode, TOKEN_IDS_BELOW))
             for name, model in models.items() for mode in ("forward", "train")]
    times: dict[tuple[str, str], list[float]] = {key: [] for key, _ in steps}
    for round_index in range(1 + repeats):
        first = 2 * (round_index % len(models))
        for key, step in steps[first:] + steps[:first]:
            step()
            start = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values[1:]) for key, values in times.items()}


def peak_mib(step: Callable[[], None], device: str) -> float:
    """Rise of the resident set over one call of `step` after a warm-up call, in MiB (as bench_speed on CPU);
    on CUDA, the allocator's peak over that call above what was allocated before it."""
    step()
    if device == "cuda":
        return cuda_peak_mib(step)
    baseline = resident_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    step()
    return (resident_kib("VmHWM") - baseline) / 1024


def peak_in_child(name: str, mode: str, length: int, layers: int, device: str, dtype: str) -> float | None:
    """Peak memory is a process-wide figure: each model, mode and length in a process of its own."""
    command = [sys.executable, __file__, "--peak-of", name, mode, str(length), "--layers", str(layers),
               "--device", device, "--dtype", dtype]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  {name} {mode} {length}: failed ({result.stderr.strip().splitlines()[-1]})", flush=True)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class Row:
    model: str
    length: int
    forward: float | None = None
    train: float | None = None
    forward_peak: float | None = None
    train_peak: float | None = None


COLUMNS = ("forward", "train", "forward_peak", "train_peak")


def tables(rows: list[Row], lengths: list[int], max_dense: int) -> str:
    lines = []
    for length in lengths:
        base = next((row for row in rows if row.model == REFERENCE and row.length == length), None)
        lines += [
            f"\n**{length} tokens** (ratios: model / `{REFERENCE}`; above 1 = slower or larger than LSG-T5)\n",
            "| model | fwd s | fwd+bwd s | fwd peak MiB | fwd+bwd peak MiB | fwd ratio | fwd+bwd ratio "
            "| fwd peak ratio | fwd+bwd peak ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in (r for r in rows if r.length == length):
            figures = [fmt(row.forward), fmt(row.train), fmt(row.forward_peak, 0), fmt(row.train_peak, 0)]
            figures += [fmt(ratio(row, base, column), 2) for column in COLUMNS]
            lines.append(f"| {row.model} | " + " | ".join(figures) + " |")
        if length > max_dense:
            bias_gib = 12 * length * length * 4 / 2**30
            lines.append(f"\n`t5 dense` not run at {length} tokens: its fp32 position bias alone, (1, 12, {length}, "
                         f"{length}), is {bias_gib:.0f} GiB (SDPA then adds the mask to it: a second copy).")
    return "\n".join(lines)


def scaling_table(peaks: dict[tuple[str, int], float | None], names: list[str], lengths: list[int]) -> str:
    lines = [
        "\n**LSG-T5 forward peak above the loaded model** (eval, no grad; MiB; last column: MiB per 1,024 tokens "
        "at the longest length)\n",
        "| model | " + " | ".join(f"{length} tokens" for length in lengths) + " | MiB / 1k tokens |",
        "|---|" + "---|" * (len(lengths) + 1),
    ]
    for name in names:
        values = [peaks.get((name, length)) for length in lengths]
        per_k = None if values[-1] is None else values[-1] / lengths[-1] * 1024
        lines.append(f"| {name} | " + " | ".join(fmt(value, 0) for value in values) + f" | {fmt(per_k, 0)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--scaling-lengths", type=int, nargs="+", default=[4096, 8192, 16384],
                        help="lengths of the LSG-T5 forward-peak table")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS, metavar="MODEL",
                        help=f"subset of: {', '.join(MODELS)}")
    parser.add_argument("--max-dense-length", type=int, default=4096, help="longest input for the dense T5")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true", help="leave out the LSG-T5 forward-peak table")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--results", metavar="SECTION", help="write the tables into --results-file under this heading")
    parser.add_argument("--results-file", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--peak-of", nargs=3, metavar=("MODEL", "MODE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.peak_of:  # child process of peak_in_child
        name, mode, length = args.peak_of
        model = build_model(name, args.layers, args.device, dtype)
        print(json.dumps(peak_mib(step_function(model, int(length), mode, TOKEN_IDS_BELOW), args.device)))
        return

    description = machine_description(argparse.Namespace(
        device=args.device, dtype=args.dtype, layers=args.layers, eval=False, compile=False, padding=0.0,
        repeats=args.repeats))
    peaks = "the allocator's peak" if args.device == "cuda" else "resident set"
    description = (f"{datetime.date.today()}; {description}; T5-base dimensions (d_ff 2048, gated-gelu), dropout 0; "
                   f"peaks: {peaks} above the loaded model, each in a process of its own")
    print(description, flush=True)
    rows = []
    for length in args.lengths:
        names = [n for n in args.models if n != "t5 dense" or length <= args.max_dense_length]
        seconds = interleaved_seconds(names, length, args.layers, args.repeats, args.device, dtype)
        for name in names:
            row = Row(name, length, seconds[name, "forward"], seconds[name, "train"])
            if not args.skip_memory:
                row.forward_peak, row.train_peak = (peak_in_child(name, mode, length, args.layers, args.device, args.dtype)
                                                    for mode in ("forward", "train"))
            rows.append(row)
            print(f"{length:>6} {name:<28} fwd {fmt(row.forward)} s  fwd+bwd {fmt(row.train)} s  peaks "
                  f"{fmt(row.forward_peak, 0)} / {fmt(row.train_peak, 0)} MiB", flush=True)
    report = tables(rows, args.lengths, args.max_dense_length)
    if not args.skip_memory and not args.skip_scaling:
        peaks = {(row.model, row.length): row.forward_peak for row in rows}
        lsg_names = [name for name in args.models if name in LSG_SETTINGS]
        for name in lsg_names:
            for length in args.scaling_lengths:
                if (name, length) not in peaks:
                    peaks[(name, length)] = peak_in_child(name, "forward", length, args.layers, args.device, args.dtype)
                    print(f"{length:>6} {name:<28} fwd peak {fmt(peaks[(name, length)], 0)} MiB", flush=True)
        report += "\n" + scaling_table(peaks, lsg_names, args.scaling_lengths)
    print(report)
    if args.results:
        record_results(args.results_file, args.results, description, report.strip())


if __name__ == "__main__":
    main()
