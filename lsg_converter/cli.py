"""`lsg-convert`: convert a checkpoint to LSG from the command line (a thin layer over LSGConverter)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from transformers.utils import logging

EXAMPLES = """\
examples:
  lsg-convert bert-base-uncased --max-len 4096 --save-path bert-base-uncased-lsg-4096
  lsg-convert ./my-bert --max-len 16384 --block-size 256 --sparsity-type pooling --sparsity-factor 4 \\
      --save-path ./my-bert-lsg-16k --overwrite
  lsg-convert facebook/bart-base --max-len 16384 --save-path bart-base-lsg-16k

exit codes: 0 done, 1 other error, 2 source not found, 3 unsupported model,
            4 invalid setting, 5 output folder exists (use --overwrite)
"""


def build_parser() -> argparse.ArgumentParser:
    from .models.lsg_attention import SPARSITY_TYPES

    parser = argparse.ArgumentParser(
        prog="lsg-convert",
        description="Convert a pretrained BERT, RoBERTa, DistilBERT or BART checkpoint into an LSG model that reads long inputs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="Hub model id or local folder of the model to convert")
    parser.add_argument("--max-len", type=int, required=True, help="new maximum sequence length, e.g. 4096")
    parser.add_argument("--save-path", help="output folder (default: <source name>-lsg-<max-len>)")
    parser.add_argument("--architecture", help="head to build, e.g. BertForMaskedLM (default: the source's)")
    parser.add_argument("--block-size", type=int, help="local block size (default 128)")
    parser.add_argument("--sparse-block-size", type=int, help="sparse keys on each side of a block (default 128)")
    parser.add_argument("--sparsity-factor", type=int, help="sparse compression factor (default 2)")
    parser.add_argument("--sparsity-type", choices=SPARSITY_TYPES, help="sparse selection (default norm)")
    parser.add_argument("--num-global-tokens", type=int, help="global tokens, 0 to 512 (default 1)")
    parser.add_argument(
        "--pass-global-tokens-to-decoder",
        action=argparse.BooleanOptionalAction,
        help="BART: let the decoder attend to the encoder's global tokens (default on)",
    )
    parser.add_argument("--seed", type=int, default=123, help="seed of the conversion's random draws (default 123)")
    parser.add_argument("--random-global-init", action="store_true", help="draw global tokens at random")
    parser.add_argument("--token", help="Hugging Face Hub token for private sources")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    parser.add_argument("--quiet", action="store_true", help="print errors only")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 on success)."""
    args = build_parser().parse_args(argv)
    if args.quiet:
        logging.set_verbosity_error()
        logging.disable_progress_bar()
    from . import LSGConverter, LSGError, save_converted
    from .converter import check_output_folder

    lsg_kwargs = {
        key: value
        for key, value in {
            "block_size": args.block_size,
            "sparse_block_size": args.sparse_block_size,
            "sparsity_factor": args.sparsity_factor,
            "sparsity_type": args.sparsity_type,
            "num_global_tokens": args.num_global_tokens,
            "pass_global_tokens_to_decoder": args.pass_global_tokens_to_decoder,
        }.items()
        if value is not None
    }
    save_path = args.save_path or f"{args.source.rstrip('/').split('/')[-1]}-lsg-{args.max_len}"
    try:
        converter = LSGConverter(
            max_sequence_length=args.max_len, random_global_init=args.random_global_init, seed=args.seed
        )
        check_output_folder(save_path, args.overwrite)  # refuse before the (long) conversion, not after it
        model, tokenizer = converter.convert_from_pretrained(
            args.source, architecture=args.architecture, token=args.token, **lsg_kwargs
        )
        target = save_converted(model, tokenizer, save_path, overwrite=args.overwrite)
    except LSGError as error:
        if args.debug:
            raise
        print(f"lsg-convert: error: {' '.join(str(error).split())}", file=sys.stderr)
        return error.exit_code
    if not args.quiet:
        print(f"Saved {type(model).__name__} ({args.max_len} tokens) to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
