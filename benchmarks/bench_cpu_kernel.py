"""What the CPU flash kernel costs per query row (issue 35): torch's
``_scaled_dot_product_flash_attention_for_cpu``, the kernel both the source model on 512-token chunks and
LSG's window views run on, measured alone.

    python benchmarks/bench_cpu_kernel.py
    python benchmarks/bench_cpu_kernel.py --results "The CPU flash kernel per query row (issue 35)"

Heads of ``--head-dim`` (32: all-MiniLM-L6-v2's), 12 of them, float32, no gradients. Two tables,
microseconds per query row and head, the median of ``--rounds`` rounds that run every case in turn (so
the machine's drift lands on all of them alike):

* by query rows per call, over 512 keys: the kernel splits a call's queries into tiles of 32 rows below
  192 of them, of 64 from 192 and of 256 from 768 on, and a tile costs a fixed amount besides its rows;
* the arrangements of one long sequence: the source on 512-token chunks, and LSG's blocks of 170 queries
  over windows of 510 keys read as views (rounded up to 512, the last 2 masked), given to the kernel as
  170 rows or, as the sdpa backend now does, as 192 (`lsg_sdpa.kernel_query_rows`, the extra rows'
  outputs dropped); per row the block keeps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date

import torch

from bench_speed import print_and_record, results_arguments

KERNEL = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
HEADS, KEYS, BLOCK = 12, 512, 170


def per_row_microseconds(cases: dict, rounds: int) -> dict[str, float]:
    """case name -> median µs per kept query row and head; cases: name -> (call, kept rows)."""
    times = {name: [] for name in cases}
    with torch.inference_mode():
        for call, _ in cases.values():
            call()
        for _ in range(rounds):
            for name, (call, rows) in cases.items():
                start = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - start) * 1e6 / rows / HEADS)
    return {name: statistics.median(values) for name, values in times.items()}


def by_query_rows(tokens: int, head_dim: int, rounds: int) -> list[str]:
    cases = {}
    for rows in (170, 191, 192, 256, 512, 767, 768):
        calls = tokens // rows
        query = torch.randn(calls, rows, HEADS, head_dim).transpose(1, 2)  # (n, H, rows, D), as projected
        key, value = (torch.randn(calls, KEYS, HEADS, head_dim).transpose(1, 2) for _ in range(2))
        cases[f"{rows}"] = (lambda q=query, k=key, v=value: KERNEL(q, k, v, 0.0, False), calls * rows)
    figures = per_row_microseconds(cases, rounds)
    return ["| query rows per call | tile rows | µs per row and head |", "|---|---|---|"] + [
        f"| {rows} | {256 if int(rows) >= 768 else 64 if int(rows) >= 192 else 32} | {value:.3f} |"
        for rows, value in figures.items()
    ]


def arrangements(tokens: int, head_dim: int, rounds: int) -> list[str]:
    projected = [torch.randn(tokens, HEADS, head_dim) for _ in range(3)]  # (T, H, D) of one sequence
    query, key, value = projected
    blocks = tokens // BLOCK - 3  # the blocks whose window lies inside the sequence, after the first

    def window_views(rows: torch.Tensor, size: int, first: int) -> torch.Tensor:  # (n, H, size, D), views
        return rows[first : first + (blocks - 1) * BLOCK + size].unfold(0, size, BLOCK).transpose(2, 3)

    keys, values = window_views(key, KEYS, 0), window_views(value, KEYS, 0)
    mask = torch.zeros(1, 1, 1, KEYS)
    mask[..., 3 * BLOCK :] = torch.finfo(torch.float32).min
    chunks = tokens // KEYS
    as_chunks = [x[: chunks * KEYS].unflatten(0, (chunks, KEYS)).transpose(1, 2) for x in projected]
    cases = {
        "source on 512-token chunks": (lambda: KERNEL(*as_chunks, 0.0, False), chunks * KEYS),
        "LSG blocks of 170 as 170 rows": (
            lambda: KERNEL(window_views(query, BLOCK, BLOCK), keys, values, 0.0, False, attn_mask=mask), blocks * BLOCK),
        "LSG blocks of 170 as 192 rows": (
            lambda: KERNEL(window_views(query, 192, BLOCK), keys, values, 0.0, False, attn_mask=mask), blocks * BLOCK),
    }
    figures = per_row_microseconds(cases, rounds)
    chunk = figures["source on 512-token chunks"]
    return ["| arrangement | µs per kept row and head | / chunks |", "|---|---|---|"] + [
        f"| {name} | {value:.3f} | {value / chunk:.2f} |" for name, value in figures.items()
    ]


def describe(args: argparse.Namespace) -> str:
    """The run's machine and settings, the line above its tables."""
    return (
        f"{date.today().isoformat()}; {args.threads} threads; torch {torch.__version__}; float32, {HEADS} heads of "
        f"{args.head_dim}, {KEYS} keys; by query rows: about {2 * args.tokens:,} rows per case; arrangements: one "
        f"sequence of {args.tokens:,} tokens; median of {args.rounds} rounds"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    results_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tables = [by_query_rows(2 * args.tokens, args.head_dim, args.rounds), arrangements(args.tokens, args.head_dim, args.rounds)]
    print_and_record(args, describe(args), "\n\n".join("\n".join(table) for table in tables))


if __name__ == "__main__":
    main()
