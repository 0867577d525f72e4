"""The test configuration keeps the user's Hugging Face cache as it was: remote code loaded by the
tests goes to a temporary modules cache (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import run_without_lsg_converter
from lsg_converter import LSGConverter, save_converted

USER_MODULES_CACHE = Path.home() / ".cache" / "huggingface" / "modules"


def _listing(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")} if folder.is_dir() else set()


def test_remote_code_loaded_by_a_test_lands_outside_the_users_cache(tiny_bert_dir, tmp_path):
    before = _listing(USER_MODULES_CACHE)
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(tiny_bert_dir)
    target = save_converted(model, tokenizer, tmp_path / "setup-check")

    script = f"from transformers import AutoModel\nAutoModel.from_pretrained({str(target)!r}, trust_remote_code=True)\n"
    result = run_without_lsg_converter(script, tmp_path)

    assert result.returncode == 0, result.stderr
    assert _listing(USER_MODULES_CACHE) == before
    assert any(Path(os.environ["HF_MODULES_CACHE"]).rglob("modeling_lsg_bert.py"))
