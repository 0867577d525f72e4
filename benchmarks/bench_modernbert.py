"""LSG-ModernBERT against transformers' ModernBERT (SDPA): time and peak memory, side by side in one run.

    python benchmarks/bench_modernbert.py --results "LSG-ModernBERT against ModernBERT"   # default: 15 min at most
    python benchmarks/bench_modernbert.py --sizes base --lengths 16384 --lsg-lengths 32768 --steps forward --budget 3600
    python benchmarks/bench_modernbert.py --quick                                           # smoke test, seconds
    python benchmarks/bench_modernbert.py --device cuda --dtype bfloat16 --sizes base --lengths 8192 16384 32768

Every model is a randomly initialised ModernBERT of one of ``--sizes`` (local_attention 128: the sliding
layers see 64 tokens each side; full attention every third layer; dropout 0; batch 1) fed random token ids:

* ``tiny``: 3 layers, hidden 64, 4 heads, intermediate 96;
* ``base``: ModernBERT-base's shape: 22 layers, hidden 768, 12 heads, intermediate 1152.

The source, ``ModernBertModel`` with ``attn_implementation="sdpa"`` (its 8,192 positions, saved once per size),
is compared with its conversion by `LSGConverter` to the longest length of the run, with the conversion defaults
(one global token, no sparse keys, the full-attention layers in blocks of a third of the source's body
positions: 2,730; the sliding layers keep their window exactly), at ``--lengths`` (both models) and
``--lsg-lengths`` (LSG alone).

Each model, step and length runs in a process of its own (peak memory is a process-wide figure): the forward
pass (eval mode, no grad) and the training step (train mode, forward + backward of the mean square of the last
hidden states, gradients set to None after it), timed ``--repeats`` times after one untimed call of the same
step (the median of the wall-clock times, and of the process's CPU times, all its threads: on a machine shared
with other jobs, a wall clock slower for the same CPU time is their load), then called again for its peak:
the rise of the resident set over a call (Linux: /proc/self/clear_refs resets the high-water mark), after
glibc handed back the memory the earlier calls freed (malloc_trim; it keeps freed blocks of up to 32 MiB,
which the next call reuses without a rise), and the process's peak (the loaded model included: what the
machine must hold); the median of 3 such calls where a timed call takes under 10 s, else one. On CUDA: the
allocator's peak over each timed call, above and with what was allocated before it (no CPU time); there every
measurement runs in this process, each model loaded once (``--in-process``, also what ``--quick`` does on the
CPU: the peaks are then those of a process that ran the earlier measurements, for a smoke test only).

A measurement that cannot be done is reported as not measured, with the reason, never guessed:
a process over the memory it may take (on the CPU its address space is limited to the memory available when
it starts, ``--memory-limit``, so that an allocation fails instead of the system's OOM killer ending it; a
longer length of that model and step is then not run), or beyond the time ``--budget`` left (estimated from
that model's figures already taken: a training step 3x its forward at the same length, a forward from one at
a shorter length, linearly for LSG and with the square of the length for the source; a training step whose
forward was not measured, or a length whose shorter one was not, is not run either). The tables give LSG /
source ratios, the growth of LSG's peak between lengths, and the goals of issue 66 against them (the time
goal against the wall-clock ratio, the CPU-time ratio beside it).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from bench_speed import cpu_name, fmt, record_results, resident_kib
from encoder_steps import step_function

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96),
    "base": dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152),
}
SHARED = dict(local_attention=128, global_attn_every_n_layers=3, max_position_embeddings=8192, attention_dropout=0.0,
              mlp_dropout=0.0, embedding_dropout=0.0)
SOURCE, LSG = "modernbert sdpa", "lsg-modernbert"
STEPS = {"forward": "forward", "train": "fwd+bwd"}
VOCAB = 50368
TOKEN_IDS_BELOW = VOCAB - 100  # random input ids in [5, VOCAB - 100)
# CPU peaks: the median of this many calls where a call is short (a rise of a few tens of MiB, one activation
# more or less alive at the top, moves a small model's peak by a third), else of one
PEAK_CALLS, SHORT_CALL_SECONDS = 3, 10.0
TRAIN_PER_FORWARD = 3  # a training step's time estimated from its forward's, to decide what fits the budget
QUICK = dict(sizes=["tiny"], lengths=[256], lsg_lengths=[512], repeats=1, in_process=True)
# Goals of issue 66 (item 3), reported against the measured figures, never assumed.
GOAL_LENGTH, GOAL_TIME, GOAL_PEAK, GOAL_GROWTH, GOAL_BASE_GIB = 16384, 0.5, 0.25, 2.1, 8


def build_source(size: str, folder: Path) -> None:
    """The random ModernBertModel of `size`, saved in `folder` (seed 0)."""
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**SIZES[size], **SHARED, vocab_size=VOCAB)
    transformers.ModernBertModel(config).save_pretrained(folder)


def load_model(name: str, folder: Path, max_length: int, device: str, dtype: torch.dtype,
               backend: str) -> torch.nn.Module:
    """The source read with SDPA, or its LSG conversion (the conversion defaults) to read `max_length` tokens."""
    if name == SOURCE:
        model = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa")
    else:
        from lsg_converter import LSGConverter

        positions = transformers.AutoConfig.from_pretrained(folder).max_position_embeddings
        converter = LSGConverter(max_sequence_length=max(max_length, positions))
        model, _ = converter.convert_from_pretrained(str(folder))
        if backend != "sdpa":
            model.set_attn_implementation(backend)
    model = model.to(device, dtype)
    with torch.no_grad():  # every weight resident before the baseline (safetensors maps them lazily)
        sum(float(parameter.sum()) for parameter in model.parameters())
    return model


def measure(model: torch.nn.Module, step: str, length: int, repeats: int, device: str) -> dict[str, float]:
    """Seconds (median of `repeats` timed calls after an untimed one), peak MiB above the memory held before a
    call and the process's peak MiB, of `step` of `model` at `length` tokens. CUDA: the allocator's peaks over
    the timed calls (the largest); CPU: the resident set over one more call, after the freed memory went back
    to the system (`release_freed_memory`): the median of `PEAK_CALLS` such calls where a timed call took under
    `SHORT_CALL_SECONDS`, else one."""
    run = step_function(model, length, step, TOKEN_IDS_BELOW)
    loaded = torch.cuda.memory_allocated() if device == "cuda" else resident_kib("VmRSS") * 1024
    run()
    times, cpu_times, peaks, process_peaks = [], [], [], []
    for _ in range(repeats):
        if device == "cuda":
            baseline = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        start, cpu_start = time.perf_counter(), time.process_time()
        run()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        if device == "cuda":
            peaks.append((torch.cuda.max_memory_allocated() - baseline) / 2**20)
            process_peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    if device == "cpu":
        for _ in range(PEAK_CALLS if max(times) < SHORT_CALL_SECONDS else 1):
            release_freed_memory()
            baseline = resident_kib("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
            run()
            peaks.append((resident_kib("VmHWM") - baseline) / 1024)
            process_peaks.append(resident_kib("VmHWM") / 1024)
        return {"seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu_times),
                "peak_mib": statistics.median(peaks),
                "process_mib": statistics.median(process_peaks), "loaded_mib": loaded / 2**20, "calls": repeats,
                "peak_calls": len(peaks)}
    return {"seconds": statistics.median(times), "cpu_seconds": None, "peak_mib": max(peaks),
            "process_mib": max(process_peaks), "loaded_mib": loaded / 2**20, "calls": repeats, "peak_calls": len(peaks)}


def release_freed_memory() -> None:
    """Hand the memory freed so far back to the system (glibc keeps freed blocks below its mmap threshold, up to
    32 MiB, in its heaps; malloc_trim returns their pages), so that the next call's rise of the resident set
    is all it needs, not less what earlier calls left free."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@dataclass
class Result:
    """One model, step and length: its figures, or why there are none."""

    figures: dict[str, float] | None = None
    reason: str | None = None
    out_of_memory: bool = False

    def value(self, key: str) -> float | None:
        return None if self.figures is None else self.figures.get(key)


@dataclass
class Run:
    """What the parent process knows: the options, the results so far and when the run started."""

    args: argparse.Namespace
    started: float = field(default_factory=time.perf_counter)
    results: dict[tuple[str, str, str, int], Result] = field(default_factory=dict)
    models: dict[tuple[Path, str], torch.nn.Module] = field(default_factory=dict)  # --in-process: loaded once

    def max_length(self) -> int:
        """The length the LSG model is converted to read: the longest of the run."""
        return max(*self.args.lengths, *self.args.lsg_lengths)

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - self.started)


def estimated_seconds(run: Run, size: str, name: str, step: str, length: int) -> tuple[float, str] | None:
    """Seconds one call of `step` should take, from this model's figures already taken, and how; None if none."""
    if step == "train":
        forward = run.results.get((size, name, "forward", length))
        if forward is not None and forward.figures:
            return TRAIN_PER_FORWARD * forward.figures["seconds"], f"{TRAIN_PER_FORWARD}x its forward at {length:,}"
    shorter = [(key[3], result) for key, result in run.results.items()
               if key[:3] == (size, name, step) and key[3] < length and result.figures]
    if not shorter:
        return None
    known, result = max(shorter, key=lambda item: item[0])
    factor = length / known
    if name == LSG:
        return result.figures["seconds"] * factor, f"its {STEPS[step]} at {known:,} x {factor:g}"
    return result.figures["seconds"] * factor**2, f"its {STEPS[step]} at {known:,} x {factor:g}^2"


def why_not_run(run: Run, size: str, name: str, step: str, length: int) -> str | None:
    """The reason not to start this measurement, or None: out of memory at a shorter length; what it would be
    estimated from not measured (its forward at this length, this step at a shorter one); beyond the budget."""
    earlier = {key[3]: result for key, result in run.results.items()
               if key[:3] == (size, name, step) and key[3] < length}
    for shorter, result in sorted(earlier.items()):
        if result.out_of_memory:
            return f"not run: out of memory at {shorter:,} tokens already"
    forward = run.results.get((size, name, "forward", length))
    if step == "train" and forward is not None and forward.figures is None:
        return f"not run: its forward at {length:,} was not measured"
    if earlier and earlier[max(earlier)].figures is None:
        return f"not run: its {STEPS[step]} at {max(earlier):,} was not measured"
    left = run.left()
    if left <= 0:
        return f"not run: the time budget ({run.args.budget:.0f} s) is spent"
    estimate = estimated_seconds(run, size, name, step, length)
    if estimate is not None:
        seconds, how = estimate
        calls = 1 + run.args.repeats + (run.args.device == "cpu") * (PEAK_CALLS if seconds < SHORT_CALL_SECONDS else 1)
        if calls * seconds > left:
            return (f"not run: {calls} calls of about {seconds:.0f} s each (estimated: {how}) exceed the "
                    f"{left:.0f} s left of the time budget")
    return None


def memory_limit_bytes(args: argparse.Namespace) -> int | None:
    """The address space a measuring process may take: --memory-limit, else the memory available now."""
    if args.memory_limit is not None:
        return int(args.memory_limit * 2**30)
    from lsg_converter.memory import available_memory

    return available_memory()


def measure_in_child(run: Run, size: str, name: str, step: str, length: int, folder: Path) -> Result:
    """`measure` in a process of its own, within the memory available and the time left; a Result with the
    reason where it fails."""
    args = run.args
    limit = memory_limit_bytes(args)
    command = [sys.executable, __file__, "--measure", size, name, step, str(length), str(folder), str(run.max_length()),
               "--repeats", str(args.repeats), "--device", args.device, "--dtype", args.dtype,
               "--lsg-backend", args.lsg_backend, "--threads", str(args.threads)]
    if limit is not None and args.device == "cpu":
        command += ["--memory-limit", f"{limit / 2**30:.3f}"]
    timeout = max(run.left(), 1.0)
    try:
        finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result(reason=f"not measured: stopped at the end of the time budget ({args.budget:.0f} s)")
    if finished.returncode == 0:
        return Result(figures=json.loads(finished.stdout.strip().splitlines()[-1]))
    lines = finished.stderr.strip().splitlines() or [f"exit status {finished.returncode}"]
    error = lines[-1].strip()
    out_of_memory = "can't allocate memory" in error or "MemoryError" in error or finished.returncode in (-9, 137)
    if out_of_memory:
        where = f" (address space limited to {limit / 2**30:.1f} GiB, the memory available)" if limit else ""
        return Result(reason=f"not measured: out of memory{where}: {error[:160]}", out_of_memory=True)
    return Result(reason=f"not measured: failed: {error[:200]}")


def measure_here(run: Run, size: str, name: str, step: str, length: int, folder: Path) -> Result:
    """`measure` in this process (CUDA, --in-process): an allocator out of memory is a Result with its reason."""
    args = run.args
    try:
        if (folder, name) not in run.models:
            dtype = getattr(torch, args.dtype)
            run.models[folder, name] = load_model(name, folder, run.max_length(), args.device, dtype, args.lsg_backend)
        figures = measure(run.models[folder, name], step, length, args.repeats, args.device)
    except (torch.OutOfMemoryError, MemoryError) as error:
        return Result(reason=f"not measured: out of memory: {str(error).splitlines()[0][:160]}", out_of_memory=True)
    except RuntimeError as error:
        if "can't allocate memory" not in str(error):
            raise
        return Result(reason=f"not measured: out of memory: {str(error).splitlines()[0][:160]}", out_of_memory=True)
    finally:
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return Result(figures=figures)


def plan(args: argparse.Namespace) -> list[tuple[int, str, list[str]]]:
    """(length, step, models) in the order they run: by length, the forward first; the model that starts
    alternates from one length to the next, so that a machine that slows down weighs on both alike."""
    lengths = sorted(set(args.lengths) | set(args.lsg_lengths))
    order = []
    for index, length in enumerate(lengths):
        models = [LSG, SOURCE] if length in args.lengths else [LSG]
        for step in args.steps:
            order.append((length, step, models if index % 2 == 0 else models[::-1]))
    return order


def run_size(run: Run, size: str, folder: Path) -> None:
    for length, step, models in plan(run.args):
        for name in models:
            reason = why_not_run(run, size, name, step, length)
            if reason is not None:
                result = Result(reason=reason)
            elif run.args.in_process:
                result = measure_here(run, size, name, step, length, folder)
            else:
                result = measure_in_child(run, size, name, step, length, folder)
            run.results[(size, name, step, length)] = result
            figures = ("  ".join(f"{key} {fmt(value)}" for key, value in result.figures.items())
                       if result.figures else result.reason)
            print(f"{size:<5} {length:>6} {STEPS[step]:<8} {name:<16} {figures}", flush=True)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def size_description(size: str, lsg_block: int | None) -> str:
    shape = SIZES[size]
    block = "" if lsg_block is None else f"; LSG: block {lsg_block:,} in the full-attention layers"
    return (f"**{size}**: {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"{shape['num_attention_heads']} heads, intermediate {shape['intermediate_size']}, local_attention 128, "
            f"full attention every 3rd layer{block}")


def size_tables(run: Run, size: str, lsg_block: int | None) -> list[str]:
    """The comparison table of `size`, LSG's peak growth, and the reasons of what was not measured."""
    results, args = run.results, run.args
    lengths = sorted(set(args.lengths) | set(args.lsg_lengths))
    lines = [
        "", size_description(size, lsg_block) + " (ratios: LSG / source; below 1 = LSG faster or smaller)", "",
        "| tokens | step | source s | LSG s | LSG / source time | source CPU s | LSG CPU s | LSG / source CPU time "
        "| source peak MiB | LSG peak MiB | LSG / source peak | source process MiB | LSG process MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    missing = []
    for length in lengths:
        for step in args.steps:
            source = results.get((size, SOURCE, step, length))
            lsg = results.get((size, LSG, step, length), Result())
            source = source or Result(reason="not run: LSG alone at this length (--lsg-lengths)")
            cells = [f"{length:,}", STEPS[step]]
            for key, digits in (("seconds", 3), ("cpu_seconds", 3), ("peak_mib", 0)):
                cells += [fmt(source.value(key), digits), fmt(lsg.value(key), digits),
                          fmt(ratio(lsg.value(key), source.value(key)), 2)]
            cells += [fmt(source.value("process_mib"), 0), fmt(lsg.value("process_mib"), 0)]
            if source.figures or lsg.figures:  # a row of nothing but n/a: its reasons are listed below the table
                lines.append("| " + " | ".join(cells) + " |")
            for name, result in ((SOURCE, source), (LSG, lsg)):
                if result.reason and length in (args.lengths if name == SOURCE else lengths):
                    missing.append(f"- {name}, {STEPS[step]}, {length:,} tokens: {result.reason}")
    growth = [(short, long) for short, long in zip(lengths, lengths[1:])]
    if growth:
        lines += ["", f"LSG peak above the loaded model, growth from one length to the next ({size}):", "",
                  "| step | " + " | ".join(f"{long:,} / {short:,} tokens" for short, long in growth) + " |",
                  "|---|" + "---|" * len(growth)]
        for step in args.steps:
            peaks = {length: results.get((size, LSG, step, length), Result()).value("peak_mib") for length in lengths}
            cells = [fmt(ratio(peaks[long], peaks[short]), 2) for short, long in growth]
            lines.append(f"| {STEPS[step]} | " + " | ".join(cells) + " |")
    if missing:
        lines += ["", "Not measured:", "", *missing]
    return lines


def goal_lines(run: Run) -> list[str]:
    """Issue 66's goals against the figures measured: met, not met, or not measured (and why)."""
    results = run.results

    def verdict(value: float | None, limit: float, unit: str = "") -> str:
        if value is None:
            return "not measured"
        return f"{value:.2f}{unit}, {'met' if value <= limit else 'not met'}"

    def time_verdict(wall_clock_ratio: float | None, cpu_time_ratio: float | None) -> str:
        """The wall-clock ratio against the time goal, and the CPU-time ratio beside it where there is one (on
        a shared machine the other jobs' load slows the wall clock, not the CPU time)."""
        if wall_clock_ratio is None:
            return "not measured"
        cpu_time = "" if cpu_time_ratio is None else f" (CPU time {verdict(cpu_time_ratio, GOAL_TIME)})"
        return f"wall clock {verdict(wall_clock_ratio, GOAL_TIME)}{cpu_time}"

    lines = ["", "Goals of issue 66 against this run:", ""]
    for size in run.args.sizes:
        fwd = {name: results.get((size, name, "forward", GOAL_LENGTH), Result()) for name in (SOURCE, LSG)}
        time_ratio = ratio(fwd[LSG].value("seconds"), fwd[SOURCE].value("seconds"))
        cpu_ratio = ratio(fwd[LSG].value("cpu_seconds"), fwd[SOURCE].value("cpu_seconds"))
        peak_ratio = ratio(fwd[LSG].value("peak_mib"), fwd[SOURCE].value("peak_mib"))
        lines.append(f"- {size}, {GOAL_LENGTH:,}-token forward, LSG / source time at most {GOAL_TIME}: "
                     f"{time_verdict(time_ratio, cpu_ratio)}; peak at most {GOAL_PEAK}: "
                     f"{verdict(peak_ratio, GOAL_PEAK)}")
        for step in run.args.steps:
            peaks = [results.get((size, LSG, step, length), Result()).value("peak_mib")
                     for length in (GOAL_LENGTH, 2 * GOAL_LENGTH)]
            lines.append(f"- {size}, LSG {STEPS[step]} peak {2 * GOAL_LENGTH:,} / {GOAL_LENGTH:,} at most "
                         f"{GOAL_GROWTH} (linear): {verdict(ratio(peaks[1], peaks[0]), GOAL_GROWTH)}")
    if "base" in run.args.sizes:
        process = results.get(("base", LSG, "forward", 2 * GOAL_LENGTH), Result()).value("process_mib")
        lines.append(f"- base, LSG forward at {2 * GOAL_LENGTH:,} within {GOAL_BASE_GIB} GiB (the process's peak, the "
                     f"model included): {verdict(None if process is None else process / 1024, GOAL_BASE_GIB, ' GiB')}")
    return lines


def lsg_block_size(folder: Path) -> int | None:
    """The block size the conversion gives the full-attention layers (from the source's positions)."""
    from lsg_converter.models.lsg_defaults import conversion_block_size

    return conversion_block_size(transformers.AutoConfig.from_pretrained(folder).max_position_embeddings)


def description(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    peaks = ("the allocator's peak over one call, above and with what was allocated before it" if args.device == "cuda"
             else "resident set: its rise over a call after the timed ones, median of 3 calls where one takes under "
             "10 s, and the process's peak")
    where = "every measurement in this process" if args.in_process else "each measurement in a process of its own"
    return (f"{datetime.date.today()}; {device}; torch {torch.__version__}, transformers {transformers.__version__}, "
            f"Python {platform.python_version()}; {args.dtype}, batch 1; LSG: the conversion defaults, "
            f"{args.lsg_backend} backend; forward: eval mode, no grad; fwd+bwd: train mode (dropout 0); median of "
            f"{args.repeats} after 1 untimed call; peaks: {peaks}; {where}; time budget {args.budget:.0f} s; "
            f"load average {load_average()} at the start")


def load_average() -> str:
    """The 1-minute load average (other jobs share these machines), or "unknown"."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384], help="lengths of both models")
    parser.add_argument("--lsg-lengths", type=int, nargs="+", default=[32768, 65536], help="lengths of LSG alone")
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--repeats", type=int, default=1, help="timed calls after the untimed one")
    parser.add_argument("--budget", type=float, default=900.0,
                        help="seconds the whole run may take: what would not fit is not run (reported)")
    parser.add_argument("--memory-limit", type=float, metavar="GIB",
                        help="address space of a measuring process (CPU; default: the memory available)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--lsg-backend", default="sdpa", choices=["sdpa", "flex_attention", "eager"])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--in-process", action="store_true", help="measure in this process (CUDA: always)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: tiny, 256 tokens (both) and 512 (LSG), 1 repeat, in this process")
    parser.add_argument("--results", metavar="SECTION", help="write the tables into --results-file under this heading")
    parser.add_argument("--results-file", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--measure", nargs=6, metavar=("SIZE", "MODEL", "STEP", "LENGTH", "FOLDER", "MAX_LENGTH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    if args.measure:  # child process of measure_in_child
        if args.memory_limit is not None:
            limit = int(args.memory_limit * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        _, name, step, length, folder, max_length = args.measure
        dtype = getattr(torch, args.dtype)
        model = load_model(name, Path(folder), int(max_length), args.device, dtype, args.lsg_backend)
        figures = measure(model, step, int(length), args.repeats, args.device)
        print(json.dumps(figures))
        return
    if args.quick:
        vars(args).update(QUICK)
    if args.device == "cuda":
        args.in_process = True

    text = description(args)
    print(text, flush=True)
    run = Run(args)
    report = []
    with tempfile.TemporaryDirectory(prefix="bench-modernbert-") as tmp:
        for size in args.sizes:
            folder = Path(tmp) / size
            build_source(size, folder)
            run_size(run, size, folder)
            run.models.clear()
            report += size_tables(run, size, lsg_block_size(folder))
    report += goal_lines(run)
    report.append(f"\n{time.perf_counter() - run.started:.0f} s; load average {load_average()} at the end")
    report_text = "\n".join(report)
    print(report_text)
    if args.results:
        record_results(args.results_file, args.results, text, report_text.strip())


if __name__ == "__main__":
    main()
