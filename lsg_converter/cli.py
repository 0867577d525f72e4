"""`lsg-convert`'s run: the conversion a parsed command line asks for (a thin layer over LSGConverter),
its messages in flag spelling. The command line itself is read by `lsg_converter_cli`, before torch
and transformers are imported."""

from __future__ import annotations

import argparse
import logging as pylogging
import re
import shlex
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from huggingface_hub.utils import logging as hub_logging
from tqdm.auto import tqdm
from transformers.utils import logging

from lsg_converter_cli import Interruption

from .errors import OutputExistsError, one_line

# Options left out of the command recorded in the model card: a credential, display settings, and the
# memory check (the machine's, not the model's).
NOT_RECORDED = ("help", "version", "token", "quiet", "debug", "skip_memory_check")
# Options whose value is a path, recorded as a card names paths (`card.card_path`).
PATH_OPTIONS = ("save_path", "texts")


def convert(parser: argparse.ArgumentParser, args: argparse.Namespace, interruption: Interruption) -> int:
    """Run the conversion `args` (parsed by `parser`) asks for; returns the exit code (0 on success).
    Ctrl-C stops it with a KeyboardInterrupt until what it writes is complete (see `Interruption`)."""
    with _console_output(parser, args.quiet):
        return _convert(parser, args, interruption)


def _convert(parser: argparse.ArgumentParser, args: argparse.Namespace, interruption: Interruption) -> int:
    import torch

    from . import LSGConverter, LSGError, MissingDependencyError, model_card, push_converted
    from .errors import missing_package
    from .card import default_folder_name
    from .push import check_can_push
    from .sbert import pipeline_of
    from .sources import limit_hub_waits, source_license

    limit_hub_waits()
    lsg_kwargs = _lsg_settings(args)
    save_path = args.save_path
    if save_path is None and not args.push_to_hub:
        save_path = default_folder_name(args.source, args.max_sequence_length)
    stages = (
        ["load and convert"] + (["adapt"] if args.texts else []) + (["save"] if save_path else [])
        + (["push"] if args.push_to_hub else [])
    )
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
            skip_memory_check=args.skip_memory_check,
        )
        # refuse before the (long) conversion what would fail after it
        if args.texts:  # sentence-transformers' trainer (imported only to adapt) needs accelerate and datasets
            from .adaptation import adapt_converted_model, check_can_adapt, read_texts

            read_texts(args.texts)
            check_can_adapt(args.source, args.token, args.architecture)
        if save_path:
            _check_output_folder(args, save_path, lsg_kwargs)
        else:
            check_can_push(args.push_to_hub, args.token)
        model, tokenizer = converter.convert_from_pretrained(
            args.source, architecture=args.architecture, token=args.token, **lsg_kwargs
        )
        if args.texts:
            _advance(progress, "adapt")
            adapt_converted_model(
                model, tokenizer, args.texts, train=args.train, max_minutes=args.max_minutes, epochs=args.epochs,
                batch_size=args.batch_size, long_batch_size=args.long_batch_size, mini_batch_size=args.mini_batch_size,
                bf16=args.bf16,
                source_share=args.source_share, objective=args.objective, passages_per_document=args.passages_per_document,
                negatives=args.negatives, short_share=args.short_share, seed=args.seed,
            )
        if args.dtype:
            model = model.to(getattr(torch, args.dtype))
        card = model_card(
            model,
            args.push_to_hub,
            command=recorded_command(parser, args),
            license=source_license(args.source, args.token),  # the record the conversion looked up
            save_path=save_path,
            has_tokenizer=tokenizer is not None,
        )
        target = None
        if save_path:
            _warn_of_position_tables(model, save_path)
            _advance(progress, "save")
            interruption.stop_if_received()
            target = _save(model, tokenizer, save_path, args.overwrite, card, interruption, last=not args.push_to_hub)
        if args.push_to_hub:
            _advance(progress, "push")
            interruption.stop_if_received()
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
        interruption.outlived()
        progress.update()
    except LSGError as error:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {flag_spelling(parser, one_line(error))}", file=sys.stderr)
        return error.exit_code
    except ImportError as error:  # a package that a library needs only when it runs
        if args.debug:
            raise
        print(f"{parser.prog}: error: {one_line(missing_package(error))}", file=sys.stderr)
        return MissingDependencyError.exit_code
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


def _save(
    model: Any, tokenizer: Any, save_path: str, overwrite: bool, card: Any, interruption: Interruption, last: bool
) -> Path:
    """save_converted(...); once the folder is in place (the save's last step renames it there) a Ctrl-C
    no longer stops the run when the save is its `last` step: the folder is complete, the run is done."""
    from .saving import save_converted

    target = Path(save_path).resolve()
    before = _folder_identity(target)
    try:
        saved = save_converted(model, tokenizer, target, overwrite=overwrite, card=card)
        if last:
            interruption.outlived()
    except KeyboardInterrupt:
        if not last or _folder_identity(target) in (None, before):
            raise
        interruption.outlived()
        saved = target
    return saved


def _warn_of_position_tables(model: Any, save_path: str) -> None:
    """A warning before the save where the position tables are most of what it writes (a very long --max-len):
    'Writing 1.6 GB of weights to <folder>, 1.5 GB of them position tables for 1,000,000 tokens'."""
    from .architectures import max_length_of
    from .saving import readable_size, weights_size

    total, positions = weights_size(model)
    if positions * 2 > total:
        logging.get_logger("lsg_converter").warning(
            f"Writing {readable_size(total)} of weights to {Path(save_path).resolve()}, {readable_size(positions)} "
            f"of them position tables for {max_length_of(model):,} tokens: a smaller --max-len makes it smaller."
        )


def _folder_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the folder at `path`, None when there is none: the save renames a new folder there."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _lsg_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LSG settings given on the command line, as convert_from_pretrained's keyword arguments."""
    settings = {
        "block_size": args.block_size,
        "sparse_block_size": args.sparse_block_size,
        "sparsity_factor": args.sparsity_factor,
        "sparsity_type": args.sparsity_type,
        "num_global_tokens": args.num_global_tokens,
        "pass_global_tokens_to_decoder": args.pass_global_tokens_to_decoder,
        "pool_with_global": args.pool_with_global,
        "mask_first_token": args.mask_first_token,
        "global_token_position": args.global_token_position,
        "clamp_global_distances": args.clamp_global_distances,
        "num_labels": args.num_labels,
    }
    return {key: value for key, value in settings.items() if value is not None}


def _check_output_folder(args: argparse.Namespace, save_path: str, lsg_kwargs: dict[str, Any]) -> None:
    """OutputExistsError when `save_path` holds a model and --overwrite was not given, or holds anything
    else (see `check_output_folder`); but a setting that cannot work is the first mistake to report
    (see `_check_settings`)."""
    from .saving import check_output_folder

    try:
        check_output_folder(save_path, args.overwrite, source=args.source)
    except OutputExistsError:
        _check_settings(args, lsg_kwargs)
        raise


def _check_settings(args: argparse.Namespace, lsg_kwargs: dict[str, Any]) -> None:
    """The checks of the settings that need no weights (the source's config only): an unknown head
    (UnsupportedModelError), settings that cannot work at --max-len (InvalidSettingsError)."""
    from .architectures import find_architecture
    from .lsg_config import check_setting_names, resolve_settings
    from .sources import load_source_config

    source_config = load_source_config(args.source, args.token)
    arch = find_architecture(source_config.model_type)
    check_setting_names(arch, source_config, lsg_kwargs)
    resolve_settings(arch, source_config, lsg_kwargs, args.max_sequence_length, args.architecture)


def flag_spelling(parser: argparse.ArgumentParser, message: str) -> str:
    """`message` as a CLI user should read it: each parameter written the library's way (`name=`,
    `name=value`) that has a flag becomes the flag (`--flag`, `--flag value`; `--no-flag` or "no
    --flag" for `name=False`). The parameters and flags are the parser's own options."""
    options = {
        action.dest: action
        for action in parser._actions
        if action.option_strings and action.dest not in ("help", "version")
    }
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
    the options given (those that differ from their default) in the parser's order, the source and the
    folders of --save-path and --adapt-on named as a card names paths (`card.card_path`: never by where
    they lie on the user's machine), no credential (--token) and no display setting."""
    from .card import card_path

    words = [parser.prog, card_path(args.source)]
    for action in parser._actions:
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or action.dest in NOT_RECORDED or value == action.default:
            continue
        if action.nargs == 0:
            words.append(_switch(action, bool(value)))
        else:
            words += [action.option_strings[0], card_path(value) if action.dest in PATH_OPTIONS else str(value)]
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
