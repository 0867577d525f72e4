"""Side-by-side timing of the LSG attention core against dense SDPA, on one machine in one run.

    python benchmarks/bench_attention.py --lengths 1024 2048 4096 --repeats 5

Prints, per length, the median forward and forward+backward times of both and their ratio
(dense / LSG: above 1 means LSG is faster). Ratios, not absolute times, are what carry over
between machines.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from lsg_converter.models.lsg_attention import lsg_attention
from lsg_converter.models.lsg_defaults import LSG_DEFAULTS


def median_seconds(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(attention, length: int, heads: int, head_dim: int, repeats: int) -> tuple[float, float]:
    query, key, value = (torch.randn(1, heads, length, head_dim, requires_grad=True) for _ in range(3))

    def forward():
        with torch.no_grad():
            attention(query, key, value)

    def forward_backward():
        attention(query, key, value).sum().backward()

    return median_seconds(forward, repeats), median_seconds(forward_backward, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sparsity-type", default="norm")
    args = parser.parse_args()

    config = SimpleNamespace(**{**LSG_DEFAULTS, "sparsity_type": args.sparsity_type})

    def lsg(query, key, value):
        return lsg_attention(query, key, value, None, config)[0]

    def dense(query, key, value):
        return F.scaled_dot_product_attention(query, key, value)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B=1 H={args.heads} D={args.head_dim}")
    print(f"LSG: block 128, sparse 128, factor 2, {args.sparsity_type}, 1 global token (length includes it)")
    print("| tokens | LSG fwd s | dense fwd s | fwd ratio | LSG fwd+bwd s | dense fwd+bwd s | fwd+bwd ratio |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        lsg_fwd, lsg_train = measure(lsg, length + 1, args.heads, args.head_dim, args.repeats)
        dense_fwd, dense_train = measure(dense, length + 1, args.heads, args.head_dim, args.repeats)
        print(
            f"| {length} | {lsg_fwd:.3f} | {dense_fwd:.3f} | {dense_fwd / lsg_fwd:.2f} "
            f"| {lsg_train:.3f} | {dense_train:.3f} | {dense_train / lsg_train:.2f} |"
        )


if __name__ == "__main__":
    main()
