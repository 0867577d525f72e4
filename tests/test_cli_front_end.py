"""`lsg-convert`'s front end (lsg_converter_cli): the command line answers before torch and
transformers are imported, --version, the closest flag for a misspelt one, settings reported before
an existing output folder, and Ctrl-C at any moment: one line and exit 130 with nothing written, or
the run done (Saved, exit 0) once its folder is in place."""

from __future__ import annotations

import inspect
import re
import shutil
import signal
import subprocess

import pytest

from helpers import closed_port_endpoint, hub_environment, python_command, run_process
from lsg_converter._version import __version__
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES
from lsg_converter.adaptation import NEGATIVES, OBJECTIVES, TRAINABLE_PARTS, adapt_to_long_documents
from lsg_converter.positions import POSITION_TILINGS
import lsg_converter_cli
from lsg_converter_cli import main

# main() in a fresh Python, which then prints the heavy packages it imported
HEAVY_IMPORTS_AFTER_MAIN = """
import sys
from lsg_converter_cli import main
code = main(ARGV)
print("HEAVY", [name for name in ("torch", "transformers", "lsg_converter") if name in sys.modules])
sys.exit(code)
"""


@pytest.mark.parametrize(
    "argv,code",
    [
        (["--help"], 0),
        (["--version"], 0),
        (["model", "--max-len", "512", "--block-sise", "3"], 2),
        (["model", "--max-len", "4k"], 2),
        (["model"], 2),
        (["./no-such-model", "--max-len", "512"], 4),  # a missing local path, said at once
        (["~/no-such-folder/model", "--max-len", "512"], 4),
    ],
)
def test_the_command_line_answers_without_importing_torch_or_transformers(argv, code, tmp_path):
    script = HEAVY_IMPORTS_AFTER_MAIN.replace("ARGV", repr(argv))
    result = run_process(python_command(script), tmp_path, hub_environment(closed_port_endpoint(), tmp_path / "hf"))

    assert result.returncode == code, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout


def test_version_prints_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"lsg-convert {__version__}\n"


def test_a_misspelt_flag_is_named_with_the_closest_one_before_any_other_mistake(capsys):
    assert main(["model", "--block-sise", "3"]) == 2  # --max-len is missing too
    err = capsys.readouterr().err
    assert err == (
        "lsg-convert: error: unrecognized arguments: --block-sise: did you mean --block-size? (see lsg-convert --help)\n"
    )


def test_an_unknown_flag_far_from_every_flag_gets_no_guess(capsys):
    assert main(["model", "--max-len", "512", "--frobnicate=hf_secret"]) == 2
    assert capsys.readouterr().err == "lsg-convert: error: unrecognized arguments: --frobnicate (see lsg-convert --help)\n"


@pytest.mark.parametrize("flag", ["--adapt-source-share", "--adapt-short-share"])
@pytest.mark.parametrize("share", ["1", "-0.1", "half"])
def test_an_adaptation_share_out_of_0_to_1_exits_2_before_converting(flag, share, capsys):
    assert main(["model", "--max-len", "512", "--adapt-on", "texts", flag, share]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and flag in error, error


@pytest.mark.parametrize("labels", ["0", "-1"])
def test_num_labels_below_1_exits_2_in_one_line_before_converting(labels, capsys):
    assert main(["model", "--max-len", "512", "--architecture", "BertForSequenceClassification", "--num-labels", labels]) == 2
    assert capsys.readouterr().err == (
        f"lsg-convert: error: argument --num-labels: {labels} is no number of labels: give 1 or more "
        "(see lsg-convert --help)\n"
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--adapt-passages", "3"], "--adapt-passages above 1 needs --adapt-objective spans"),
        (["--adapt-objective", "spans", "--adapt-mini-batch-size", "2"], "--adapt-objective spans has no cached loss: leave --adapt-mini-batch-size out"),
    ],
    ids=["passages without spans", "spans with a mini batch"],
)
def test_adaptation_flags_that_cannot_run_together_exit_2_in_one_line_before_converting(flags, message, capsys):
    assert main(["model", "--max-len", "512", "--adapt-on", "texts", *flags]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"lsg-convert: error: {message} (see lsg-convert --help)"


def test_the_parser_offers_the_library_choices():
    assert lsg_converter_cli.SPARSITY_TYPES == SPARSITY_TYPES
    assert lsg_converter_cli.POSITION_TILINGS == POSITION_TILINGS
    assert lsg_converter_cli.ADAPTED_PARTS == TRAINABLE_PARTS
    default_share = inspect.signature(adapt_to_long_documents).parameters["source_share"].default
    assert lsg_converter_cli.ADAPTATION_SOURCE_SHARE == default_share
    default_objective = inspect.signature(adapt_to_long_documents).parameters["objective"].default
    assert lsg_converter_cli.ADAPTATION_OBJECTIVES == OBJECTIVES and OBJECTIVES[0] == default_objective
    default_negatives = inspect.signature(adapt_to_long_documents).parameters["negatives"].default
    assert lsg_converter_cli.ADAPTATION_NEGATIVES == NEGATIVES and NEGATIVES[0] == default_negatives


@pytest.mark.parametrize(
    "flag,value,code,named",
    [("--num-global-tokens", "600", 2, "--num-global-tokens 600"), ("--architecture", "RobertaForMaskedLM", 3, "head")],
)
def test_settings_are_checked_before_the_output_folder(tiny_bert_dir, tmp_path, capsys, flag, value, code, named):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("kept")

    assert main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), flag, value]) == code
    err = capsys.readouterr().err
    assert "already exists" not in err and named in err and len(err.splitlines()) == 1, err
    assert [path.name for path in out.iterdir()] == ["kept.txt"]


# the CLI run by a Python that pauses, once, at the first audit event EVENT whose first argument
# (a path or a module name) holds MARKER, printing PAUSED; SWALLOW: it sends itself SIGINT there
# instead and catches the KeyboardInterrupt, as a library that swallows it would.
PAUSING_CLI = """
import os, signal, sys, time
from lsg_converter_cli import main

def pause(event, args):
    name = os.fsdecode(args[0]) if event == EVENT and isinstance(args[0], (str, bytes, os.PathLike)) else ""
    if paused or MARKER not in name:
        return
    paused.append(name)
    if SWALLOW:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            return
    os.write(1, b"PAUSED\\n")
    time.sleep(120)

paused = []
sys.addaudithook(pause)
sys.exit(main(ARGV))
"""


def _run_interrupted(tiny_bert_dir, tmp_path, event: str, marker: str, swallow: bool = False) -> subprocess.Popen:
    """The CLI converting a copy of `tiny_bert_dir` into tmp_path/out, sent SIGINT where it pauses."""
    source = shutil.copytree(tiny_bert_dir, tmp_path / "source")
    argv = [str(source), "--max-len", "512", "--save-path", str(tmp_path / "out")]
    script = (
        PAUSING_CLI.replace("EVENT", repr(event))
        .replace("MARKER", repr(marker))
        .replace("SWALLOW", repr(swallow))
        .replace("ARGV", repr(argv))
    )
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")
    process = subprocess.Popen(
        python_command(script), cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if not swallow:
        assert process.stdout.readline() == "PAUSED\n", process.communicate(timeout=300)[1]
        process.send_signal(signal.SIGINT)
    return process


@pytest.mark.parametrize(
    "event,marker",
    [("open", "_version.py"), ("import", "torch"), ("import", "transformers")],
    ids=["reading the command line", "importing torch", "importing transformers"],
)
def test_ctrl_c_before_the_conversion_exits_130_in_one_line(tiny_bert_dir, tmp_path, event, marker):
    process = _run_interrupted(tiny_bert_dir, tmp_path, event, marker)
    out, err = process.communicate(timeout=300)

    assert process.returncode == 130, err
    assert err.splitlines() == ["lsg-convert: interrupted"] and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home", "source"]


def test_a_ctrl_c_a_library_swallowed_stops_the_run_before_anything_is_written(tiny_bert_dir, tmp_path):
    process = _run_interrupted(tiny_bert_dir, tmp_path, "open", "config.json", swallow=True)
    out, err = process.communicate(timeout=300)

    assert process.returncode == 130, err
    assert err.splitlines()[-1:] == ["lsg-convert: interrupted"] and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home", "source"]


def test_ctrl_c_once_the_folder_is_in_place_lets_the_run_end_as_done(tiny_bert_dir, tmp_path):
    process = _run_interrupted(tiny_bert_dir, tmp_path, "shutil.rmtree", ".partial")  # after the rename
    out, err = process.communicate(timeout=300)

    assert process.returncode == 0, err
    assert "interrupted" not in err and f"to {tmp_path / 'out'}" in out.splitlines()[-1]
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home", "out", "source"]


# the command's main() in a fresh Python that, once the run has returned its code, says so and lingers
# as an interpreter shutting down after torch does
LINGERING_COMMAND = """
import os, sys, time
from lsg_converter_cli import main
code = main(ARGV, late_interrupts_ignored=True)
os.write(1, b"RETURNED\\n")
time.sleep(10)
sys.exit(code)
"""


def test_ctrl_c_after_the_run_returned_keeps_its_exit_code(tiny_bert_dir, tmp_path):
    argv = [str(tiny_bert_dir), "--max-len", "256", "--save-path", str(tmp_path / "out"), "--quiet"]
    script = LINGERING_COMMAND.replace("ARGV", repr(argv))
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")
    process = subprocess.Popen(
        python_command(script), cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    assert process.stdout.readline() == "RETURNED\n", process.communicate(timeout=300)[1]
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)

    assert process.returncode == 0, err
    assert "Traceback" not in err and "interrupted" not in err
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_the_command_is_main_with_late_interrupts_ignored():
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["lsg-convert"] == "lsg_converter_cli:console_main"


@pytest.mark.parametrize("source", ["./no-such-model", "/no/such/model", "data/models/no-such-model"])
def test_a_missing_local_path_is_one_line_exit_4(source, capsys):
    assert main([source, "--max-len", "512"]) == 4
    assert capsys.readouterr().err.strip() == f"lsg-convert: error: No folder at {source!r}: give an existing model folder or a Hub model id."


def test_a_name_that_may_be_a_hub_id_is_not_refused_by_the_front_end():
    assert lsg_converter_cli.missing_local_source("owner/model-name") is None
    assert lsg_converter_cli.missing_local_source("bert-base-uncased") is None


def test_help_names_every_encoder_decoder_family_and_when_sparse_sizes_act(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())

    assert "(BART, mBART, Pegasus, T5, mT5, UMT5): the decoder attends" in text
    assert text.count("with a --sparsity-type other than none") == 2


def test_texts_to_adapt_on_starting_with_a_tilde_are_in_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))

    args = lsg_converter_cli.build_parser().parse_args(["model", "--max-len", "512", "--adapt-on", "~/texts"])

    assert args.texts == str(tmp_path / "texts")


def test_help_names_the_t5_family_where_its_settings_differ(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())

    assert "Pegasus, T5 (v1.1, Flan-T5), mT5 or UMT5 checkpoint" in text
    assert "MPNet, DeBERTa, T5, mT5, UMT5: the position the global tokens have" in text
    assert "global token 0's (default on; off for T5, mT5, UMT5)" in text


def test_help_examples_keep_each_command_s_line_continuation(capsys):
    assert main(["--help"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  lsg-convert ")]

    joined = [line for line in commands if re.search(r"\S {2,}--", line)]  # a lost backslash joins two lines
    assert commands and not joined, joined
