"""Side-by-side speed and memory of LSG against its peers, on whole models, in one run.

    python benchmarks/bench_speed.py --results "CPU" --plot benchmarks/speed_cpu.png   # 1k-16k, 2 layers
    python benchmarks/bench_speed.py --lengths 4096 --repeats 5                        # the issue-5 targets
    python benchmarks/bench_speed.py --device cuda --eval --results "GPU"              # 4k-32k, 12 layers, bf16

Every model is a randomly initialised base-size encoder (hidden 768, 12 heads, intermediate 3072,
``--layers`` layers, batch 1) fed random token ids:

* ``identity``: BERT whose attention returns its values (attention costs nothing: the limit). Its
  query and key projections get no gradient, so their backward pass is skipped too;
* ``identity+qk``: the same, but the queries and keys receive (zero) gradients, so every projection
  runs backward as under any real attention: the limit for an attention that is part of the graph;
* ``dense``: BERT with SDPA attention (in train mode HF's attention dropout sends SDPA to its O(n^2)
  math kernel, so its training step only runs up to ``--max-dense-train-length`` tokens);
* ``longformer``: HF Longformer, window 512, first token global (as LSG's one global token);
* ``bigbird``: HF BigBird, block sparse, block 64, 3 random blocks;
* ``lsg ..., <backend>``: this project's LSG-BERT under several settings (block/sparse sizes, type,
  factor, globals), with each attention backend of ``--backends`` (CUDA: flex_attention and sdpa).

For each length it reports the median inference time (eval mode, no grad), the median training-step
time (train mode, forward + backward of the mean square of the last hidden states) and the peak
memory of a training step (CPU: rise of the resident set size, each model in a fresh process;
CUDA: rise of the allocated memory), then ratios to the first LSG setting. ``--results`` writes a
markdown section (machine, tables, targets) into RESULTS.md and ``--plot`` a PNG. Ratios, not
absolute times, carry over between machines: compare only figures taken in one run.

A second table times the attention alone (forward + backward of one call on random queries, keys
and values, 12 heads of 64, with its peak memory): dense SDPA against each LSG setting and backend,
and LSG local 128 with one global token (``--skip-attention`` leaves it out).

On CUDA the defaults are the issue-15 run: 4k-32k tokens, 12 layers, bf16, both backends; pass
``--eval`` for training steps without dropout (HF's dense attention dropout would leave SDPA's
flash kernel), as the GPU targets assume.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface, BertConfig, BertModel, BigBirdConfig, BigBirdModel
from transformers import LongformerConfig, LongformerModel

from lsg_converter import LSGBertConfig, LSGBertModel
from lsg_converter.models.lsg_attention import lsg_attention

BASE_DIMS = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522}
# name -> LSG keys; the first one measured is the reference every ratio is taken against.
LSG_SETTINGS: dict[str, dict[str, Any]] = {
    "lsg norm 128/128 f2 g1": {"block_size": 128, "sparse_block_size": 128, "sparsity_factor": 2, "sparsity_type": "norm"},
    "lsg local 170/0 g1": {"block_size": 170, "sparse_block_size": 0, "sparsity_type": "none"},  # the defaults
    "lsg local 256/0 g1": {"block_size": 256, "sparse_block_size": 0, "sparsity_type": "none"},
    "lsg pooling 128/128 f4 g1": {"block_size": 128, "sparse_block_size": 128, "sparsity_factor": 4, "sparsity_type": "pooling"},
    "lsg stride 64/64 f4 g1": {"block_size": 64, "sparse_block_size": 64, "sparsity_factor": 4, "sparsity_type": "stride"},
    # local attention in blocks of flex_attention's 128-token tiles (an issue-15 target of the attention alone)
    "lsg local 128/0 g1": {"block_size": 128, "sparse_block_size": 0, "sparsity_type": "none"},
}
PEERS = ("identity", "identity+qk", "dense", "longformer", "bigbird")
DEFAULTS = "lsg local 170/0 g1"  # the conversion defaults: the LSG row of the issue-15 targets
HEADS, HEAD_DIM = BASE_DIMS["num_attention_heads"], BASE_DIMS["hidden_size"] // BASE_DIMS["num_attention_heads"]


def lsg_model_name(setting: str, backend: str) -> str:
    return f"{setting}, {backend}"


def lsg_setting_and_backend(name: str) -> tuple[str, str]:
    """("lsg norm 128/128 f2 g1", "sdpa") for "lsg norm 128/128 f2 g1, sdpa"."""
    setting, backend = name.rsplit(", ", 1)
    return setting, backend


def identity_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention that returns its values: what a model costs when attention is free."""
    return value.transpose(1, 2), None


class _FreeAttention(torch.autograd.Function):
    """Returns the values; the queries and keys get zero gradients, so their projections still run
    backward as they do under any real attention."""

    @staticmethod
    def forward(ctx, query, key, value):
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad), torch.zeros_like(grad), grad


def identity_attention_keeping_qk(module, query, key, value, attention_mask, **kwargs):
    """Identity attention that keeps the query and key projections in the backward pass."""
    return _FreeAttention.apply(query, key, value).transpose(1, 2), None


AttentionInterface.register("identity", identity_attention)
AttentionInterface.register("identity_qk", identity_attention_keeping_qk)


def build_model(name: str, layers: int, max_length: int) -> torch.nn.Module:
    """A randomly initialised base-size encoder of the given kind, able to read max_length tokens."""
    dims = {**BASE_DIMS, "num_hidden_layers": layers, "max_position_embeddings": max_length + 2}
    if name == "identity":
        return BertModel(BertConfig(**dims, attn_implementation="identity"), add_pooling_layer=False)
    if name == "identity+qk":
        return BertModel(BertConfig(**dims, attn_implementation="identity_qk"), add_pooling_layer=False)
    if name == "dense":
        return BertModel(BertConfig(**dims, attn_implementation="sdpa"), add_pooling_layer=False)
    if name == "longformer":
        return LongformerModel(LongformerConfig(**dims, attention_window=512), add_pooling_layer=False)
    if name == "bigbird":
        config = BigBirdConfig(**dims, attention_type="block_sparse", block_size=64, num_random_blocks=3)
        return BigBirdModel(config, add_pooling_layer=False)
    setting, backend = lsg_setting_and_backend(name)
    config = LSGBertConfig(**dims, **LSG_SETTINGS[setting], attn_implementation=None if backend == "default" else backend)
    return LSGBertModel(config, add_pooling_layer=False)


def padded_tail(length: int, padding: float) -> int:
    """Tokens of padding at the end of an input of `length` tokens for a `padding` fraction of it."""
    return round(length * padding)


def step_functions(
    model: torch.nn.Module, input_ids: torch.Tensor, train: bool, padding: float = 0.0
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(inference: eval mode, no grad; training step: forward + backward, in train mode if `train`); the last
    `padding` fraction of the tokens masked as padding (attention_mask 0) where it is not 0."""
    inputs = {"input_ids": input_ids}
    if padding:
        inputs["attention_mask"] = torch.ones_like(input_ids)
        inputs["attention_mask"][:, input_ids.shape[1] - padded_tail(input_ids.shape[1], padding) :] = 0
    if isinstance(getattr(model, "_orig_mod", model), LongformerModel):  # first token global, as LSG's global token
        first = torch.tensor([0], device=input_ids.device)
        inputs["global_attention_mask"] = torch.zeros_like(input_ids).index_fill_(1, first, 1)

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(**inputs)

    def forward_backward() -> None:
        model.train(train)
        model(**inputs).last_hidden_state.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    return forward, forward_backward


def median_seconds(step: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Median seconds of `repeats` calls after a warm-up call."""
    return first_and_median_seconds(step, repeats, device)[1]


def first_and_median_seconds(step: Callable[[], None], repeats: int, device: torch.device) -> tuple[float, float]:
    """(seconds of the first call, compiles included, median seconds of the next `repeats` calls)."""
    times = []
    for _ in range(1 + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:])


@dataclass
class InferenceRow:
    """Inference (eval, no grad, forward) of the whole model or of the attention alone."""

    what: str  # "model" or "attention"
    name: str
    length: int
    first_seconds: float
    seconds: float


def model_inference(name: str, length: int, args: argparse.Namespace) -> InferenceRow:
    model, input_ids = prepare(name, length, args)
    forward, _ = step_functions(model, input_ids, train=False, padding=args.padding)
    first, median = first_and_median_seconds(forward, args.repeats, torch.device(args.device))
    return InferenceRow("model", name, length, first, median)


def attention_inference(name: str, length: int, args: argparse.Namespace) -> InferenceRow:
    """One LSG attention call without gradients on random (1, 12, 1 + length, 64) queries, keys, values."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    setting, backend = lsg_setting_and_backend(name)
    config = LSGBertConfig(**LSG_SETTINGS[setting])
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, HEADS, config.num_global_tokens + length, HEAD_DIM, generator=generator).to(device, dtype)
        for _ in range(3)
    )

    def forward() -> None:
        with torch.no_grad():
            lsg_attention(q, k, v, None, config, backend=backend)

    first, median = first_and_median_seconds(forward, args.repeats, device)
    return InferenceRow("attention", name, length, first, median)


def inference_table(rows: list[InferenceRow]) -> str:
    lines = [
        "\n**Inference** (eval, no grad, forward; B 1, 12 heads of 64): median of the calls after the first, "
        "and the first call apart (it compiles flex_attention: static at the first length, dynamic at the next)\n",
        "| what | model | tokens | forward s | first call s |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.what} | {row.name} | {row.length} | {fmt(row.seconds)} | {fmt(row.first_seconds, 2)} |")
    return "\n".join(lines)


def inference_report(names: list[str], args: argparse.Namespace) -> str:
    """The inference table of the LSG rows `names`, whole model then attention alone, length by length."""
    rows = []
    for measure_row in (model_inference, attention_inference):
        for length in args.lengths:
            for name in names:
                rows.append(row := measure_row(name, length, args))
                print(f"{length:>6} {row.what} {name:<36} fwd {fmt(row.seconds)} s  first {fmt(row.first_seconds, 2)} s",
                      flush=True)
    return inference_table(rows)


def prepare(name: str, length: int, args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = build_model(name, args.layers, length).to(device=device, dtype=dtype)
    if args.compile:  # static shapes: each length its own graphs, as a run padded to one length gets
        model = torch.compile(model, mode=args.compile_mode, fullgraph=args.fullgraph, dynamic=False)
    input_ids = torch.randint(1000, BASE_DIMS["vocab_size"], (1, length), device=device)
    return model, input_ids


def resident_kib(field: str) -> int:
    """VmRSS / VmHWM of this process in KiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def cuda_peak_mib(step: Callable[[], None]) -> float:
    """CUDA memory one run of `step` allocates on top of what is already allocated, at its peak, in MiB."""
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - baseline) / 2**20


def peak_memory_mib(name: str, length: int, args: argparse.Namespace) -> float:
    """Memory a forward+backward step adds on top of the model and its inputs, in MiB."""
    model, input_ids = prepare(name, length, args)
    _, forward_backward = step_functions(model, input_ids, train=not args.eval, padding=args.padding)
    if args.device == "cuda":
        return cuda_peak_mib(forward_backward)
    # CPU: run in this (fresh) process once to settle lazy allocations, reset the high-water mark,
    # then measure the resident set's rise over one step.
    forward_backward()
    baseline = resident_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    forward_backward()
    return (resident_kib("VmHWM") - baseline) / 1024


def measure_memory_in_child(name: str, length: int, args: argparse.Namespace) -> float:
    """CPU peak memory is a process-wide figure: measure each model in a process of its own."""
    command = [sys.executable, __file__, "--memory-of", name, "--lengths", str(length), *forwarded_options(args)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"]


def forwarded_options(args: argparse.Namespace) -> list[str]:
    options = ["--layers", str(args.layers), "--device", args.device, "--dtype", args.dtype, "--padding", str(args.padding)]
    return options + (["--eval"] if args.eval else [])


@dataclass
class Row:
    model: str
    length: int
    forward: float | None
    forward_backward: float | None
    peak_mib: float | None


def measure(name: str, length: int, args: argparse.Namespace) -> Row:
    model, input_ids = prepare(name, length, args)
    forward, forward_backward = step_functions(model, input_ids, train=not args.eval, padding=args.padding)
    device = torch.device(args.device)
    # dense attention in train mode (dropout) runs SDPA's O(n^2) math kernel: cap its length
    math_kernel = name == "dense" and not args.eval and length > args.max_dense_train_length
    train_step = not args.forward_only and not math_kernel
    forward_seconds = median_seconds(forward, args.repeats, device)
    train_seconds = median_seconds(forward_backward, args.repeats, device) if train_step else None
    del model
    if not train_step or args.skip_memory:
        peak = None
    elif args.device == "cuda":
        peak = peak_memory_mib(name, length, args)
    else:
        peak = measure_memory_in_child(name, length, args)
    return Row(name, length, forward_seconds, train_seconds, peak)


def attention_only(name: str, length: int, args: argparse.Namespace) -> Row:
    """Forward + backward of one attention call on random (1, 12, length, 64) queries, keys and values
    (LSG: one global token in front): median time and the peak CUDA memory it adds (None on CPU)."""
    device = torch.device(args.device)
    forward_backward = attention_step(name, length, device, getattr(torch, args.dtype), args.padding)
    seconds = median_seconds(forward_backward, args.repeats, device)
    peak = cuda_peak_mib(forward_backward) if device.type == "cuda" else None
    return Row(name, length, None, seconds, peak)  # no forward-only time


def attention_step(
    name: str, length: int, device: torch.device, dtype: torch.dtype, padding: float = 0.0
) -> Callable[[], None]:
    """Forward + backward of one attention call of `name` ("dense", or an LSG setting and backend of the
    attention-only table) on random (1, 12, length, 64) queries, keys and values (LSG: g global tokens in
    front), the keys of the last `padding` fraction of the tokens masked where it is not 0."""
    config, backend = None, None
    if name != "dense":
        setting, backend = lsg_setting_and_backend(name)
        config = LSGBertConfig(**LSG_SETTINGS[setting])
    num_global = 0 if config is None else config.num_global_tokens
    mask = None
    if padding:  # (1, g + length) bool
        mask = (torch.arange(num_global + length, device=device) < num_global + length - padded_tail(length, padding))[None]

    def attention(q, k, v):
        if config is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None, None])
        return lsg_attention(q, k, v, mask, config, backend=backend)[0]

    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, HEADS, num_global + length, HEAD_DIM, generator=generator).to(device, dtype).requires_grad_()
        for _ in range(3)
    )

    def forward_backward() -> None:
        attention(q, k, v).float().square().mean().backward()
        q.grad = k.grad = v.grad = None

    return forward_backward


def attention_table(rows: list[Row], lengths: list[int]) -> str:
    lines = [
        "\n**Attention alone**, forward + backward of one call (B 1, 12 heads of 64; ratio: dense / row, "
        "above 1 = faster than dense)\n",
        "| attention | tokens | fwd+bwd ms | peak MiB | dense / row |",
        "|---|---|---|---|---|",
    ]
    dense = {row.length: row for row in rows if row.model == "dense"}
    for length in lengths:
        for row in (r for r in rows if r.length == length):
            speedup = ratio(dense[length], row, "forward_backward") if length in dense else None
            lines.append(f"| {row.model} | {length} | {fmt(row.forward_backward * 1000, 2)} | {fmt(row.peak_mib, 0)} "
                         f"| {fmt(speedup, 2)} |")
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (else as `platform` does)."""
    return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor())


def machine_description(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU {cpu_name()}, {torch.get_num_threads()} threads"
    return (
        f"{device}; torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}; "
        f"{args.dtype}, batch 1, hidden 768, 12 heads, {args.layers} layers; forward: eval mode, no grad; "
        f"forward+backward: {'eval' if args.eval else 'train'} mode"
        f"{f', the last {args.padding:.0%} of each input padding' if args.padding else ''}"
        f"{compile_description(args)}, median of {args.repeats} after 1 warm-up"
    )


def compile_description(args: argparse.Namespace) -> str:
    """", torch.compile (mode, fullgraph)" for a compiled run, "" otherwise."""
    if not args.compile:
        return ""
    options = ([f"mode {args.compile_mode}"] if args.compile_mode else []) + (["fullgraph"] if args.fullgraph else [])
    return ", torch.compile" + (f" ({', '.join(options)})" if options else "")


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def reference_setting(rows: list[Row]) -> str:
    """The LSG setting every ratio is taken against: the first one measured."""
    return next((row.model for row in rows if row.model not in PEERS), "")


def ratio(row: Row, base: Row | None, attribute: str) -> float | None:
    """row.attribute / base.attribute, None where either was not measured."""
    value, reference = getattr(row, attribute), getattr(base, attribute, None)
    return None if value is None or not reference else value / reference


def tables(rows: list[Row], lengths: list[int]) -> str:
    reference_name = reference_setting(rows)
    reference = {row.length: row for row in rows if row.model == reference_name}
    lines = []
    for length in lengths:
        base = reference.get(length)
        lines += [
            f"\n**{length} tokens** (ratios: model / `{reference_name}`; above 1 = slower or larger than LSG)\n",
            "| model | fwd s | fwd+bwd s | peak MiB | fwd ratio | fwd+bwd ratio | memory ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in (r for r in rows if r.length == length):
            ratios = (fmt(ratio(row, base, attribute), 2) for attribute in ("forward", "forward_backward", "peak_mib"))
            lines.append(
                f"| {row.model} | {fmt(row.forward)} | {fmt(row.forward_backward)} | {fmt(row.peak_mib, 0)} "
                f"| {' | '.join(ratios)} |"
            )
    return "\n".join(lines)


def target_checks(rows: list[Row]) -> list[tuple[str, float, str, float]]:
    """The targets of issue 5 that this run measured: (what, measured, comparison, bound)."""
    at = {(row.model, row.length): row for row in rows}
    checks = []
    reference_name = reference_setting(rows)
    lsg = at.get((reference_name, 4096))
    if lsg and lsg.forward_backward:
        for peer in ("identity", "identity+qk"):
            row = at.get((peer, 4096))
            if row and row.forward_backward:
                checks.append((f"4096 fwd+bwd LSG / {peer}", lsg.forward_backward / row.forward_backward, "<=", 1.25))
        for peer, bound in (("longformer", 3.0), ("bigbird", 2.0), ("dense", 2.0)):
            row = at.get((peer, 4096))
            if row and row.forward_backward:
                checks.append((f"4096 fwd+bwd {peer} / LSG", row.forward_backward / lsg.forward_backward, ">=", bound))
        longformer = at.get(("longformer", 4096))
        if lsg.peak_mib and longformer and longformer.peak_mib:
            checks.append(("4096 peak memory LSG / longformer", lsg.peak_mib / longformer.peak_mib, "<=", 0.65))
    long_run = at.get((reference_name, 16384))
    if lsg and long_run:
        checks.append(("LSG fwd time 16384 / 4096", long_run.forward / lsg.forward, "<=", 4.4))
    return checks


def gpu_target_checks(rows: list[Row], attention_rows: list[Row]) -> list[tuple[str, float, str, float]]:
    """The targets of issue 48 (CUDA, bf16, 12 layers, training step) that this run measured, for the
    conversion defaults on flex_attention."""
    at = {(row.model, row.length): row for row in rows}
    lsg_name = lsg_model_name(DEFAULTS, "flex_attention")
    checks = []

    def compare(what, numerator, denominator, attribute, comparison, bound):
        if numerator and denominator and getattr(numerator, attribute) and getattr(denominator, attribute):
            checks.append((what, getattr(numerator, attribute) / getattr(denominator, attribute), comparison, bound))

    compare("4096 fwd+bwd LSG / dense", at.get((lsg_name, 4096)), at.get(("dense", 4096)), "forward_backward", "<=", 1.1)
    for length, bound in ((16384, 3.5), (32768, 7.0)):
        compare(f"{length} fwd+bwd dense / LSG", at.get(("dense", length)), at.get((lsg_name, length)), "forward_backward", ">=", bound)
    lsg = at.get((lsg_name, 16384))
    for peer in ("longformer", "bigbird"):
        compare(f"16384 fwd+bwd {peer} / LSG", at.get((peer, 16384)), lsg, "forward_backward", ">=", 4.0)
    for length in sorted({row.length for row in rows}):
        compare(f"{length} peak memory LSG / dense", at.get((lsg_name, length)), at.get(("dense", length)), "peak_mib", "<=", 1.0)
    alone = {(row.model, row.length): row for row in attention_rows}
    compare("16384 attention alone dense / LSG", alone.get(("dense", 16384)), alone.get((lsg_name, 16384)),
            "forward_backward", ">=", 10.0)
    return checks


def checks_text(checks: list[tuple[str, float, str, float]]) -> str:
    lines = ["| target | measured | bound | met |", "|---|---|---|---|"]
    for what, value, comparison, bound in checks:
        met = value <= bound if comparison == "<=" else value >= bound
        lines.append(f"| {what} | {value:.2f} | {comparison} {bound} | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, attribute, label in ((axes[0], "forward", "forward"), (axes[1], "forward_backward", "forward + backward")):
        for model in dict.fromkeys(row.model for row in rows):
            points = [(row.length, getattr(row, attribute)) for row in rows if row.model == model and getattr(row, attribute)]
            if points:
                axis.plot(*zip(*points), marker="o", label=model)
        axis.set(xscale="log", yscale="log", xlabel="tokens", ylabel="seconds (median)", title=label)
        axis.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    figure.suptitle(textwrap.fill(title, 160), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def results_arguments(parser: argparse.ArgumentParser) -> None:
    """--results TITLE and --results-file, which every benchmark writing into RESULTS.md takes."""
    parser.add_argument("--results", metavar="TITLE", help="write the tables into --results-file under this heading")
    parser.add_argument("--results-file", type=Path, default=Path(__file__).with_name("RESULTS.md"))


def print_and_record(args: argparse.Namespace, description: str, body: str) -> None:
    """Print the run's `description` and `body`; with --results, also write them into --results-file."""
    print(f"\n{description}\n\n{body}")
    if args.results:
        record_results(args.results_file, args.results, description, body)


def record_results(results_file: Path, title: str, description: str, body: str) -> None:
    """Write `body` into the results file as the section `## title`, after the machine's `description`
    and the command that ran this script (with the arguments it was given)."""
    command = f"python benchmarks/{Path(sys.argv[0]).name} " + shlex.join(sys.argv[1:])
    write_results(results_file, title, f"## {title}\n\n{description}\n\n`{command}`\n\n{body}\n")


def write_results(results_file: Path, section: str, body: str) -> None:
    """Replace (or append) the section `section` of the results file, delimited by HTML comments."""
    start, end = f"<!-- {section} -->", f"<!-- /{section} -->"
    text = results_file.read_text() if results_file.exists() else "# Benchmark results\n"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    results_file.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", help="CPU: 1k-16k; CUDA: 4k-32k")
    parser.add_argument("--layers", type=int, help="CPU: 2; CUDA: 12")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=[*PEERS, *LSG_SETTINGS], choices=[*PEERS, *LSG_SETTINGS],
                        metavar="MODEL", help=f"subset of: {', '.join([*PEERS, *LSG_SETTINGS])}")
    parser.add_argument("--backends", nargs="+", choices=["sdpa", "flex_attention", "default"],
                        help="attention backends of the LSG rows (CPU: sdpa; CUDA: flex_attention sdpa; "
                        "default: attn_implementation left unset, chosen per call)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="CPU: float32; CUDA: bfloat16")
    parser.add_argument("--skip-attention", action="store_true", help="leave out the attention-only table")
    parser.add_argument("--eval", action="store_true", help="training step in eval mode (no dropout)")
    parser.add_argument("--padding", type=float, default=0.0,
                        help="fraction of each input masked as padding at its end (attention_mask 0), e.g. 0.25")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                        help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--fullgraph", action="store_true", help="torch.compile with fullgraph=True (fails on a graph break)")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--inference", action="store_true",
                        help="only the inference table: whole model and attention alone, first call (compiles) apart")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--max-dense-train-length", type=int, default=4096,
                        help="longest input for the dense model's training step (its memory is quadratic)")
    results_arguments(parser)
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    on_cuda = args.device == "cuda"
    args.lengths = args.lengths or ([4096, 8192, 16384, 32768] if on_cuda else [1024, 2048, 4096, 8192, 16384])
    args.layers = args.layers or (12 if on_cuda else 2)
    args.dtype = args.dtype or ("bfloat16" if on_cuda else "float32")
    args.backends = args.backends or (["flex_attention", "sdpa"] if on_cuda else ["sdpa"])

    if args.memory_of:  # child process of measure_memory_in_child
        print(json.dumps({"peak_mib": peak_memory_mib(args.memory_of, args.lengths[0], args)}))
        return

    description = machine_description(args)
    print(description, flush=True)
    names = [name for model in args.models for name in
             ([model] if model in PEERS else [lsg_model_name(model, backend) for backend in args.backends])]
    if args.inference:
        lsg_names = [name for name in names if name not in PEERS]
        report_and_record(inference_report(lsg_names, args), [], description, args)
        return
    rows = []
    for length in args.lengths:
        for name in names:
            rows.append(row := measure(name, length, args))
            print(f"{length:>6} {name:<36} fwd {fmt(row.forward)} s  fwd+bwd {fmt(row.forward_backward)} s  "
                  f"peak {fmt(row.peak_mib, 0)} MiB", flush=True)
    attention_rows = []
    if not args.skip_attention:
        attention_names = ["dense"] + [
            lsg_model_name(setting, backend)
            for setting in dict.fromkeys([*(m for m in args.models if m in LSG_SETTINGS), "lsg local 128/0 g1"])
            for backend in args.backends
        ]
        for length in args.lengths:
            for name in attention_names:
                attention_rows.append(row := attention_only(name, length, args))
                print(f"{length:>6} attention {name:<36} fwd+bwd {fmt(row.forward_backward * 1000, 2)} ms  "
                      f"peak {fmt(row.peak_mib, 0)} MiB", flush=True)

    report = tables(rows, args.lengths)
    if attention_rows:
        report += "\n" + attention_table(attention_rows, args.lengths)
    checks = gpu_target_checks(rows, attention_rows) if on_cuda else target_checks(rows)
    report_and_record(report, checks, description, args)
    if args.plot:
        plot(rows, args.plot, description)


def report_and_record(report: str, checks: list, description: str, args: argparse.Namespace) -> None:
    """Print the report and, with --results, write it into --results-file under that heading."""
    print(report)
    if checks:
        print("\n" + checks_text(checks))
    if args.results:
        command = "python benchmarks/bench_speed.py " + shlex.join(sys.argv[1:])
        body = f"## {args.results}\n\n{description}\n\n`{command}`\n{report}\n"
        if checks:
            body += "\n**Targets**\n\n" + checks_text(checks) + "\n"
        if args.plot:
            body += f"\n![{args.results}]({os.path.relpath(args.plot, args.results_file.parent)})\n"
        write_results(args.results_file, args.results, body)

if __name__ == "__main__":
    main()
