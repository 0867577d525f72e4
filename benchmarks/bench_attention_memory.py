"""The memory one attention call holds from its forward to its backward: LSG against dense SDPA.

    python benchmarks/bench_attention_memory.py --lengths 4096 8192 16384 32768
    python benchmarks/bench_attention_memory.py --device cuda --dtype bfloat16 --backends sdpa flex_attention
    python benchmarks/bench_attention_memory.py --lengths 4096 16384 --padded   # a padded batch of 2
    python benchmarks/bench_attention_memory.py --lengths 4096 --detail         # then what each call holds

What one call (one layer's attention: batch 1, 12 heads of 64) holds until its backward pass: its
queries, keys and values, its output and every tensor autograd saved, each storage once (`held_mib`):
what a model's training step holds per layer on top of its other activations, and so what sets its peak
memory. Dense SDPA (on the CPU its flash kernel, O(n) too) against LSG with the conversion defaults
(block 170, no sparse keys, one global token) and each backend given; `--padded`: a batch of 2 whose
second row's last quarter is padding (dense SDPA with the padding mask). On the CPU a proxy of the GPU's
memory (flex_attention has no backward pass there: it runs sdpa, so measure it on CUDA).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lsg_converter import LSGBertConfig
from lsg_converter.models.lsg_attention import lsg_attention

DEFAULTS = dict(block_size=170, sparse_block_size=0, sparsity_type="none", num_global_tokens=1)


def held_mib(attention, inputs: list[torch.Tensor]) -> float:
    """MiB that one call of `attention(*inputs)` holds until its backward: its inputs, its output and the
    tensors autograd saved, each storage once. CUDA: the allocator's rise over the forward (saved tensors
    and output) plus the inputs; CPU: the storages saved (autograd's hooks), output and inputs."""
    inputs_bytes = sum(x.untyped_storage().nbytes() for x in inputs)
    if inputs[0].is_cuda:
        attention(*inputs)  # a first call compiles flex_attention's kernel
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        output = attention(*inputs)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        del output
        return (held + inputs_bytes) / 2**20
    return sum(x.untyped_storage().nbytes() for x, _ in held_storages(attention, inputs).values()) / 2**20


def held_storages(attention, inputs: list[torch.Tensor]) -> dict[int, tuple[torch.Tensor, str]]:
    """The storages one call of `attention(*inputs)` holds until its backward, each once: its inputs, the
    tensors autograd saved (through its hooks) and its output, by address: a tensor on each and what it is."""
    held = {x.untyped_storage().data_ptr(): (x, f"input {index}") for index, x in enumerate(inputs)}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        held.setdefault(tensor.untyped_storage().data_ptr(), (tensor, "saved"))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = attention(*inputs)
    pointer = output.untyped_storage().data_ptr()
    held[pointer] = (output, "output" if pointer not in held else f"{held[pointer][1]}, output")
    return held


def held_tensors(attention, inputs: list[torch.Tensor]) -> list[str]:
    """What one call of `attention(*inputs)` holds until its backward, storage by storage (`held_storages`):
    a line each, its shape, dtype and MiB, and what it is. On CUDA it names what the allocator's rise
    (`held_mib`) is made of."""
    attention(*inputs)  # a first call compiles flex_attention's kernel
    return [
        f"{what}: {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}, {x.untyped_storage().nbytes() / 2**20:.1f} MiB"
        for x, what in held_storages(attention, inputs).values()
    ]


def projections(length: int, device: torch.device, dtype: torch.dtype, batch: int = 1) -> list[torch.Tensor]:
    """Queries, keys and values as a model's projections lay them out: (B, L, 12, 64) seen as (B, 12, L, 64)."""
    return [torch.randn(batch, length, 12, 64, device=device, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3)]


def padding_mask(length: int, batch: int, device: torch.device) -> torch.Tensor | None:
    """(B, 1 + length) bool over the global token and the tokens: row 2's last quarter padding (None for one row)."""
    if batch == 1:
        return None
    mask = torch.ones(batch, 1 + length, dtype=torch.bool, device=device)
    mask[1, 1 + 3 * length // 4 :] = False
    return mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backends", nargs="+", default=["sdpa"], choices=["sdpa", "flex_attention"])
    parser.add_argument("--padded", action="store_true", help="a batch of 2, the second row's last quarter padding")
    parser.add_argument("--detail", action="store_true", help="then list what each LSG call holds, storage by storage")
    args = parser.parse_args()
    batch = 2 if args.padded else 1
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = LSGBertConfig(**DEFAULTS)

    header = ["tokens", "dense MiB"] + [f"LSG {backend} {what}" for backend in args.backends for what in ("MiB", "/ dense")]
    rows = "batch 2, row 2's last quarter padding" if args.padded else "batch 1"
    print(f"{args.device}, {args.dtype}, {rows}, 12 heads of 64; LSG: block 170, no sparse keys, 1 global token\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for length in args.lengths:
        mask = padding_mask(length, batch, device)
        dense_mask = None if mask is None else mask[:, None, None, 1:]
        dense = held_mib(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask), projections(length, device, dtype, batch)
        )
        cells = [str(length), f"{dense:.1f}"]
        for backend in args.backends:
            lsg = held_mib(
                lambda q, k, v: lsg_attention(q, k, v, mask, config, backend=backend)[0],
                projections(1 + length, device, dtype, batch),
            )
            cells += [f"{lsg:.1f}", f"{lsg / dense:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    if args.detail:
        for length in args.lengths:
            mask = padding_mask(length, batch, device)
            for backend in args.backends:
                print(f"\nLSG {backend}, {length} tokens, what one call holds until its backward:")
                lines = held_tensors(
                    lambda q, k, v: lsg_attention(q, k, v, mask, config, backend=backend)[0],
                    projections(1 + length, device, dtype, batch),
                )
                print("\n".join(f"- {line}" for line in lines), flush=True)


if __name__ == "__main__":
    main()
