"""Where one LSG training step spends its time on the GPU (issue 36): torch.profiler's device time per op.

    python benchmarks/profile_attention.py                                  # CUDA, bf16, 4,096 and 16,384 tokens
    python benchmarks/profile_attention.py --lengths 16384 --backends sdpa --rows 25
    python benchmarks/profile_attention.py --device cpu --dtype float32 --lengths 2048

For each length it profiles, one after the other in one process:

* ``attention``: forward + backward of one attention call on random (1, 12, 1 + n, 64) queries, keys and
  values (bench_speed's attention-alone row): dense SDPA, then LSG (defaults: local blocks of 170, one
  global token) with each backend of ``--backends``;
* ``model``: forward + backward of bench_speed's BERT-base encoder (``--layers`` layers, eval mode): dense
  (SDPA), then LSG with each of ``--settings`` and each backend, then a table of where each step's time
  goes (`CATEGORIES`: the attention kernels, the masks and layouts, copies, matrix products, the rest; the
  kernels launched; on CUDA the host's share, wall minus device time);
* ``flex-kernel``: the flex_attention kernel alone, forward without gradients, compiled static, under
  masks of the defaults' local rule built eight ways, from LSG's layout (the layer's own g + n rows) and
  mask_mod (the rule alone, a padded row's bounds read, each key's validity read) to torch's
  `create_block_mask` on the tokens alone, against dense SDPA: which part makes the kernel slow.

Each is run twice to warm up (flex_attention compiles then), then ``--steps`` times under the profiler.
Per step it prints the wall time, the device time of its kernels (the ops' rows and their kernels' rows
are both counted), the number of kernels launched and the ops sorted by their own device time (CPU:
their own CPU time), with how many times each ran.

    python benchmarks/profile_attention.py --what model --lengths 4096 16384 --settings "lsg local 170/0 g1" "lsg local 128/0 g1"
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bench_speed import DEFAULTS, HEAD_DIM, HEADS, LSG_SETTINGS, attention_step, lsg_model_name, prepare
from bench_speed import step_functions
from lsg_converter import LSGBertConfig


def model_step(name: str, length: int, layers: int, device: torch.device, dtype: torch.dtype) -> Callable[[], None]:
    """Forward + backward of bench_speed's model `name` ("dense", or an LSG setting and backend) in eval mode
    (no dropout)."""
    options = argparse.Namespace(device=device.type, dtype=str(dtype).removeprefix("torch."), layers=layers, compile=False)
    model, input_ids = prepare(name, length, options)
    return step_functions(model, input_ids, train=False)[1]


# Where a step's time goes: each op, by the first pattern its name matches (CPU-side ops and compiled kernels'
# launchers, by their own time; the device's kernel rows are left out, their ops count them)
CATEGORIES = {
    "attention kernels": r"flash|attention|sdpa|fmha|flex|triton_tem|efficient",
    "masks and layout": r"where|nonzero|arange|logical|bitwise|::(lt|le|gt|ge|eq|ne|any|all|cumsum|clamp|remainder|floor_divide)\b|block_mask|scatter|index_put",
    "copies, pads, cats": r"copy|::cat\b|pad|index|gather|clone|contiguous|memcpy|memset|fill|zero|stack|unfold",
    "matrix products": r"mm\b|matmul|linear|gemm|bmm|addmm",
}


def category(name: str) -> str:
    """The `CATEGORIES` entry of an op's name, or "other"."""
    return next((title for title, pattern in CATEGORIES.items() if re.search(pattern, name.lower())), "other")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def device_microseconds(event) -> float:
    """An op's own time on the device (older torch: `self_cuda_time_total`)."""
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def profile_step(title: str, step: Callable[[], None], steps: int, rows: int, device: torch.device) -> dict[str, float]:
    """Warm up, then print wall time, device time, kernels launched and the costliest ops of `step`; returns
    them per step (ms; "kernels": a count) with the ops' own time per `CATEGORIES`."""
    on_cuda = device.type == "cuda"
    for _ in range(2):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as recorded:
        for _ in range(steps):
            step()
        synchronize(device)
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    events = recorded.key_averages()
    own = device_microseconds if on_cuda else (lambda event: event.self_cpu_time_total)
    kernels = [e for e in recorded.events() if on_cuda and e.device_type.name == "CUDA"]
    total_ms = sum(own(e) for e in events) / 1e3 / steps
    print(f"\n### {title}\n\nper step: wall {wall_ms:.2f} ms (under the profiler), "
          f"{'device' if on_cuda else 'CPU'} time {total_ms:.2f} ms, {len(kernels) // steps} kernels launched\n")
    print(f"| op | {'device' if on_cuda else 'CPU'} ms per step | calls per step |\n|---|---|---|")
    for event in sorted(events, key=own, reverse=True)[:rows]:
        print(f"| `{event.key[:90]}` | {own(event) / 1e3 / steps:.3f} | {event.count // steps} |")
    summary = {"wall": wall_ms, "device": total_ms, "kernels": len(kernels) // steps if on_cuda else float("nan")}
    summary.update({title: 0.0 for title in [*CATEGORIES, "other"]})
    for event in events:
        if not (on_cuda and event.device_type.name == "CUDA"):  # a kernel's row: its op counts it
            summary[category(event.key)] += own(event) / 1e3 / steps
    return summary


def print_time_shares(length: int, summaries: dict[str, dict[str, float]], on_cuda: bool) -> None:
    """One table of where each model's step spends its time at `length` tokens (`profile_step`'s summaries)."""
    where = "device" if on_cuda else "CPU"
    titles = [*CATEGORIES, "other"]
    print(f"\n### {length} tokens: where the step's time goes ({where} ms per step, each op's own time)\n")
    print(f"| model | wall ms | {where} ms | " + " | ".join(titles) + " | kernels launched | host share |")
    print("|---" * (len(titles) + 5) + "|")
    for name, summary in summaries.items():
        host = f"{1 - summary['device'] / summary['wall']:.0%}" if on_cuda else "n/a"
        kernels = "n/a" if summary["kernels"] != summary["kernels"] else f"{summary['kernels']:.0f}"
        shares = " | ".join(f"{summary[title]:.2f}" for title in titles)
        print(f"| {name} | {summary['wall']:.2f} | {summary['device']:.2f} | {shares} | {kernels} | {host} |")


def flex_kernel_variants(length: int, device: torch.device, dtype: torch.dtype, repeats: int) -> None:
    """Median milliseconds of one flex_attention forward (no grad) on (1, 12, n, 64) under each mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from lsg_converter.models.lsg_flex import TILE, KeyLayout, RowBounds, _with_mask_mod, block_structure, lsg_mask_mod
    from lsg_converter.models.lsg_flex import tile_structure
    from lsg_converter.models.lsg_settings import LSGSettings

    pattern = LSGSettings.of(LSGBertConfig(**LSG_SETTINGS[DEFAULTS])).pattern()
    block = pattern.block_size
    layout = KeyLayout.of(pattern, length, TILE)  # the layer's g + n rows, as queries and keys
    offset = layout.token_offset
    generator = torch.Generator().manual_seed(0)

    def random(rows: int) -> torch.Tensor:
        return torch.randn(1, HEADS, rows, HEAD_DIM, generator=generator).to(device, dtype)

    queries, tokens, sequence = random(length), random(length), random(layout.length)
    sequence_valid = torch.ones(1, HEADS, layout.length, dtype=torch.bool, device=device)
    token_valid = torch.ones(1, HEADS, length, dtype=torch.bool, device=device)

    def local_rule(batch, head, query, key):  # tokens only: the block before, its own, the one after
        return (query // block - key // block).abs() <= 1

    def local_rule_in_layout(batch, head, query, key):  # LSG's layout: the global rows, then the tokens
        token_keys = (key >= offset) & local_rule(batch, head, query - offset, key - offset)
        return (query >= offset) & ((key < pattern.num_global) | token_keys)

    def local_rule_reading_validity(batch, head, query, key):
        return local_rule(batch, head, query, key) & token_valid[batch, head, key]

    structure = block_structure(pattern, length, TILE, device)
    full_tiles_structure = block_structure(pattern, length, TILE, device, rule_only=True)
    plain = create_block_mask(local_rule, 1, 1, length, length, device=device, BLOCK_SIZE=TILE)
    padded_row = RowBounds(torch.tensor([[0, length * 3 // 4]], device=device), None)  # the last quarter is padding
    variants = {
        "LSG structure and layout, local rule only": (sequence, sequence, _with_mask_mod(structure, local_rule_in_layout)),
        "LSG, its rule alone (no padding)": (sequence, sequence, _with_mask_mod(structure, lsg_mask_mod(pattern, layout))),
        "LSG, its rule alone, full tiles listed (as the backend runs it)": (
            sequence, sequence, _with_mask_mod(full_tiles_structure, lsg_mask_mod(pattern, layout))),
        "LSG, the row's bounds read (padded)": (
            sequence, sequence, _with_mask_mod(structure, lsg_mask_mod(pattern, layout, padded_row))),
        "LSG, padded, the row's own tiles (as the backend runs it)": (
            sequence, sequence,
            _with_mask_mod(tile_structure(pattern, length, TILE, device, True, padded_row.tokens), lsg_mask_mod(pattern, layout, padded_row))),
        "LSG, each key's validity read (a hole in a row's mask, as the backend runs it)": (
            sequence, sequence, _with_mask_mod(structure, lsg_mask_mod(pattern, layout, sequence_valid))),
        "create_block_mask, tokens only, local rule": (queries, tokens, plain),
        "create_block_mask, tokens only, local rule + validity read": (
            queries, tokens, create_block_mask(local_rule_reading_validity, 1, 1, length, length, device=device, BLOCK_SIZE=TILE)),
    }
    kernel = torch.compile(flex_attention, dynamic=False)
    print(f"\n### {length} tokens, flex_attention forward alone (no grad, compiled static)\n")
    print("| mask | ms | key tiles per query tile (full ones among them) |\n|---|---|---|")
    timings = {"dense SDPA (no mask)": (lambda: F.scaled_dot_product_attention(queries, tokens, tokens), None)}
    for name, (rows, keys, block_mask) in variants.items():
        timings[name] = (lambda rows=rows, keys=keys, block_mask=block_mask: kernel(rows, keys, keys, block_mask=block_mask),
                         tiles_read(block_mask))
    for name, (run, tiles) in timings.items():
        with torch.no_grad():
            for _ in range(2):
                run()
            times = []
            for _ in range(repeats):
                synchronize(device)
                start = time.perf_counter()
                run()
                synchronize(device)
                times.append((time.perf_counter() - start) * 1e3)
        print(f"| {name} | {sorted(times)[len(times) // 2]:.3f} | {tiles or ''} |", flush=True)


def tiles_read(block_mask) -> str:
    """The key tiles a BlockMask's query tiles read on average, and how many of them are full, if any."""
    partial = block_mask.kv_num_blocks.float().mean().item()
    if block_mask.full_kv_num_blocks is None:
        return f"{partial:.1f}"
    full = block_mask.full_kv_num_blocks.float().mean().item()
    return f"{partial + full:.1f} ({full:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--backends", nargs="+", default=["sdpa", "flex_attention"], choices=["sdpa", "flex_attention"])
    parser.add_argument("--what", nargs="+", default=["attention", "model"], choices=["attention", "model", "flex-kernel"])
    parser.add_argument("--layers", type=int, default=12, help="layers of the model profiled")
    parser.add_argument("--settings", nargs="+", default=[DEFAULTS], choices=list(LSG_SETTINGS),
                        help="the LSG settings of the model profiled (--what model)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=15, help="ops shown per profile")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; torch {torch.__version__}; {args.dtype}")
    for length in args.lengths:
        if "attention" in args.what:
            profile_step(f"{length} tokens, attention alone, dense SDPA", attention_step("dense", length, device, dtype),
                         args.steps, args.rows, device)
            for backend in args.backends:
                profile_step(f"{length} tokens, attention alone, LSG {backend}",
                             attention_step(lsg_model_name(DEFAULTS, backend), length, device, dtype),
                             args.steps, args.rows, device)
        if "flex-kernel" in args.what:
            flex_kernel_variants(length, device, dtype, repeats=10)
        if "model" in args.what:
            names = ["dense"] + [lsg_model_name(setting, backend) for setting in args.settings for backend in args.backends]
            summaries = {
                name: profile_step(f"{length} tokens, {args.layers}-layer {name}", model_step(name, length, args.layers, device, dtype),
                                   args.steps, args.rows, device)
                for name in names
            }
            print_time_shares(length, summaries, device.type == "cuda")  # at once: a run cut short keeps it


if __name__ == "__main__":
    main()
