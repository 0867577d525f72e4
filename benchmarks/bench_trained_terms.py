"""One attention call through position terms being trained (T5's bias table), forward + backward on the
CPU: the sdpa backend's blocks through `TrainedTermsAttention` (each block's keys read as views of the
layer's, the softmax's weights kept) against SDPA over the blocks' gathered copies, which
runs its math kernel for a mask with a gradient and keeps the copies (what ran before). One process, the
two alternating; LSG-T5's default local pattern (block 128, one global token), T5-base's 12 heads of 64.

    python benchmarks/bench_trained_terms.py --lengths 4096 16384 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import transformers
from transformers.models.t5.modeling_t5 import T5Attention

from lsg_converter import LSGBertConfig
from lsg_converter.models import lsg_sdpa, lsg_t5_bias
from lsg_converter.models.lsg_attention import lsg_attention

HEADS, HEAD_DIM = 12, 64


def gathered_sdpa(queries, allowed, layout, runs, scaling, *tensors):
    """The blocks as before: their keys and values gathered on the autograd path, the position terms
    joined into an additive mask, then SDPA."""
    num_sequences = 2 * len(layout.padding)
    padded, position_scores = layout.padded(list(tensors[:num_sequences]), queries.dtype), tensors[num_sequences:]
    block = layout.windows[-1].step
    block_queries, keys, values = [], [], []
    for row, start, end, _ in runs:
        blocks = torch.arange(start, end)[:, None]
        block_queries.append(queries[row, start * block : end * block].unflatten(0, (-1, block)).transpose(1, 2))
        for gathered, first in ((keys, 0), (values, 1)):
            rows = [padded[2 * source + first][row][window.rows(blocks)] for source, window in zip(layout.sources, layout.windows)]
            gathered.append(torch.cat(rows, dim=1).transpose(1, 2))  # (m, K, H, D) -> (m, H, K, D)
    shape = torch.broadcast_shapes(*(terms.shape[:-1] for terms in position_scores))  # (n, H, b)
    terms = torch.cat([terms.expand(*shape, -1) for terms in position_scores], dim=-1)  # (n, H, b, K)
    mask = torch.where(allowed, terms, torch.finfo(terms.dtype).min)
    return F.scaled_dot_product_attention(torch.cat(block_queries), torch.cat(keys), torch.cat(values), attn_mask=mask, scale=scaling)


PATHS = {"window views": lsg_sdpa.TrainedTermsAttention.apply, "gathered copies (before)": gathered_sdpa}


def step(attention: T5Attention, settings, inputs: list[torch.Tensor]) -> tuple[float, float]:
    """(seconds, MiB held until the backward: inputs, output and saved tensors, each storage once)."""
    inputs = [x.detach().requires_grad_() for x in inputs]
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        terms = lsg_t5_bias.t5_position_terms(attention, global_position=0)
        output = lsg_attention(*inputs, None, settings, backend="sdpa", scaling=1.0, position_terms=terms)[0]
    for x in (*inputs, output):
        pack(x)
    output.sum().backward()
    return time.perf_counter() - start, sum(storages.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    t5 = transformers.T5Config(d_model=HEADS * HEAD_DIM, d_kv=HEAD_DIM, num_heads=HEADS)
    attention = T5Attention(t5, has_relative_attention_bias=True)
    settings = LSGBertConfig(block_size=128, sparse_block_size=0, sparsity_type="none", num_global_tokens=1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, batch 1, {HEADS} heads of {HEAD_DIM}; "
          f"median of {args.repeats} after a warm-up, the paths alternating\n")
    print("| tokens | path | fwd+bwd s | MiB held | s / before | MiB / before |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        inputs = [torch.randn(1, 1 + length, HEADS, HEAD_DIM).transpose(1, 2) for _ in range(3)]
        seconds, held = {name: [] for name in PATHS}, {}
        for repeat in range(args.repeats + 1):
            for name, path in PATHS.items():
                lsg_sdpa.TrainedTermsAttention.apply = path
                elapsed, held[name] = step(attention, settings, inputs)
                if repeat:
                    seconds[name].append(elapsed)
        lsg_sdpa.TrainedTermsAttention.apply = PATHS["window views"]
        before = statistics.median(seconds["gathered copies (before)"]), held["gathered copies (before)"]
        for name in PATHS:
            median = statistics.median(seconds[name])
            print(f"| {length} | {name} | {median:.3f} | {held[name]:.1f} | {median / before[0]:.2f} | {held[name] / before[1]:.2f} |")


if __name__ == "__main__":
    main()
