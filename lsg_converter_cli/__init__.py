"""`lsg-convert`'s front end: reads and checks the command line with the standard library alone, so
that --help, --version and every command-line mistake answer at once; torch, transformers and
lsg_converter are imported only for a run (`lsg_converter.cli.convert`).

A package of its own because importing anything under `lsg_converter` imports the package root, which
registers the LSG classes with transformers (torch and transformers: seconds).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Callable, Iterator, NoReturn, Sequence

EXAMPLES = """\
examples:
  lsg-convert bert-base-uncased --max-len 4096 --save-path bert-base-uncased-lsg-4096
  lsg-convert ./my-bert --max-len 16384 --sparsity-type pooling --sparsity-factor 4 \\
      --save-path ./my-bert-lsg-16k --overwrite
  lsg-convert facebook/bart-base --max-len 16384 --save-path bart-base-lsg-16k --push-to-hub me/bart-base-lsg-16k
  lsg-convert ./reference-lsg-checkpoint --max-len 4096 --save-path ./upgraded   # 2023 format -> new format
  lsg-convert info ./upgraded                                                    # what a model is (or: ./upgraded --info)
  lsg-convert sentence-transformers/all-MiniLM-L6-v2 --max-len 4096 --adapt-on ./my-documents \\
      --save-path ./minilm-4096-adapted                                    # one pass beats chunking

exit codes: 0 done, 1 other error, 2 invalid setting or command line, 3 unsupported model or head,
            4 source not found, 5 output exists (an earlier conversion's: use --overwrite; a file or a
            folder of other files: never replaced) or overlaps the source,
            6 corrupt or truncated source files, 7 Hub unreachable or token/repository refused,
            8 a package it needs is missing (the error names it), 9 output not writable,
            10 texts to adapt on missing or too short, 11 not enough memory for the conversion (an
            estimate made before anything is allocated: see --skip-memory-check), 130 interrupted (Ctrl-C)
"""
PROG = "lsg-convert"
INFO_COMMAND = "info"  # `lsg-convert info MODEL` is `lsg-convert MODEL --info`
USAGE_EXIT_CODE = 2
DTYPES = ("float32", "bfloat16", "float16")  # --dtype: the torch dtypes of that name
SOURCE_NOT_FOUND_EXIT_CODE = 4  # lsg_converter.errors.SourceNotFoundError's
MISSING_DEPENDENCY_EXIT_CODE = 8  # lsg_converter.errors.MissingDependencyError's
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as shells report Ctrl-C
# The library's choices, written here so that the parser needs no torch (tests/test_cli.py checks
# that they equal lsg_converter.models.lsg_sparse.SPARSITY_TYPES and lsg_converter.positions.POSITION_TILINGS).
SPARSITY_TYPES = ("none", "norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh")
POSITION_TILINGS = ("body", "table")
ADAPTED_PARTS = ("all", "positions+global", "positions", "global")  # lsg_converter.adaptation.TRAINABLE_PARTS
ADAPTATION_SOURCE_SHARE = 0.2  # lsg_converter.adaptation.adapt_to_long_documents's default source_share
ADAPTATION_OBJECTIVES = ("documents", "spans")  # lsg_converter.adaptation.OBJECTIVES, the first the default
ADAPTATION_NEGATIVES = ("any", "same-text")  # lsg_converter.adaptation.NEGATIVES, the first the default


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes get the same one-line error as every other failure, with exit code 2; a
    misspelt flag is named with the closest one, before any other mistake."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is named without its value, which may be a secret
        (`--tok hf_...`): the error shows what was typed up to the first `=` of words starting with -."""
        words = list(sys.argv[1:] if args is None else args)
        unknown = self._unknown_options(words)
        if unknown:
            self.error(self._unrecognized(unknown))
        parsed, rest = self.parse_known_args(words, namespace)
        if parsed.source == INFO_COMMAND and len(rest) == 1 and not rest[0].startswith("-"):  # `lsg-convert info MODEL`
            parsed.source, parsed.info, rest = rest[0], True, []
        if rest:
            options = [word.partition("=")[0] for word in rest if word.startswith("-")]
            hint = ": did you mean --info?" if INFO_COMMAND in rest else ""
            self.error(self._unrecognized(options) if options else f"unrecognized arguments: {' '.join(rest)}{hint}")
        return parsed

    def _unknown_options(self, words: list[str]) -> list[str]:
        """The long options (`--name`, `--name=value`) among `words` that the parser does not have,
        without their values; none after a bare `--`."""
        options = words[: words.index("--")] if "--" in words else words
        names = [word.partition("=")[0] for word in options if word.startswith("--")]
        return [name for name in names if name not in self._option_string_actions]

    def _unrecognized(self, options: list[str]) -> str:
        """'unrecognized arguments: --block-sise: did you mean --block-size?' (the hint where one is close)."""
        names = {option.lstrip("-"): option for option in self._option_string_actions}  # dashes alike in all
        closest = difflib.get_close_matches(options[0].lstrip("-"), sorted(names), n=1, cutoff=0.7)
        hint = f": did you mean {names[closest[0]]}?" if closest and len(options) == 1 else ""
        return f"unrecognized arguments: {' '.join(options)}{hint}"


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive whole number")
    return value


def _number_of_labels(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is no number of labels: give 1 or more")
    return value


def _share(zero: str) -> Callable[[str], float]:
    """The parser of a share from 0 up to 1, whose error says what 0 means (`zero`)."""

    def share(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0.0 <= value < 1.0:
            raise argparse.ArgumentTypeError(f"{value:g} is no share: give a number from 0 ({zero}) up to 1")
        return value

    return share


def _package_file(path: str) -> ModuleType:
    """A module of lsg_converter that imports nothing (`path` in the package), read from its file without
    importing the package."""
    package = importlib.util.find_spec("lsg_converter")
    name = "lsg_converter_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, Path(package.origin).parent / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_version() -> str:
    """lsg_converter's version, read from its _version.py without importing the package."""
    return _package_file("_version.py").__version__


def library_defaults() -> ModuleType:
    """The defaults of the LSG settings (lsg_converter/models/lsg_defaults.py), which the help names."""
    return _package_file("models/lsg_defaults.py")


def _on_off(value: object) -> str:
    return "on" if value else "off"


def build_parser() -> argparse.ArgumentParser:
    """The `lsg-convert` parser. Each option's dest is the name of the Python parameter it sets
    (--max-len sets max_sequence_length), which `lsg_converter.cli.flag_spelling` relies on."""
    parser = _Parser(
        prog=PROG,
        description="Convert a pretrained BERT, RoBERTa, DistilBERT, ALBERT, CamemBERT, ELECTRA, XLM-RoBERTa, MPNet, "
        "DeBERTa-v2/v3, BART, mBART (BARThez), Pegasus, T5 (v1.1, Flan-T5), mT5 or UMT5 checkpoint "
        "(or a 2023 LSG checkpoint) into an LSG model that reads long inputs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--tok` is no `--token`: a mistyped flag is refused, not guessed
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("source", help="local folder (read from disk only) or Hub model id of the model to convert")
    parser.add_argument(
        "--max-len",
        dest="max_sequence_length",
        metavar="N",
        type=_positive_int,
        help="new maximum sequence length, e.g. 4096 (required, except with --info)",
    )
    parser.add_argument(
        "--info",
        action="store_true",
        help="say what the model at SOURCE is (format, head, length, LSG settings) and exit; also: lsg-convert info SOURCE",
    )
    parser.add_argument(
        "--save-path",
        type=os.path.expanduser,
        help="output folder (default: <source name>-lsg-<max-len>; none when only pushing)",
    )
    parser.add_argument("--architecture", help="head to build, e.g. BertForMaskedLM (default: the source's)")
    defaults = library_defaults()
    lsg, conversion = defaults.LSG_DEFAULTS, defaults.CONVERSION_DEFAULTS
    settings = parser.add_argument_group("LSG settings")
    settings.add_argument(
        "--block-size", type=int,
        help="local block size (default: a third of the source's body positions, "
        f"{defaults.conversion_block_size(512)} for 512)",
    )
    settings.add_argument(
        "--sparsity-type", choices=SPARSITY_TYPES,
        help=f"sparse selection (default {conversion['sparsity_type']}: local + global only)",
    )
    settings.add_argument(
        "--sparse-block-size", type=int,
        help=f"sparse keys on each side of a block, with a --sparsity-type other than none (default {lsg['sparse_block_size']})",
    )
    settings.add_argument(
        "--sparsity-factor", type=int,
        help=f"tokens compressed into one sparse key, with a --sparsity-type other than none (default {lsg['sparsity_factor']})",
    )
    settings.add_argument(
        "--num-global-tokens", type=int,
        help=f"global tokens, 0 to {defaults.MAX_GLOBAL_TOKENS} (default {conversion['num_global_tokens']})",
    )
    settings.add_argument(
        "--position-tiling",
        choices=POSITION_TILINGS,
        default="body",
        help="beyond the source's table, repeat its body rows (default) or the whole table (2023 reference)",
    )
    settings.add_argument(
        "--pass-global-tokens-to-decoder",
        action=argparse.BooleanOptionalAction,
        help="encoder-decoder models (BART, mBART, Pegasus, T5, mT5, UMT5): the decoder attends to the encoder's "
        f"global tokens (default {_on_off(defaults.SEQ2SEQ_DEFAULTS['pass_global_tokens_to_decoder'])})",
    )
    settings.add_argument(
        "--pool-with-global",
        action=argparse.BooleanOptionalAction,
        help=f"the first token's output is global token 0's (default {_on_off(lsg['pool_with_global'])}; off for "
        "T5, mT5, UMT5)",
    )
    settings.add_argument(
        "--mask-first-token",
        action=argparse.BooleanOptionalAction,
        help=f"hide the first token as a key: it duplicates global token 0 (default {_on_off(lsg['mask_first_token'])})",
    )
    settings.add_argument(
        "--global-token-position",
        type=int,
        metavar="P",
        help="MPNet, DeBERTa, T5, mT5, UMT5: the position the global tokens have in the relative position terms "
        f"(default {defaults.RELATIVE_POSITION_DEFAULTS['global_token_position']})",
    )
    settings.add_argument(
        "--clamp-global-distances",
        action=argparse.BooleanOptionalAction,
        help="ModernBERT, GTE, NomicBERT, jina-embeddings-v3, EuroBERT: a block past the source's trained length reads "
        "the global tokens, and they read it, at a distance within that length "
        f"(default {_on_off(defaults.ROTARY_DEFAULTS['clamp_global_distances'])})",
    )
    settings.add_argument(
        "--num-labels", type=_number_of_labels, metavar="N",
        help="labels of the classification head (ForSequenceClassification, ForTokenClassification): the source's, "
        "whose classifier is replaced by a new one when it has another number, or the one --architecture builds; "
        "refused with any other head",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="save the weights in this type (default: as loaded from the source): bfloat16 halves a float32 folder",
    )
    parser.add_argument(
        "--skip-memory-check",
        action="store_true",
        help="convert even where the memory the conversion needs, estimated before anything is allocated, is more "
        "than the system has available (MemAvailable, ulimit -v, the cgroup's limit): by default refused, exit 11",
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
    adapt = parser.add_argument_group(
        "long-document adaptation (a sentence-transformers source: train it a little on your own long texts)"
    )
    adapt.add_argument(
        "--adapt-on", dest="texts", metavar="TEXTS", type=os.path.expanduser,
        help="folder of .txt / .md files (or one file) of long, unlabeled texts",
    )
    adapt.add_argument(
        "--adapt-train",
        dest="train",
        choices=ADAPTED_PARTS,
        default="all",
        help="what is trained (default: the whole model; positions+global: only the positions past the "
        "source's and the global tokens)",
    )
    adapt.add_argument(
        "--adapt-objective",
        dest="objective",
        choices=ADAPTATION_OBJECTIVES,
        default=ADAPTATION_OBJECTIVES[0],
        help="what a training passage finds: its document among the step's (default), or the span of its document "
        "where it lies among every span of the step's documents (for late-chunked span vectors, encode_spans)",
    )
    adapt.add_argument(
        "--adapt-passages", dest="passages_per_document", type=_positive_int, default=1, metavar="K",
        help="training passages per document, each a query of the step (default 1; more with --adapt-objective spans)",
    )
    adapt.add_argument(
        "--adapt-negatives",
        dest="negatives",
        choices=ADAPTATION_NEGATIVES,
        default=ADAPTATION_NEGATIVES[0],
        help="where a step's documents come from: any of your texts (default), or one text as far as it holds them "
        "(hard negatives: documents told apart by what the rest of each holds)",
    )
    adapt.add_argument(
        "--adapt-short-share", dest="short_share", type=_share("every step at --max-len"), default=0.0, metavar="S",
        help="share of the training spent first on documents of the source's own length (cheap steps that learn "
        "your texts), the rest at --max-len (default 0)",
    )
    adapt.add_argument(
        "--adapt-minutes", dest="max_minutes", type=float, default=30.0, metavar="M", help="time budget (default 30)"
    )
    adapt.add_argument(
        "--adapt-epochs", dest="epochs", type=float, default=4.0, metavar="E",
        help="times the texts are read, each cut into other documents (default 4; the time budget may stop it first)",
    )
    adapt.add_argument(
        "--adapt-batch-size", dest="batch_size", type=_positive_int, default=8, metavar="N",
        help="documents per step, each the others' negatives (default 8)",
    )
    adapt.add_argument(
        "--adapt-long-batch-size", dest="long_batch_size", type=_positive_int, metavar="N",
        help="documents per step at --max-len, where --adapt-batch-size is then the short part's (default: "
        "--adapt-batch-size): fewer buy more long steps in the same minutes",
    )
    adapt.add_argument(
        "--adapt-mini-batch-size", dest="mini_batch_size", type=_positive_int, metavar="N",
        help="hold only N documents of a step in memory at once (the cached in-batch loss: the same gradients, "
        "a little more time), for a long --max-len or a large --adapt-batch-size (default: the whole step)",
    )
    adapt.add_argument(
        "--adapt-bf16", dest="bf16", action="store_true",
        help="train in bfloat16 mixed precision: faster on CPUs with AVX512-BF16 or AMX and recent GPUs",
    )
    adapt.add_argument(
        "--adapt-source-share", dest="source_share", type=_share("the trained weights"), default=ADAPTATION_SOURCE_SHARE, metavar="S",
        help="after training, move the weights this share of the way back to the converted ones: short texts "
        f"stay nearer the source's embedding (default {ADAPTATION_SOURCE_SHARE:g}; 0: the trained weights)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier conversion's output (a folder holding a model's config.json); a file or a "
        "folder of anything else is never replaced",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


class Interruption:
    """Ctrl-C (SIGINT) during a run: a KeyboardInterrupt while the run can still stop with nothing
    written, and a note once what it writes is complete (the run then ends as done).

    `received` also keeps a Ctrl-C whose KeyboardInterrupt some library caught: `stop_if_received`
    raises it again before anything is written."""

    def __init__(self) -> None:
        self.received = False
        self.stops_the_run = True

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        if self.stops_the_run:
            raise KeyboardInterrupt

    @contextmanager
    def handled(self, ignored_after: bool = False) -> Iterator["Interruption"]:
        """SIGINT goes to this object for the time of the block; after it, the previous handler comes
        back, or, with `ignored_after`, SIGINT is ignored (the run's exit code is decided)."""
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN if ignored_after else previous)

    def stop_if_received(self) -> None:
        """KeyboardInterrupt if a Ctrl-C came (its first KeyboardInterrupt may have been caught by a library)."""
        if self.received:
            raise KeyboardInterrupt

    def outlived(self) -> None:
        """What the run writes is complete: a Ctrl-C from now on is noted and the run ends as done."""
        self.stops_the_run = False


def missing_local_source(source: str) -> str | None:
    """The error line for a source spelt as a path ("./model", "/data/model", "~/model", "a/b/c") where
    nothing is on disk; None for an existing path or a name that may be a Hub id ("owner/name")."""
    path = Path(source).expanduser()
    spelt_as_path = source.startswith((".", "/", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source)
    if not spelt_as_path or path.exists():
        return None
    return f"No folder at {source!r}: give an existing model folder or a Hub model id."


def main(argv: Sequence[str] | None = None, late_interrupts_ignored: bool = False) -> int:
    """Run the CLI; returns the exit code (0 on success). Ctrl-C at any moment, the imports included,
    ends it with one line and exit code 130 (see `Interruption`). With `late_interrupts_ignored` (the
    command, see `console_main`), a Ctrl-C after the run has returned its code is ignored."""
    interruption = Interruption()
    debug = False
    try:
        with interruption.handled(ignored_after=late_interrupts_ignored):
            parser = build_parser()
            try:
                args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
                if args.max_sequence_length is None and not args.info:
                    if args.source == INFO_COMMAND and not Path(INFO_COMMAND).exists():
                        parser.error(f"{INFO_COMMAND} needs the model to describe: {PROG} {INFO_COMMAND} MODEL")
                    parser.error("the following arguments are required: --max-len")
                if args.objective != "spans" and args.passages_per_document > 1:
                    parser.error("--adapt-passages above 1 needs --adapt-objective spans")
                if args.objective == "spans" and args.mini_batch_size is not None:
                    parser.error("--adapt-objective spans has no cached loss: leave --adapt-mini-batch-size out")
            except SystemExit as done:  # --help, --version, or a command-line mistake already reported on one line
                return int(done.code or 0)
            debug = args.debug
            missing = missing_local_source(args.source)
            if missing:  # said before the (slow) import of torch
                print(f"{PROG}: error: {missing}", file=sys.stderr)
                return SOURCE_NOT_FOUND_EXIT_CODE
            try:
                from lsg_converter.cli import convert
            except ImportError as error:  # torch, transformers, ... missing or broken
                if debug:
                    raise
                package = (error.name or "lsg-converter").split(".")[0].replace("_", "-")
                print(f"{PROG}: error: {' '.join(str(error).split())}: pip install -U {package}", file=sys.stderr)
                return MISSING_DEPENDENCY_EXIT_CODE

            if args.info:
                return show_info(args)
            return convert(parser, args, interruption)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


def show_info(args: argparse.Namespace) -> int:
    """`--info`: print what the model at args.source is (lsg_converter.info.describe); an error in one line."""
    from lsg_converter.errors import LSGError, one_line
    from lsg_converter.info import describe

    try:
        print(describe(args.source, args.token))
    except LSGError as error:
        if args.debug:
            raise
        print(f"{PROG}: error: {one_line(error)}", file=sys.stderr)
        return error.exit_code
    return 0


def console_main() -> NoReturn:
    """The ``lsg-convert`` command: exit with `main`'s code. A Ctrl-C once the run has decided it (while
    the interpreter shuts down, which takes a moment after torch) does not turn a finished run into 130."""
    sys.exit(main(late_interrupts_ignored=True))
