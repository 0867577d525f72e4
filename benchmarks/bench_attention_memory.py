"""The memory one attention call holds from its forward to its backward: LSG against dense SDPA.

    python benchmarks/bench_attention_memory.py --lengths 4096 8192 16384 32768
    python benchmarks/bench_attention_memory.py --device cuda --dtype bfloat16 --backends sdpa flex_attention

Every tensor autograd saves for the backward pass of one call (one layer's attention: batch 1, 12 heads
of 64, the queries, keys and values counted too, as the call keeps them alive), each storage once: what
a model's training step holds per layer on top of its other activations, and so what sets its peak
memory. Dense SDPA (on the CPU its flash kernel, O(n) too) against LSG with the conversion defaults
(block 170, no sparse keys, one global token) and each backend given. A CPU proxy of the GPU's memory
(flex_attention has no backward pass on the CPU: there it runs sdpa, so it is measured on CUDA only).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lsg_converter import LSGBertConfig
from lsg_converter.models.lsg_attention import lsg_self_attention

DEFAULTS = dict(block_size=170, sparse_block_size=0, sparsity_type="none", num_global_tokens=1)


def saved_mib(attention, inputs: list[torch.Tensor]) -> float:
    """MiB of the storages autograd saves for the backward pass of `attention(*inputs)`, each counted once."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        attention(*inputs)
    return sum(storages.values()) / 2**20


def projections(length: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """Queries, keys and values as a model's projections lay them out: (1, L, 12, 64) seen as (1, 12, L, 64)."""
    return [torch.randn(1, length, 12, 64, device=device, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backends", nargs="+", default=["sdpa"], choices=["sdpa", "flex_attention"])
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = LSGBertConfig(**DEFAULTS)

    header = ["tokens", "dense MiB"] + [f"LSG {backend} {what}" for backend in args.backends for what in ("MiB", "/ dense")]
    print(f"{args.device}, {args.dtype}, batch 1, 12 heads of 64; LSG: block 170, no sparse keys, 1 global token\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for length in args.lengths:
        dense = saved_mib(F.scaled_dot_product_attention, projections(length, device, dtype))
        cells = [str(length), f"{dense:.1f}"]
        for backend in args.backends:
            lsg = saved_mib(
                lambda q, k, v: lsg_self_attention(q, k, v, None, config, backend=backend),
                projections(1 + length, device, dtype),
            )
            cells += [f"{lsg:.1f}", f"{lsg / dense:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
