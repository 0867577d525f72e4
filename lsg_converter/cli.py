"""`lsg-convert`: convert a checkpoint to LSG from the command line (a thin layer over LSGConverter)."""

from __future__ import annotations

import argparse
import logging as pylogging
import re
import shlex
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn, Sequence

from huggingface_hub.utils import logging as hub_logging
from tqdm.auto import tqdm
from transformers.utils import logging

from .errors import one_line

EXAMPLES = """\
examples:
  lsg-convert bert-base-uncased --max-len 4096 --save-path bert-base-uncased-lsg-4096
  lsg-convert ./my-bert --max-len 16384 --sparsity-type pooling --sparsity-factor 4 \\
      --save-path ./my-bert-lsg-16k --overwrite
  lsg-convert facebook/bart-base --max-len 16384 --save-path bart-base-lsg-16k --push-to-hub me/bart-base-lsg-16k
  lsg-convert ./reference-lsg-checkpoint --max-len 4096 --save-path ./upgraded   # 2023 format -> new format

exit codes: 0 done, 1 other error, 2 invalid setting or command line, 3 unsupported model or head,
            4 source not found, 5 output folder exists (use --overwrite),
            6 corrupt or truncated source files, 7 Hub unreachable or token/repository refused,
            130 interrupted (Ctrl-C)
"""
USAGE_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as shells report Ctrl-C
# Options left out of the command recorded in the model card: a credential, and display settings.
NOT_RECORDED = ("help", "token", "quiet", "debug")


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes get the same one-line error as every other failure, with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is named without its value, which may be a secret
        (`--tok hf_...`): the error shows what was typed up to the first `=` of words starting with -."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            options = [word.partition("=")[0] for word in unknown if word.startswith("-")]
            self.error(f"unrecognized arguments: {' '.join(options or unknown)}")
        return parsed


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of tokens")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `lsg-convert` parser. Each option's dest is the name of the Python parameter it sets
    (--max-len sets max_sequence_length), which `flag_spelling` relies on."""
    from .positions import POSITION_TILINGS
    from .models.lsg_sparse import SPARSITY_TYPES

    parser = _Parser(
        prog="lsg-convert",
        description="Convert a pretrained BERT, RoBERTa, DistilBERT, ALBERT, CamemBERT, ELECTRA, XLM-RoBERTa, BART, "
        "mBART (BARThez) or Pegasus checkpoint (or a 2023 LSG checkpoint) "
        "into an LSG model that reads long inputs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--tok` is no `--token`: a mistyped flag is refused, not guessed
    )
    parser.add_argument("source", help="local folder (read from disk only) or Hub model id of the model to convert")
    parser.add_argument(
        "--max-len",
        dest="max_sequence_length",
        metavar="N",
        type=_positive_int,
        required=True,
        help="new maximum sequence length, e.g. 4096",
    )
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
    hub.add_argument(
        "--token", help="Hugging Face token for private sources and pushing (default: HF_TOKEN or the saved login)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 on success)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as done:  # --help, or a command-line mistake already reported on one line
        return int(done.code or 0)
    try:
        with _console_output(parser, args.quiet):
            return _convert(parser, args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


def _convert(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from . import LSGConverter, LSGError, model_card, push_converted, save_converted
    from .card import default_folder_name
    from .push import check_can_push
    from .saving import check_output_folder
    from .sbert import pipeline_of
    from .sources import source_license

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
        save_path = default_folder_name(args.source, args.max_sequence_length)
    stages = ["load and convert"] + (["save"] if save_path else []) + (["push"] if args.push_to_hub else [])
    progress = tqdm(total=len(stages), desc=stages[0], unit="step", disable=True if args.quiet else None, file=sys.stderr)
    try:
        converter = LSGConverter(
            max_sequence_length=args.max_sequence_length,
            position_tiling=args.position_tiling,
            random_global_init=args.random_global_init,
            keep_first_global_token=args.keep_first_global_token,
            resize_lsg=args.resize_lsg,
            reinit_global_tokens=args.reinit_global_tokens,
            seed=args.seed,
        )
        # refuse before the (long) conversion what would fail after it
        if save_path:
            check_output_folder(save_path, args.overwrite)
        else:
            check_can_push(args.push_to_hub, args.token)
        model, tokenizer = converter.convert_from_pretrained(
            args.source, architecture=args.architecture, token=args.token, **lsg_kwargs
        )
        card = model_card(
            model,
            args.push_to_hub,
            command=recorded_command(parser, args),
            license=source_license(args.source, args.token),
            save_path=save_path,
            has_tokenizer=tokenizer is not None,
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
        if args.debug:
            raise
        print(f"{parser.prog}: error: {flag_spelling(parser, one_line(error))}", file=sys.stderr)
        return error.exit_code
    finally:
        progress.close()
    if not args.quiet:
        if target:
            print(f"Saved {type(model).__name__} ({args.max_sequence_length} tokens) to {target}")
        if args.push_to_hub:
            print(f"Pushed to {args.push_to_hub}: {url}")
        if pipeline_of(model) is not None:
            location = str(target or args.push_to_hub)
            print(f"Load it with sentence-transformers: SentenceTransformer({location!r}, trust_remote_code=True)")
    return 0


def flag_spelling(parser: argparse.ArgumentParser, message: str) -> str:
    """`message` as a CLI user should read it: each parameter written the library's way (`name=`,
    `name=value`) that has a flag becomes the flag (`--flag`, `--flag value`; `--no-flag` or "no
    --flag" for `name=False`). The parameters and flags are the parser's own options."""
    options = {action.dest: action for action in parser._actions if action.option_strings and action.dest != "help"}
    spelling = re.compile(r"(?<![\w.])(%s)=('[^']*'|\"[^\"]*\"|[\w.+-]*\w)?" % "|".join(map(re.escape, options)))

    def as_flag(match: re.Match) -> str:
        action, value = options[match[1]], match[2]
        flag = action.option_strings[0]
        if action.nargs == 0:
            return _switch(action, value != "False")
        if not value:
            return flag
        quoted = value[0] in "'\""
        return f"{flag} {shlex.quote(value[1:-1]) if quoted else value}"

    return spelling.sub(as_flag, message)


def recorded_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command the model card records, built from the parsed options, never from the typed text:
    the options given (those that differ from their default) in the parser's order, the source and
    --save-path named by their folder's name, no credential (--token) and no display setting."""
    from .card import saved_folder_name
    from .sources import source_name

    words = [parser.prog, source_name(args.source)]
    for action in parser._actions:
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or action.dest in NOT_RECORDED or value == action.default:
            continue
        if action.nargs == 0:
            words.append(_switch(action, bool(value)))
        else:
            words += [action.option_strings[0], saved_folder_name(value) if action.dest == "save_path" else str(value)]
    return shlex.join(words)


def _switch(action: argparse.Action, on: bool) -> str:
    """How a switch (--flag, or --flag/--no-flag) is written on or off: "no --flag" when it has no --no- form."""
    if on:
        return action.option_strings[0]
    return action.option_strings[1] if len(action.option_strings) > 1 else f"no {action.option_strings[0]}"


class _FlagSpellingFormatter(pylogging.Formatter):
    """Library warnings as `lsg-convert: warning: ...`, in the CLI's flag spelling."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser

    def format(self, record: pylogging.LogRecord) -> str:
        level = record.levelname.lower()
        return f"{self.parser.prog}: {level}: {flag_spelling(self.parser, one_line(record.getMessage()))}"


@contextmanager
def _console_output(parser: argparse.ArgumentParser, quiet: bool) -> Iterator[None]:
    """What the run prints besides its result, for the time of the run.

    lsg_converter's warnings go to stderr on one line each, in flag spelling. With `quiet`, nothing but
    errors: no warnings or logs from lsg_converter, transformers or huggingface_hub, no Python warnings,
    no progress bars. Progress bars otherwise only at a terminal."""
    library_logger = pylogging.getLogger("lsg_converter")
    handler = pylogging.StreamHandler(sys.stderr)
    handler.setFormatter(_FlagSpellingFormatter(parser))
    saved = (
        library_logger.level,
        library_logger.propagate,
        logging.get_verbosity(),
        hub_logging.get_verbosity(),
        logging.is_progress_bar_enabled(),
    )
    library_logger.addHandler(handler)
    library_logger.propagate = False
    with warnings.catch_warnings():
        if quiet:
            library_logger.setLevel(pylogging.ERROR)
            logging.set_verbosity_error()
            hub_logging.set_verbosity_error()
            warnings.simplefilter("ignore")
        if quiet or not sys.stderr.isatty():
            logging.disable_progress_bar()
        try:
            yield
        finally:
            library_logger.removeHandler(handler)
            library_logger.setLevel(saved[0])
            library_logger.propagate = saved[1]
            logging.set_verbosity(saved[2])
            hub_logging.set_verbosity(saved[3])
            if saved[4]:
                logging.enable_progress_bar()


def _advance(progress: tqdm, stage: str) -> None:
    progress.update()
    progress.set_description(stage)


if __name__ == "__main__":
    sys.exit(main())
