"""What the flex_attention backend's mask terms cost: a forward of LSG-BERT (BERT-base dimensions) through
compiled flex_attention, per way its mask_mod reads the keys' validity and DropKey's choice.

    python benchmarks/bench_flex_masks.py                          # CPU: 4,096 tokens, batch 2, 2 layers
    python benchmarks/bench_flex_masks.py --num-global 0 7 --sparsity norm
    PYTHONPATH=/path/to/another/checkout python benchmarks/bench_flex_masks.py   # that tree's lsg_converter

Inputs (the second row of a batch of 2): ``unpadded`` (no key masked: the pattern's rule alone, or, with
sparse keys that may be empty, the rows' bounds), ``right padded`` (its last quarter: the rows' bounds),
``hole`` (100 tokens masked in the middle: each key's validity) and ``dropkey`` (unpadded, train mode
without gradients: DropKey's choice). Settings: ``none``, local blocks of 170 (the defaults); ``norm``,
blocks of 128, sparse blocks of 128, factor 2. Each case runs twice to compile and warm up, then
``--repeats`` times; the median seconds are printed, and a line where a call fell back to sdpa.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lsg_converter import LSGBertConfig, LSGBertModel
from lsg_converter.models import lsg_flex

SETTINGS = {
    "none": {"sparsity_type": "none", "block_size": 170, "sparse_block_size": 0},
    "norm": {"sparsity_type": "norm", "block_size": 128, "sparse_block_size": 128, "sparsity_factor": 2},
}
INPUTS = ("unpadded", "right padded", "hole", "dropkey")


def report_fallbacks() -> None:
    """Prints a line whenever compiled flex_attention cannot take a call (the call then runs sdpa)."""
    unavailable = lsg_flex._unavailable

    def reported(reason: str, error: Exception):
        print(f"fell back to sdpa: {reason}", flush=True)
        return unavailable(reason, error)

    lsg_flex._unavailable = reported


def attention_mask(name: str, length: int) -> torch.Tensor:
    mask = torch.ones(2, length, dtype=torch.long)
    if name == "right padded":
        mask[1, 3 * length // 4 :] = 0
    elif name == "hole":
        mask[1, length // 4 : length // 4 + 100] = 0
    return mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sparsity", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--num-global", nargs="+", type=int, default=[1])
    args = parser.parse_args()
    report_fallbacks()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.length} tokens, batch 2, {args.layers} layers\n")
    print("| sparsity | global tokens | input | median s |\n|---|---|---|---|")
    input_ids = torch.randint(5, 30000, (2, args.length), generator=torch.Generator().manual_seed(0))
    for sparsity in args.sparsity:
        for num_global in args.num_global:
            torch.manual_seed(0)
            config = LSGBertConfig(
                hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=args.layers,
                max_position_embeddings=args.length + 2, num_global_tokens=num_global, attention_probs_dropout_prob=0.1,
                attn_implementation="flex_attention", **SETTINGS[sparsity],
            )  # fmt: skip
            model = LSGBertModel(config)
            for name in INPUTS:
                mask = attention_mask(name, args.length)
                model.train(name == "dropkey")
                seconds = []
                with torch.no_grad():
                    for repeat in range(2 + args.repeats):
                        start = time.perf_counter()
                        model(input_ids=input_ids, attention_mask=mask)
                        if repeat >= 2:
                            seconds.append(time.perf_counter() - start)
                print(f"| {sparsity} | {num_global} | {name} | {statistics.median(seconds):.3f} |", flush=True)


if __name__ == "__main__":
    main()
