"""The defaults of the LSG settings are one table (lsg_converter/models/lsg_defaults.py): the settings,
every family's config, a conversion, lsg-convert's --help and docs/settings.md say what it holds."""

from __future__ import annotations

import ast
import dataclasses
import re
from types import SimpleNamespace

import pytest

import lsg_converter_cli
from helpers import REPO_ROOT
from lsg_converter import LSGConverter
from lsg_converter.architectures import ARCHITECTURES
from lsg_converter.models.lsg_defaults import (
    CONVERSION_DEFAULTS,
    LSG_DEFAULTS,
    RELATIVE_POSITION_DEFAULTS,
    ROTARY_DEFAULTS,
    SEQ2SEQ_DEFAULTS,
    conversion_block_size,
)
from lsg_converter.models.lsg_settings import LSGSettings

# flag -> the config key whose default its help states
FLAG_KEYS = {
    "--sparsity-type": "sparsity_type",
    "--sparse-block-size": "sparse_block_size",
    "--sparsity-factor": "sparsity_factor",
    "--num-global-tokens": "num_global_tokens",
    "--pool-with-global": "pool_with_global",
    "--mask-first-token": "mask_first_token",
}


def help_texts() -> dict[str, str]:
    """lsg-convert's help of each option, by flag, on one line."""
    parser = lsg_converter_cli.build_parser()
    return {flag: " ".join((action.help or "").split()) for action in parser._actions for flag in action.option_strings}


def as_help_states(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def test_the_settings_have_one_field_per_key_of_the_table_in_its_order():
    assert [field.name for field in dataclasses.fields(LSGSettings) if field.init] == list(LSG_DEFAULTS)


def test_settings_read_from_an_object_without_the_keys_hold_the_table():
    settings = LSGSettings.of(SimpleNamespace())

    assert {key: getattr(settings, key) for key in LSG_DEFAULTS} == LSG_DEFAULTS


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_a_config_built_without_lsg_keys_holds_its_family_defaults(arch):
    config_class = ARCHITECTURES[arch].config_class()
    config = config_class()

    assert {key: getattr(config, key) for key in config_class.lsg_defaults} == config_class.lsg_defaults
    assert LSG_DEFAULTS.keys() <= config_class.lsg_defaults.keys()


def test_only_the_t5_family_changes_a_shared_default_and_the_help_says_so():
    changed = {
        arch: {key for key, value in LSG_DEFAULTS.items() if ARCHITECTURES[arch].config_class().lsg_defaults[key] != value}
        for arch in ARCHITECTURES
    }

    assert {arch: keys for arch, keys in changed.items() if keys} == {arch: {"pool_with_global"} for arch in ("t5", "mt5", "umt5")}
    assert "off for T5, mT5, UMT5" in help_texts()["--pool-with-global"]


def test_the_front_end_reads_the_library_table_without_importing_the_library():
    defaults = lsg_converter_cli.library_defaults()

    assert (defaults.LSG_DEFAULTS, defaults.CONVERSION_DEFAULTS) == (LSG_DEFAULTS, CONVERSION_DEFAULTS)
    assert defaults.__name__ != "lsg_converter.models.lsg_defaults"


def test_the_help_states_the_defaults_a_conversion_takes(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir)
    helps = help_texts()

    for flag, key in FLAG_KEYS.items():
        assert re.search(r"\(default (\w+)", helps[flag]).group(1) == as_help_states(getattr(model.config, key)), flag
    assert model.config.block_size == conversion_block_size(model.config.pretrained_positions)
    assert f"{conversion_block_size(512)} for 512" in helps["--block-size"]
    assert f"(default {as_help_states(SEQ2SEQ_DEFAULTS['pass_global_tokens_to_decoder'])})" in helps["--pass-global-tokens-to-decoder"]
    assert f"(default {RELATIVE_POSITION_DEFAULTS['global_token_position']})" in helps["--global-token-position"]
    assert f"(default {as_help_states(ROTARY_DEFAULTS['clamp_global_distances'])})" in helps["--clamp-global-distances"]


def test_the_settings_page_states_the_defaults_a_conversion_takes():
    page = (REPO_ROOT / "docs" / "settings.md").read_text()
    table = page.split("| key | default | meaning |", 1)[1].split("\n\n", 1)[0]
    stated = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.MULTILINE))
    conversion = {**RELATIVE_POSITION_DEFAULTS, **SEQ2SEQ_DEFAULTS, **ROTARY_DEFAULTS, **CONVERSION_DEFAULTS}

    assert stated.keys() == conversion.keys()
    assert f"({conversion_block_size(512)} for 512)" in stated.pop("block_size")
    for key, text in stated.items():
        assert ast.literal_eval(re.match(r"`([^`]+)`", text).group(1)) == conversion[key], key
    reference = f'(`block_size={LSG_DEFAULTS["block_size"]}`, `sparsity_type="{LSG_DEFAULTS["sparsity_type"]}"`)'
    assert f"reference's values {reference}" in " ".join(page.split())
