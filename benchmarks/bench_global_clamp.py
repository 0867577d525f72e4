"""What the clamp of the global tokens' distances costs (`clamp_global_distances`, issue 66): LSG-ModernBERT with
the clamp on (the default) against the same model with it off, side by side in one run, forward and training step.

    python benchmarks/bench_global_clamp.py                                  # tiny and wide, 16,384 tokens
    python benchmarks/bench_global_clamp.py --sizes wide --lengths 16384 32768 --repeats 5
    python benchmarks/bench_global_clamp.py --quick                          # smoke test, seconds

Both models are one conversion of the same randomly initialised ModernBERT (8,192 positions, the conversion
defaults: blocks of 2,730 tokens in the full-attention layers, one global token), to the longest length of the
run; past 8,192 tokens the clamp moves the global keys of every later block. Each length and step alternates the
two models ``--repeats`` times after one untimed call of each, and reports the median wall-clock times and their
ratio (clamp on / off; 1 = no cost).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_modernbert import SHARED, SIZES, TOKEN_IDS_BELOW, VOCAB  # noqa: E402
from encoder_steps import step_function  # noqa: E402

from lsg_converter import LSGConverter  # noqa: E402

BENCH_SIZES = {"tiny": SIZES["tiny"], "wide": {**SIZES["base"], "num_hidden_layers": 3}}  # wide: base's width, 3 layers
STEPS = {"forward": "forward", "train": "fwd+bwd"}


def clamped_and_unclamped(size: str, max_length: int, folder: Path) -> dict[bool, torch.nn.Module]:
    """{clamp_global_distances: the converted model} of one random ModernBERT of `size`."""
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(vocab_size=VOCAB, **SHARED, **BENCH_SIZES[size])
    transformers.ModernBertModel(config).save_pretrained(folder)
    converter = LSGConverter(max_sequence_length=max_length)
    return {clamp: converter.convert_from_pretrained(str(folder), clamp_global_distances=clamp)[0] for clamp in (True, False)}


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(BENCH_SIZES), default=["tiny", "wide"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny, 9,000 tokens, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.lengths, args.repeats = ["tiny"], [9000], 1
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"median of {args.repeats} alternating calls after one untimed call each")  # fmt: skip
    print("\n| size | tokens | step | clamp on s | clamp off s | on / off |\n|---|---|---|---|---|---|")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            models = clamped_and_unclamped(size, max(args.lengths), Path(folder))
            for length in args.lengths:
                for step, label in STEPS.items():
                    calls = {clamp: step_function(model, length, step, TOKEN_IDS_BELOW) for clamp, model in models.items()}
                    for call in calls.values():
                        call()
                    times: dict[bool, list[float]] = {True: [], False: []}
                    for _ in range(args.repeats):
                        for clamp, call in calls.items():
                            times[clamp].append(timed(call))
                    on, off = (statistics.median(times[clamp]) for clamp in (True, False))
                    print(f"| {size} | {length:,} | {label} | {on:.3f} | {off:.3f} | {on / off:.2f} |", flush=True)


if __name__ == "__main__":
    main()
