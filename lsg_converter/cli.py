"""`lsg-convert`: convert a checkpoint to LSG from the command line (a thin layer over LSGConverter)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import NoReturn, Sequence

from tqdm.auto import tqdm
from transformers.utils import logging

EXAMPLES = """\
examples:
  lsg-convert bert-base-uncased --max-len 4096 --save-path bert-base-uncased-lsg-4096
  lsg-convert ./my-bert --max-len 16384 --sparsity-type pooling --sparsity-factor 4 \\
      --save-path ./my-bert-lsg-16k --overwrite
  lsg-convert facebook/bart-base --max-len 16384 --save-path bart-base-lsg-16k --push-to-hub me/bart-base-lsg-16k
  lsg-convert ./reference-lsg-checkpoint --max-len 4096 --save-path ./upgraded   # 2023 format -> new format

exit codes: 0 done, 1 other error, 2 invalid setting or command line, 3 unsupported model or head,
            4 source not found, 5 output folder exists (use --overwrite),
            6 corrupt or truncated source files, 7 Hub unreachable or token/repository refused
"""
USAGE_EXIT_CODE = 2


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes get the same one-line error as every other failure, with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of tokens")
    return value


def build_parser() -> argparse.ArgumentParser:
    from .converter import POSITION_TILINGS
    from .models.lsg_attention import SPARSITY_TYPES

    parser = _Parser(
        prog="lsg-convert",
        description="Convert a pretrained BERT, RoBERTa, DistilBERT, ALBERT, CamemBERT, ELECTRA, XLM-RoBERTa, BART, "
        "mBART (BARThez) or Pegasus checkpoint (or a 2023 LSG checkpoint) "
        "into an LSG model that reads long inputs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="Hub model id or local folder of the model to convert")
    parser.add_argument("--max-len", type=_positive_int, required=True, help="new maximum sequence length, e.g. 4096")
    parser.add_argument(
        "--save-path", help="output folder (default: <source name>-lsg-<max-len>; none when only pushing)"
    )
    parser.add_argument("--architecture", help="head to build, e.g. BertForMaskedLM (default: the source's)")
    settings = parser.add_argument_group("LSG settings")
    settings.add_argument(
        "--block-size", type=int, help="local block size (default: a third of the source's body positions, 170 for 512)"
    )
    settings.add_argument(
        "--sparsity-type", choices=SPARSITY_TYPES, help="sparse selection (default none: local + global only)"
    )
    settings.add_argument("--sparse-block-size", type=int, help="sparse keys on each side of a block (default 128)")
    settings.add_argument("--sparsity-factor", type=int, help="sparse compression factor (default 2)")
    settings.add_argument("--num-global-tokens", type=int, help="global tokens, 0 to 512 (default 1)")
    settings.add_argument(
        "--position-tiling",
        choices=POSITION_TILINGS,
        default="body",
        help="beyond the source's table, repeat its body rows (default) or the whole table (2023 reference)",
    )
    settings.add_argument(
        "--pass-global-tokens-to-decoder",
        action=argparse.BooleanOptionalAction,
        help="BART: let the decoder attend to the encoder's global tokens (default on)",
    )
    tokens = parser.add_argument_group("global tokens")
    tokens.add_argument("--seed", type=int, default=123, help="seed of the conversion's random draws (default 123)")
    tokens.add_argument("--random-global-init", action="store_true", help="draw global tokens at random")
    tokens.add_argument("--resize-lsg", action="store_true", help="LSG source: only resize the positions")
    tokens.add_argument(
        "--keep-first-global-token", action="store_true", help="LSG source: keep global 0, initialise the others"
    )
    tokens.add_argument(
        "--reinit-global-tokens", action="store_true", help="LSG source: initialise all global tokens afresh"
    )
    hub = parser.add_argument_group("Hugging Face Hub")
    hub.add_argument("--push-to-hub", metavar="REPO", help="push the converted model to this Hub repository")
    hub.add_argument("--private", action="store_true", help="create the Hub repository as private")
    hub.add_argument("--commit-message", help="message of the Hub commit")
    hub.add_argument("--token", help="Hugging Face token (private sources, pushing)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    parser.add_argument("--quiet", action="store_true", help="print errors only")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 on success)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a command-line mistake already reported on one line
        return int(done.code or 0)
    if args.quiet:
        logging.set_verbosity_error()
    if args.quiet or not sys.stderr.isatty():  # bars for people at a terminal, clean logs elsewhere
        logging.disable_progress_bar()
    from . import LSGConverter, LSGError, model_card, push_converted, save_converted
    from .converter import check_output_folder
    from .errors import one_line
    from .hub import source_license
    from .sbert import pipeline_of

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
    save_path = args.save_path
    if save_path is None and not args.push_to_hub:
        save_path = f"{args.source.rstrip('/').split('/')[-1]}-lsg-{args.max_len}"
    stages = ["load and convert"] + (["save"] if save_path else []) + (["push"] if args.push_to_hub else [])
    progress = tqdm(total=len(stages), desc=stages[0], unit="step", disable=True if args.quiet else None, file=sys.stderr)
    try:
        converter = LSGConverter(
            max_sequence_length=args.max_len,
            position_tiling=args.position_tiling,
            random_global_init=args.random_global_init,
            keep_first_global_token=args.keep_first_global_token,
            resize_lsg=args.resize_lsg,
            reinit_global_tokens=args.reinit_global_tokens,
            seed=args.seed,
        )
        if save_path:
            check_output_folder(save_path, args.overwrite)  # refuse before the (long) conversion, not after it
        model, tokenizer = converter.convert_from_pretrained(
            args.source, architecture=args.architecture, token=args.token, **lsg_kwargs
        )
        card = model_card(
            model,
            args.push_to_hub,
            command="lsg-convert " + shlex.join(_without_token(argv)),
            license=source_license(args.source, args.token),
        )
        target = None
        if save_path:
            _advance(progress, "save")
            target = save_converted(model, tokenizer, save_path, overwrite=args.overwrite, card=card)
        if args.push_to_hub:
            _advance(progress, "push")
            url = push_converted(
                model,
                tokenizer,
                args.push_to_hub,
                private=args.private,
                token=args.token,
                commit_message=args.commit_message,
                card=card,
                folder=target,
            )
        progress.update()
    except LSGError as error:
        progress.close()
        if args.debug:
            raise
        print(f"lsg-convert: error: {one_line(error)}", file=sys.stderr)
        return error.exit_code
    progress.close()
    if not args.quiet:
        if target:
            print(f"Saved {type(model).__name__} ({args.max_len} tokens) to {target}")
        if args.push_to_hub:
            print(f"Pushed to {args.push_to_hub}: {url}")
        if pipeline_of(model) is not None:
            location = str(target or args.push_to_hub)
            print(f"Load it with sentence-transformers: SentenceTransformer({location!r}, trust_remote_code=True)")
    return 0


def _advance(progress: tqdm, stage: str) -> None:
    progress.update()
    progress.set_description(stage)


def _without_token(argv: list[str]) -> list[str]:
    """The command line for the model card, with the value of --token hidden."""
    shown = []
    for previous, word in zip([""] + argv, argv):
        if previous == "--token":
            word = "***"
        elif word.startswith("--token="):
            word = "--token=***"
        shown.append(word)
    return shown


if __name__ == "__main__":
    sys.exit(main())
