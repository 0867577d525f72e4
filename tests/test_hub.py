"""Pushing to the Hub with only the network calls of huggingface_hub mocked (HfApi.create_repo / create_commit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx2 as httpx  # the HTTP client huggingface_hub 2.x is built on
import pytest
import torch
from huggingface_hub import CommitInfo, HfApi, RepoUrl
from huggingface_hub.errors import HfHubHTTPError
from transformers import AutoTokenizer

import lsg_converter
from helpers import padded_batch, run_without_lsg_converter
from lsg_converter import LSGConverter
from lsg_converter.cli import main

REPO_ID = "me/tiny-bert-lsg-512"
REMOTE_CODE = {"configuration_lsg_bert.py", "modeling_lsg_bert.py", "lsg_model.py", "lsg_attention.py", "lsg_flex.py"}


class FakeHub:
    """Stands in for the Hub's HTTP API: records the repository created and the files committed."""

    def __init__(self):
        self.created = []
        self.commits = []

    def create_repo(self, repo_id, **kwargs):
        self.created.append((repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        files = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
        self.commits.append((repo_id, files, kwargs))
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'0' * 40}",
            commit_message=kwargs.get("commit_message", ""),
            commit_description="",
            oid="0" * 40,
        )


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: fake.create_repo(repo_id, **kw))
    monkeypatch.setattr(HfApi, "create_commit", lambda api, repo_id, operations, **kw: fake.create_commit(repo_id, operations, **kw))
    return fake


@pytest.fixture
def licensed_source(tiny_bert_dir, tmp_path):
    """tiny_bert_dir with a model card that declares a license."""
    source = tmp_path / "tiny-bert"
    shutil.copytree(tiny_bert_dir, source)
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny bert\n")
    return source


def tokenizer_files(source, tmp_path):
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp_path / "tokenizer-only")
    return {p.name for p in (tmp_path / "tokenizer-only").iterdir()}


def push_with_cli(source, *extra):
    return main([str(source), "--max-len", "512", "--push-to-hub", REPO_ID, "--num-global-tokens", "2", *extra])


def test_cli_push_commits_exactly_the_converted_files_in_one_commit(hub, licensed_source, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert push_with_cli(licensed_source, "--private", "--commit-message", "first") == 0, capsys.readouterr().err

    assert hub.created == [(REPO_ID, {"private": True, "exist_ok": True})]
    [(repo_id, files, commit)] = hub.commits
    expected = {"config.json", "model.safetensors", "README.md", *REMOTE_CODE} | tokenizer_files(licensed_source, tmp_path)
    assert repo_id == REPO_ID and set(files) == expected
    assert commit["commit_message"] == "first"
    config = json.loads(files["config.json"])
    assert config["model_type"] == "lsg-bert" and config["num_global_tokens"] == 2
    assert {path.split(".")[0] + ".py" for path in config["auto_map"].values()} <= REMOTE_CODE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-bert", "tokenizer-only"], "pushing alone saves nothing"


def test_model_card_describes_the_conversion(hub, licensed_source, capsys):
    assert push_with_cli(licensed_source, "--token", "hf_secret") == 0, capsys.readouterr().err

    card = hub.commits[0][1]["README.md"].decode()
    assert "license: apache-2.0" in card
    assert "- lsg" in card and "- long-context" in card and "library_name: transformers" in card
    assert str(licensed_source) in card  # base model
    assert "512 tokens" in card
    for setting in ("block_size", "sparse_block_size", "sparsity_factor", "sparsity_type", "num_global_tokens"):
        assert f"`{setting}`" in card
    assert f"lsg-convert {licensed_source} --max-len 512 --push-to-hub {REPO_ID}" in card
    assert "hf_secret" not in card and "--token '***'" in card
    assert f"lsg_converter {lsg_converter.__version__}" in card
    assert f'AutoModelForMaskedLM.from_pretrained("{REPO_ID}", trust_remote_code=True)' in card
    assert "@inproceedings{condevaux2023lsg" in card


def lay_out_as_hub_cache(files, cache, repo_id):
    """Write committed files the way huggingface_hub caches a downloaded snapshot."""
    revision = "0" * 40
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_folder / "snapshots" / revision
    for path, content in files.items():
        (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / path).write_bytes(content)
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(revision)


def test_pushed_files_load_from_the_hub_cache_offline_with_remote_code(hub, licensed_source, tmp_path, capsys):
    assert push_with_cli(licensed_source) == 0, capsys.readouterr().err
    lay_out_as_hub_cache(hub.commits[0][1], tmp_path / "cache", REPO_ID)
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(licensed_source, num_global_tokens=2)
    input_ids, attention_mask = padded_batch([400, 300], 400)
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask, "logits": expected}, tmp_path / "io.pt")

    result = run_without_lsg_converter(
        f"""
        import os, torch
        os.environ["HF_HUB_CACHE"] = {str(tmp_path / "cache")!r}
        from transformers import AutoModelForMaskedLM, AutoTokenizer
        model = AutoModelForMaskedLM.from_pretrained({REPO_ID!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({REPO_ID!r})
        assert tokenizer.model_max_length == 512, tokenizer.model_max_length
        io = torch.load({str(tmp_path / "io.pt")!r})
        with torch.no_grad():
            logits = model(input_ids=io["input_ids"], attention_mask=io["attention_mask"]).logits
        print("MAX_DIFF", (logits - io["logits"]).abs().max().item())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split("MAX_DIFF")[1]) <= 1e-5


def test_model_push_to_hub_after_conversion_uploads_the_remote_code(hub, tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(tiny_bert_dir)

    model.push_to_hub(REPO_ID)

    files = hub.commits[0][1]
    assert {"config.json", "model.safetensors", *REMOTE_CODE} <= set(files)
    assert json.loads(files["config.json"])["auto_map"]["AutoModelForMaskedLM"] == "modeling_lsg_bert.LSGBertForMaskedLM"


def test_refused_token_exits_7_and_keeps_the_local_save_complete(monkeypatch, tiny_bert_dir, tmp_path, capsys):
    def refuse(api, repo_id, **kwargs):
        request = httpx.Request("POST", "https://huggingface.co/api/repos/create")
        raise HfHubHTTPError("401 Client Error: Unauthorized (invalid token)", response=httpx.Response(401, request=request))

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    out = tmp_path / "out"

    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--push-to-hub", REPO_ID, "--token", "bad"])

    err = capsys.readouterr().err.strip()
    assert code == 7 and err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("lsg-convert: error: Could not push") and "--token" in err
    assert (out / "README.md").is_file()
    reloaded = lsg_converter.LSGBertForMaskedLM.from_pretrained(out)
    assert reloaded.config.max_position_embeddings == 512


def test_offline_hub_exits_7_without_a_traceback(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    # HF_HUB_OFFLINE=1 (conftest): huggingface_hub itself refuses to reach the network.
    monkeypatch.chdir(tmp_path)
    code = main([str(tiny_bert_dir), "--max-len", "512", "--push-to-hub", REPO_ID])

    err = capsys.readouterr().err.strip()
    assert code == 7 and err.count("\n") == 0 and "OfflineModeIsEnabled" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
