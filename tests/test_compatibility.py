"""What the remote code relies on in transformers lives in lsg_transformers: the cache of a decoding step
found whatever a release calls it, a model meeting an untested transformers says so once, a name a
release removed fails in one line; and the package's own dependencies are what it declares."""

from __future__ import annotations

import logging
import re
import subprocess
import tomllib
from importlib.metadata import requires

import pytest
import transformers
from transformers import DynamicCache

from helpers import REPO_ROOT, python_command
from lsg_converter import MissingDependencyError, __version__
from lsg_converter.errors import missing_package, require
from lsg_converter.models import lsg_transformers
from lsg_converter.models.lsg_transformers import (
    TESTED_TRANSFORMERS,
    IncompatibleTransformersError,
    forward_cache,
    past_length,
    transformers_names,
    untested_transformers,
    warn_if_untested_transformers,
    with_past_length,
)


pytestmark = pytest.mark.compat


def filled_cache(tokens: int) -> DynamicCache:
    import torch

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4), 0)
    return cache


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_the_cache_of_a_forward_is_found_whatever_the_release_names_it(name):
    cache = filled_cache(5)
    assert forward_cache({"input_ids": None, name: cache}) is cache
    assert forward_cache({"input_ids": None, "kwargs": {name: cache}}) is cache  # caught by **kwargs


def test_past_length_is_the_length_of_the_cache():
    assert past_length({"cache": filled_cache(7), "past_key_values_length": 3}) == 7


@pytest.mark.parametrize("name", ["cache_length", "past_key_values_length"])
def test_past_length_of_the_embeddings_is_read_and_rewritten_under_the_name_they_have(name):
    assert past_length({name: 9}) == 9
    assert with_past_length({name: 9, "input_ids": None}, 8) == {name: 8, "input_ids": None}


def test_a_forward_without_cache_starts_from_nothing():
    assert past_length({"input_ids": None, "cache": None}) == 0


def test_the_tested_range_ends_at_a_release_ci_ran():
    oldest, newest = TESTED_TRANSFORMERS
    assert untested_transformers(oldest) is None
    assert untested_transformers(newest) is None
    assert untested_transformers(re.sub(r"\d+$", "7", newest)) is None  # a patch release of the newest


def test_the_code_version_is_the_package_version():
    assert lsg_transformers.LSG_CODE_VERSION == __version__


@pytest.mark.parametrize("installed,word", [("5.99.0", "newer"), ("6.1.0.dev0", "newer"), ("4.57.1", "older")])
def test_an_untested_transformers_is_named_beside_the_tested_range(installed, word):
    reason = untested_transformers(installed)
    oldest, newest = TESTED_TRANSFORMERS
    assert f"tested with transformers {oldest} to {newest}" in reason
    assert f"transformers {installed} is {word}" in reason


def test_an_untested_transformers_is_said_once_with_how_to_resave(monkeypatch, caplog):
    monkeypatch.setattr(lsg_transformers, "TESTED_TRANSFORMERS", ("1.0.0", "1.1.0"))
    logging.Logger.warning_once.cache_clear()

    with caplog.at_level(logging.WARNING, logger="lsg_converter"):
        warn_if_untested_transformers()
        warn_if_untested_transformers()

    warnings = [record.getMessage() for record in caplog.records if "tested with transformers 1.0.0 to 1.1.0" in record.getMessage()]
    assert len(warnings) == 1
    assert f"transformers {transformers.__version__} is newer" in warnings[0]
    assert "lsg-convert <model> --max-len" in warnings[0]


def test_a_name_that_transformers_removed_fails_in_one_line_naming_both_versions():
    with pytest.raises(IncompatibleTransformersError) as raised:
        with transformers_names():
            from transformers.models.bert.modeling_bert import BertNoSuchLayer  # noqa: F401

    message = str(raised.value)
    assert "\n" not in message
    assert "BertNoSuchLayer" in message or "cannot import" in message
    assert f"transformers {transformers.__version__}" in message and TESTED_TRANSFORMERS[1] in message
    assert "pip install -U lsg-converter" in message


def test_a_missing_package_is_named_with_its_pip_install():
    with pytest.raises(MissingDependencyError, match=r"needs the package no-such-package.*pip install no-such-package"):
        require("no_such_package", "Converting")


def test_a_failed_import_becomes_one_line_naming_the_package():
    error = missing_package(ModuleNotFoundError("No module named 'sentence_transformers'", name="sentence_transformers"))
    assert isinstance(error, MissingDependencyError)
    assert "pip install -U sentence-transformers" in str(error)


def declared() -> dict[str, str]:
    """The runtime requirements in pyproject.toml: name -> version specifier."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~ ]", item, 1)[0].lower(): item for item in project["dependencies"]}


def test_conversion_needs_only_declared_packages():
    """The dry runs load on the meta device through accelerate: it is a dependency, not an extra."""
    assert "accelerate" in declared()


def test_installed_metadata_declares_what_pyproject_declares():
    installed = {re.split(r"[<>=!~ ;\[]", item, 1)[0].lower() for item in requires("lsg-converter") if "extra ==" not in item}
    assert installed == set(declared())


def oldest_pins() -> dict[str, str]:
    """.ci/oldest-constraints.txt: package -> the version CI's oldest environment installs."""
    lines = (REPO_ROOT / ".ci" / "oldest-constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize("package", ["transformers", "huggingface_hub", "accelerate", "sentence-transformers"])
def test_each_declared_lower_bound_is_the_version_ci_runs_at_the_oldest_end(package):
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["sentence-transformers"]]
    specifier = next(item for item in requirements if re.match(rf"{package}\b", item))
    assert f">={oldest_pins()[package]}" in specifier, specifier


def test_the_remote_code_s_tested_range_starts_at_the_oldest_version_ci_runs():
    assert TESTED_TRANSFORMERS[0] == oldest_pins()["transformers"]


def run_cli_without(module: str, arguments: list[str], cwd) -> subprocess.CompletedProcess:
    """lsg-convert `arguments` in a fresh process in which `import <module>` fails as if it were not installed."""
    script = f"import sys\nsys.modules[{module!r}] = None\nfrom lsg_converter_cli import main\nsys.exit(main({arguments!r}))"
    return subprocess.run(python_command(script), cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("module,package", [("accelerate", "accelerate"), ("torch", "torch")])
def test_lsg_convert_without_a_dependency_names_it_in_one_line_and_writes_nothing(module, package, tiny_bert_dir, tmp_path):
    result = run_cli_without(module, [str(tiny_bert_dir), "--max-len", "256", "--save-path", "out"], tmp_path)

    assert result.returncode == MissingDependencyError.exit_code
    assert result.stderr.startswith("lsg-convert: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f"pip install -U {package}" in result.stderr or f"pip install {package}" in result.stderr
    assert "corrupt" not in result.stderr
    assert not (tmp_path / "out").exists()
