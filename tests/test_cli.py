"""The `lsg-convert` command line: success, --help, one clear exit code per bad input, messages in
flag spelling, --quiet, Ctrl-C, and the permissions of what it saves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import torch

from helpers import (
    FIXTURES,
    REPO_ROOT,
    assert_reproduces_reference,
    cli_command,
    closed_port_endpoint,
    files_under,
    hub_environment,
    python_command,
    reference_cases,
    run_process,
    save_tiny_source,
)
from lsg_converter import ARCHITECTURES, LSGConverter, OutputExistsError, model_card, save_converted
from lsg_converter.cli import flag_spelling
from lsg_converter_cli import build_parser, main
from lsg_converter.saving import check_output_folder

ERROR_PREFIX = "lsg-convert: error:"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_clean_error(capsys: pytest.CaptureFixture[str], code: int, expected_code: int) -> str:
    """The exit code is `expected_code` and stderr holds exactly one line starting with the error prefix."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{err}"
    assert lines[0].startswith(ERROR_PREFIX)
    return lines[0]


def _console_script() -> list[str]:
    """`lsg-convert` as pyproject.toml declares it (module:function), run by this Python from this
    checkout (an installed script may name an older entry point until `pip install -e .` runs again)."""
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts["lsg-convert"].partition(":")
    return python_command(f"import sys\nfrom {module} import {function}\nsys.exit({function}())")


def _console_environment() -> dict[str, str]:
    """This environment, offline, with this checkout first on PYTHONPATH."""
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path}


# ---------------------------------------------------------------------------------------------- success


def test_success_writes_the_folder_and_returns_0(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--block-size", "32"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "lsg-bert"
    assert config["max_position_embeddings"] == 512
    assert config["block_size"] == 32
    assert (out / "model.safetensors").is_file()
    assert str(out) in captured.out


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_converts_from_the_command_line(arch, tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)

    code = main([str(source), "--max-len", "2048", "--save-path", str(tmp_path / "out"), "--num-global-tokens", "2"])

    assert code == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == f"lsg-{arch}" and config["num_global_tokens"] == 2
    assert (tmp_path / "out" / f"modeling_{ARCHITECTURES[arch].file_stem}.py").is_file()


def test_bart_decoder_can_be_kept_from_the_global_tokens(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", "bart", "BartForConditionalGeneration")

    code = main([str(source), "--max-len", "1024", "--save-path", str(tmp_path / "out"), "--no-pass-global-tokens-to-decoder"])

    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["pass_global_tokens_to_decoder"] is False


@pytest.mark.parametrize("tiling,row_at_source_length", [("body", 2), ("table", 0)])
def test_position_tiling_flag_chooses_how_positions_repeat(tiny_bert_dir, tmp_path, capsys, tiling, row_at_source_length):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--position-tiling", tiling])

    assert code == 0, capsys.readouterr().err
    source = load_file(tiny_bert_dir / "model.safetensors")["bert.embeddings.position_embeddings.weight"]
    table = load_file(out / "model.safetensors")["bert.embeddings.position_embeddings.weight"]
    assert torch.equal(table[source.shape[0]], source[row_at_source_length])


@pytest.fixture
def tokenizer_less_source(tmp_path):
    """A tiny BERT without tokenizer files: its conversion logs warnings."""
    return save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")


def test_warnings_print_one_line_each(tokenizer_less_source, tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")

    result = run_process(cli_command(tokenizer_less_source, "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("lsg-convert: warning: ") for line in lines), result.stderr
    assert any("no tokenizer" in line for line in lines)


def test_quiet_success_prints_nothing_not_even_warnings(tokenizer_less_source, tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")

    result = run_process(
        cli_command(tokenizer_less_source, "--max-len", "512", "--save-path", "out", "--quiet"), tmp_path, environment
    )

    assert result.returncode == 0
    assert (result.stdout, result.stderr) == ("", "")
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_the_saved_folder_and_files_get_their_permissions_from_the_umask(tiny_bert_dir, tmp_path, umask):
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(tiny_bert_dir)
    previous = os.umask(umask)
    try:
        out = save_converted(model, tokenizer, tmp_path / "group-disk" / "out", card=model_card(model))
    finally:
        os.umask(previous)

    assert oct(stat.S_IMODE(out.stat().st_mode)) == oct(0o777 & ~umask)
    modes = {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in files_under(out)}
    assert "model.safetensors" in modes
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))


# the CLI run by a Python that pauses, once, when the conversion opens a file whose path holds MARKER
PAUSING_CLI = """
import os, sys, time
from lsg_converter_cli import main

def pause(event, args):
    if event == "open" and isinstance(args[0], str) and MARKER in args[0] and not paused:
        paused.append(args[0])
        os.write(1, b"PAUSED\\n")
        time.sleep(120)

paused = []
sys.addaudithook(pause)
sys.exit(main(ARGV))
"""


@pytest.mark.parametrize("moment", ["reading the source", "writing the output"])
def test_ctrl_c_during_a_conversion_exits_130_in_one_line_and_leaves_no_folder(tiny_bert_dir, tmp_path, moment):
    source = shutil.copytree(tiny_bert_dir, tmp_path / "source")
    marker = str(source / "config.json") if moment == "reading the source" else f"{os.sep}.out."
    argv = [str(source), "--max-len", "512", "--save-path", str(tmp_path / "out")]
    script = PAUSING_CLI.replace("MARKER", repr(marker)).replace("ARGV", repr(argv))
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")
    process = subprocess.Popen(
        python_command(script), cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    assert process.stdout.readline() == "PAUSED\n", process.communicate(timeout=300)[1]
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)

    assert process.returncode == 130, err
    assert err.splitlines() == ["lsg-convert: interrupted"] and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home", "source"]  # no output, no staging folder


def test_default_save_path_is_source_name_lsg_max_len(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([str(tiny_bert_dir), "--max-len", "256"]) == 0
    assert (tmp_path / f"{tiny_bert_dir.name}-lsg-256" / "config.json").is_file()


def test_help_shows_examples_and_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert "lsg-convert bert-base-uncased --max-len 4096" in out
    assert "exit codes" in out
    assert "--overwrite" in out and "--push-to-hub" in out
    assert "6 corrupt" in out and "7 Hub" in out and "9 output not writable" in out and "130 interrupted" in out


def test_console_script_converts_and_exits_0(tiny_bert_dir, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [*_console_script(), str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_console_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert (out / "config.json").is_file()
    assert (out / "modeling_lsg_bert.py").is_file()


def test_console_script_error_exits_with_its_code_and_no_traceback(tmp_path):
    result = subprocess.run(
        [*_console_script(), str(tmp_path / "missing"), "--max-len", "256", "--save-path", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_console_environment(),
    )
    assert result.returncode == 4
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(ERROR_PREFIX)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- bad inputs


def test_missing_source_exits_4_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tmp_path / "no-such-model"), "--max-len", "256", "--save-path", str(out)])
    _assert_clean_error(capsys, code, 4)
    assert not out.exists()


def test_an_empty_folder_exits_4_saying_it_holds_no_model(tmp_path, capsys):
    (tmp_path / "empty").mkdir()

    code = main([str(tmp_path / "empty"), "--max-len", "256", "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 4)
    assert f"{tmp_path / 'empty'} holds no model (no config.json)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_a_folder_whose_config_describes_no_model_exits_4_saying_so_plainly(tmp_path, capsys):
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "config.json").write_text('{"learning_rate": 0.001}')

    code = main([str(tmp_path / "not-a-model"), "--max-len", "256", "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 4)
    assert "holds no model" in line and "model_type" not in line


def test_a_config_without_model_type_exits_6_naming_the_key_and_the_type_its_architectures_suggest(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    config = json.loads((source / "config.json").read_text())
    del config["model_type"]
    (source / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # what saving the source printed

    code = main([str(source), "--max-len", "256", "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 6)
    assert line.endswith('config.json has no "model_type"; its architectures ["BertModel"] suggest "bert": add "model_type": "bert".')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_missing_relative_source_error_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["no-such-model", "--max-len", "256", "--save-path", "out"])
    _assert_clean_error(capsys, code, 4)


def test_unsupported_model_type_exits_3_and_writes_nothing(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(
        tmp_path / "gpt2"
    )
    capsys.readouterr()  # what saving the source printed
    out = tmp_path / "out"
    code = main([str(tmp_path / "gpt2"), "--max-len", "256", "--save-path", str(out)])
    line = _assert_clean_error(capsys, code, 3)
    assert "bert" in line
    assert not out.exists()


@pytest.mark.parametrize("max_len", ["0", "-5"])
def test_non_positive_max_len_exits_2_and_writes_nothing(tiny_bert_dir, tmp_path, capsys, max_len):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", max_len, "--save-path", str(out)])
    _assert_clean_error(capsys, code, 2)
    assert not out.exists()


def test_block_size_0_exits_2_and_writes_nothing(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "256", "--block-size", "0", "--save-path", str(out)])
    _assert_clean_error(capsys, code, 2)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_existing_output_without_overwrite_exits_5_and_leaves_files_untouched(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "lsg-bert"}\n')
    (out / "weights.bin").write_bytes(b"\x00\x01\x02")
    before = _files(out)
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out)])
    line = _assert_clean_error(capsys, code, 5)
    assert "pass --overwrite" in line and "overwrite=" not in line
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_replaces_the_existing_output(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "lsg-bert"}\n')
    (out / "weights.bin").write_bytes(b"\x00\x01\x02")
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out), "--overwrite"])
    assert code == 0, capsys.readouterr().err
    assert not (out / "weights.bin").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "lsg-bert"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_non_integer_max_len_exits_2_in_one_line(tiny_bert_dir, tmp_path, capsys):
    for max_len in ("4k", "1.5"):
        code = main([str(tiny_bert_dir), "--max-len", max_len, "--save-path", str(tmp_path / "out")])
        line = _assert_clean_error(capsys, code, 2)
        assert "whole number" in line and "--help" in line
    assert sorted(tmp_path.iterdir()) == []


def test_unknown_sparsity_type_exits_2_listing_the_valid_ones(tiny_bert_dir, tmp_path, capsys):
    code = main([str(tiny_bert_dir), "--max-len", "512", "--sparsity-type", "dense", "--save-path", str(tmp_path / "o")])
    line = _assert_clean_error(capsys, code, 2)
    assert "'dense'" in line and all(name in line for name in ("norm", "pooling", "lsh", "bos_pooling"))
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "flag,value",
    [("--sparse-block-size", "-1"), ("--sparsity-factor", "-2"), ("--num-global-tokens", "-1"), ("--num-global-tokens", "513")],
)
def test_negative_or_out_of_range_sizes_exit_2_and_write_nothing(tiny_bert_dir, tmp_path, capsys, flag, value):
    code = main([str(tiny_bert_dir), "--max-len", "512", flag, value, "--save-path", str(tmp_path / "out")])
    line = _assert_clean_error(capsys, code, 2)
    assert f"{flag} {value}" in line
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "geometry",
    [
        ["--block-size", "16", "--sparsity-factor", "2", "--sparse-block-size", "4"],  # s < 0.75 b / f
        ["--block-size", "12", "--sparsity-factor", "4", "--sparse-block-size", "6"],  # b / f odd
    ],
    ids=["small-sparse-block", "odd-block-over-factor"],
)
def test_geometries_the_reference_got_wrong_convert_and_run(tiny_bert_dir, tmp_path, capsys, geometry):
    out = tmp_path / "out"
    assert main([str(tiny_bert_dir), "--max-len", "512", *geometry, "--save-path", str(out)]) == 0, capsys.readouterr().err

    from lsg_converter import LSGBertForMaskedLM

    logits = LSGBertForMaskedLM.from_pretrained(out)(input_ids=torch.randint(5, 99, (1, 300))).logits
    assert torch.isfinite(logits).all()


def test_truncated_weights_exit_6_and_write_nothing(tiny_bert_dir, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    code = main([str(source), "--max-len", "512", "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 6)
    assert "truncated or corrupt" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_corrupt_config_exits_6_and_writes_nothing(tiny_bert_dir, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    (source / "config.json").write_text('{"model_type": "bert", ')

    code = main([str(source), "--max-len", "512", "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 6)
    assert "config.json" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_python_callers_are_told_python_names(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text('{"model_type": "lsg-bert"}\n')

    with pytest.raises(OutputExistsError, match="pass overwrite=True") as refused:
        check_output_folder(tmp_path / "out")

    assert "--" not in str(refused.value)


@pytest.mark.parametrize(
    "library,cli",
    [
        ("choose another path or pass overwrite=True.", "choose another path or pass --overwrite."),
        ("use architecture= with one of BertModel.", "use --architecture with one of BertModel."),
        ("max_sequence_length=100 is below 128.", "--max-len 100 is below 128."),
        ("block_size=0 is too small; sparse_block_size=-1 too", "--block-size 0 is too small; --sparse-block-size -1 too"),
        ("Unknown sparsity_type='dense': use one of none, norm.", "Unknown --sparsity-type dense: use one of none, norm."),
        ("with pass_global_tokens_to_decoder=False the decoder", "with --no-pass-global-tokens-to-decoder the decoder"),
        ("pass token= for a private model", "pass --token for a private model"),
        ("config.block_size=3 and block_sizes=3 stay", "config.block_size=3 and block_sizes=3 stay"),
    ],
)
def test_library_messages_reach_cli_users_in_flag_spelling(library, cli):
    assert flag_spelling(build_parser(), library) == cli


def test_every_parameter_with_a_flag_is_translated():
    parser = build_parser()
    options = [action for action in parser._actions if action.option_strings and action.dest not in ("help", "version")]
    named = {"overwrite", "architecture", "max_sequence_length", "block_size", "sparse_block_size", "sparsity_factor"}
    named |= {"sparsity_type", "num_global_tokens", "position_tiling", "token", "save_path"}

    assert named <= {action.dest for action in options}
    for action in options:
        message = flag_spelling(parser, f"pass {action.dest}=1 here")
        assert message.startswith(f"pass {action.option_strings[0]}") and f"{action.dest}=" not in message, message


def test_an_unknown_head_exits_3_naming_the_flag(tiny_bert_dir, tmp_path, capsys):
    argv = [str(tiny_bert_dir), "--max-len", "256", "--architecture", "BertForNothing", "--save-path", str(tmp_path / "o")]

    code = main(argv)

    line = _assert_clean_error(capsys, code, 3)
    assert "use --architecture with one of" in line and "architecture=" not in line
    assert sorted(tmp_path.iterdir()) == []


class InterruptedTokenizer:
    """A tokenizer whose save is interrupted (Ctrl-C) after the model files are written."""

    def save_pretrained(self, folder):
        raise KeyboardInterrupt


def test_an_interrupted_save_leaves_nothing_behind(tiny_bert_dir, tmp_path):
    from lsg_converter import LSGConverter, save_converted

    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(tiny_bert_dir)

    with pytest.raises(KeyboardInterrupt):
        save_converted(model, InterruptedTokenizer(), tmp_path / "out")

    assert sorted(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- 2023 checkpoints


@pytest.mark.parametrize("case", reference_cases())
def test_reference_checkpoint_upgraded_by_the_cli_reproduces_the_reference_outputs(case, tmp_path, capsys):
    out = tmp_path / "out"

    assert main([str(FIXTURES / case), "--max-len", "1024", "--save-path", str(out)]) == 0, capsys.readouterr().err

    config = json.loads((out / "config.json").read_text())
    arch = json.loads((FIXTURES / case / "case.json").read_text())["arch"]
    assert config["model_type"] == f"lsg-{arch}" and (out / f"modeling_lsg_{arch}.py").is_file()
    model = ARCHITECTURES[arch].lsg_class(config["architectures"][0]).from_pretrained(out).eval()
    assert_reproduces_reference(model, case)


@pytest.fixture
def trained_legacy_checkpoint(tmp_path):
    """The bert-norm reference checkpoint (2023 format) with global tokens moved away from their initial values."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "legacy"
    shutil.copytree(FIXTURES / "bert-norm", folder)
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    table = weights["bert.embeddings.global_embeddings.weight"]
    weights["bert.embeddings.global_embeddings.weight"] = table + 0.1 * torch.randn(table.shape, generator=generator)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def upgrade(source, out, *flags, max_len="1024"):
    from lsg_converter import LSGBertForMaskedLM

    assert main([str(source), "--max-len", max_len, "--save-path", str(out), "--quiet", *flags]) == 0
    before = LSGBertForMaskedLM.from_pretrained(source).bert.embeddings.global_embeddings.weight
    return before, LSGBertForMaskedLM.from_pretrained(out).bert.embeddings


def fresh_global_tokens(embeddings, count):
    """Global k = word([CLS] for k = 0, else [MASK]) + position 64 k (default stride) + token type 0."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "bert-norm")
    words = embeddings.word_embeddings.weight[[tokenizer.cls_token_id] + [tokenizer.mask_token_id] * (count - 1)]
    positions = embeddings.position_embeddings.weight[torch.arange(count) * 64]
    return words + positions + embeddings.token_type_embeddings.weight[0]


def test_upgrading_an_lsg_checkpoint_keeps_its_global_tokens(trained_legacy_checkpoint, tmp_path):
    before, embeddings = upgrade(trained_legacy_checkpoint, tmp_path / "out")

    assert torch.equal(embeddings.global_embeddings.weight, before)


def test_resize_lsg_only_resizes_the_positions(trained_legacy_checkpoint, tmp_path):
    before, embeddings = upgrade(trained_legacy_checkpoint, tmp_path / "out", "--resize-lsg", max_len="2048")

    assert torch.equal(embeddings.global_embeddings.weight, before)
    assert embeddings.position_embeddings.weight.shape[0] == 2048


def test_keep_first_global_token_keeps_global_0_and_initialises_the_others(trained_legacy_checkpoint, tmp_path):
    before, embeddings = upgrade(trained_legacy_checkpoint, tmp_path / "out", "--keep-first-global-token")
    weight = embeddings.global_embeddings.weight

    assert torch.equal(weight[0], before[0])
    torch.testing.assert_close(weight[1:4], fresh_global_tokens(embeddings, 4)[1:])


def test_reinit_global_tokens_initialises_every_global_token_afresh(trained_legacy_checkpoint, tmp_path):
    before, embeddings = upgrade(trained_legacy_checkpoint, tmp_path / "out", "--reinit-global-tokens")

    torch.testing.assert_close(embeddings.global_embeddings.weight[:4], fresh_global_tokens(embeddings, 4))
    assert not torch.allclose(embeddings.global_embeddings.weight[:4], before[:4])


def test_a_save_mostly_of_position_tables_says_its_size_first(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "65536", "--save-path", str(out)])

    assert code == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "position tables" in line]
    assert len(warnings) == 1 and "MB of weights" in warnings[0] and "65,536 tokens" in warnings[0]
    assert "--max-len" in warnings[0]


def test_a_save_of_ordinary_size_says_nothing_of_it(tiny_bert_dir, tmp_path, capsys):
    assert main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(tmp_path / "out")]) == 0
    assert "position tables" not in capsys.readouterr().err


def test_pool_with_global_mask_first_token_and_num_labels_reach_the_saved_config(tiny_bert_dir, tmp_path):
    out = tmp_path / "out"
    code = main([
        str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out), "--architecture", "BertForSequenceClassification",
        "--no-pool-with-global", "--mask-first-token", "--num-labels", "5",
    ])  # fmt: skip

    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["pool_with_global"], config["mask_first_token"], len(config["id2label"])) == (False, True, 5)


def test_num_labels_on_a_classifier_of_another_size_saves_a_new_classifier_with_a_warning(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", "bert", "BertForSequenceClassification")  # 3 labels
    capsys.readouterr()  # what saving the source printed
    out = tmp_path / "out"

    code = main([str(source), "--max-len", "256", "--num-labels", "5", "--save-path", str(out)])

    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "newly initialised" in line]
    assert len(warnings) == 1 and "--num-labels 5" in warnings[0] and "classifier.weight [3, 32] -> [5, 32]" in warnings[0]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LSGBertForSequenceClassification"] and len(config["id2label"]) == 5


@pytest.mark.parametrize("architecture", [[], ["--architecture", "BertForMaskedLM"]], ids=["source-head", "asked"])
def test_num_labels_for_a_head_without_labels_exits_2_naming_architecture(tmp_path, capsys, architecture):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    capsys.readouterr()  # what saving the source printed

    code = main([str(source), "--max-len", "256", "--num-labels", "3", *architecture, "--save-path", str(tmp_path / "out")])

    line = _assert_clean_error(capsys, code, 2)
    assert "--num-labels 3" in line and "--architecture with one of BertForSequenceClassification" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_global_token_position_is_refused_in_one_line_where_the_model_has_no_relative_positions(tiny_bert_dir, tmp_path, capsys):
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(tmp_path / "out"), "--global-token-position", "3"])
    line = _assert_clean_error(capsys, code, 2)
    assert "global_token_position" in line or "--global-token-position" in line


def test_dtype_bfloat16_saves_half_the_bytes_and_loads_as_bfloat16(tiny_bert_dir, tmp_path):
    from safetensors import safe_open

    sizes = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        assert main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out), "--dtype", dtype, "--quiet"]) == 0
        sizes[dtype] = (out / "model.safetensors").stat().st_size
        with safe_open(out / "model.safetensors", "pt") as weights:
            assert {weights.get_tensor(name).dtype for name in weights.keys()} == {getattr(torch, dtype)}

    assert sizes["bfloat16"] < 0.55 * sizes["float32"]
    model = ARCHITECTURES["bert"].lsg_class("BertForMaskedLM").from_pretrained(tmp_path / "bfloat16")
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.arange(5, 200)[None]).logits).all()
