"""The Hub: pushing with only the network calls of huggingface_hub mocked (HfApi.create_repo /
create_commit), and, in fresh processes, a local stand-in for the Hub (HF_ENDPOINT) that records every
request, or a closed local port for an unreachable Hub."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import ModelInfo
from transformers import AutoTokenizer

import lsg_converter
from helpers import (
    RecordingHub,
    cli_command,
    closed_port_endpoint,
    files_under,
    hub_environment,
    main_seconds,
    padded_batch,
    python_command,
    remote_code_files,
    run_process,
    run_without_lsg_converter,
    timed_cli_command,
)
from lsg_converter import LSGBertConfig, LSGConverter, model_card, push_converted
from lsg_converter.sources import HUB_TIMEOUT_VARIABLE
from lsg_converter_cli import main
from lsg_converter.sources import httpx  # the HTTP client of the installed huggingface_hub

REPO_ID = "me/tiny-bert-lsg-512"
TOKEN = "hf_" + "tEsT" * 8 + "xy"  # spelt like a real token: hf_ and 34 letters
OFFLINE_SECONDS = 15  # the longest an offline or refused Hub may keep a command waiting
REMOTE_CODE = set(remote_code_files(LSGBertConfig))


class FakeHub:
    """Stands in for the Hub's HTTP API: records the repository created and the files committed;
    knows every model, with no model card."""

    def __init__(self):
        self.created = []
        self.commits = []

    def model_info(self, repo_id, **kwargs):
        return ModelInfo(id=repo_id)

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


def go_online(monkeypatch):
    """The Hub counts as reachable (conftest's HF_HUB_OFFLINE=1 undone) and a token is found in HF_TOKEN."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)


@pytest.fixture
def online(monkeypatch):
    go_online(monkeypatch)


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: fake.create_repo(repo_id, **kw))
    monkeypatch.setattr(HfApi, "create_commit", lambda api, repo_id, operations, **kw: fake.create_commit(repo_id, operations, **kw))
    monkeypatch.setattr(HfApi, "model_info", lambda api, repo_id, **kw: fake.model_info(repo_id, **kw))
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


def test_cli_push_commits_exactly_the_converted_files_in_one_commit(
    online, hub, licensed_source, tmp_path, monkeypatch, capsys
):
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


def test_model_card_describes_the_conversion(online, hub, licensed_source, capsys):
    assert push_with_cli(licensed_source) == 0, capsys.readouterr().err

    card = hub.commits[0][1]["README.md"].decode()
    assert "license: apache-2.0" in card
    assert "- lsg" in card and "- long-context" in card and "library_name: transformers" in card
    assert f"`.../{licensed_source.parent.name}/tiny-bert` converted to **LSG attention**" in card
    assert "512 tokens" in card
    for setting in ("block_size", "sparse_block_size", "sparsity_factor", "sparsity_type", "num_global_tokens"):
        assert f"`{setting}`" in card
    recorded = f"lsg-convert .../{licensed_source.parent.name}/tiny-bert --max-len 512"
    assert f"{recorded} --num-global-tokens 2 --push-to-hub {REPO_ID}" in card
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


def test_pushed_card_loads_the_repository_and_records_a_hub_source_as_base_model(
    hub, tiny_bert_dir, tmp_path, monkeypatch
):
    files = {path.name: path.read_bytes() for path in tiny_bert_dir.iterdir() if path.is_file()}
    lay_out_as_hub_cache(files, tmp_path / "cache", "someone/tiny-bert")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    # HF_HUB_OFFLINE=1 (conftest): the Hub id is converted from the cache, then pushed online
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained("someone/tiny-bert")
    go_online(monkeypatch)

    push_converted(model, tokenizer, REPO_ID)

    card = ModelCard(hub.commits[0][1]["README.md"].decode())
    assert card.data.base_model == "someone/tiny-bert"
    assert f'AutoModelForMaskedLM.from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text
    assert f'AutoTokenizer.from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text


def test_pushed_files_load_from_the_hub_cache_offline_with_remote_code(online, hub, licensed_source, tmp_path, capsys):
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


def test_refused_token_exits_7_and_keeps_the_local_save_complete(online, monkeypatch, tiny_bert_dir, tmp_path, capsys):
    def refuse(api, repo_id, **kwargs):
        request = httpx.Request("POST", "https://huggingface.co/api/repos/create")
        raise HfHubHTTPError("401 Client Error: Unauthorized (invalid token)", response=httpx.Response(401, request=request))

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    out = tmp_path / "out"

    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--push-to-hub", REPO_ID, "--token", "bad"])

    err = capsys.readouterr().err.strip()
    assert code == 7 and err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"lsg-convert: error: Cannot push to '{REPO_ID}': the Hub answered HTTP 401")
    assert "--token" in err and "token=" not in err
    assert (out / "README.md").is_file()
    reloaded = lsg_converter.LSGBertForMaskedLM.from_pretrained(out)
    assert reloaded.config.max_position_embeddings == 512


@pytest.fixture
def unreadable_source(tiny_bert_dir, tmp_path):
    """tiny_bert_dir with truncated weights: converting it fails (exit 6), so a refusal with another
    code shows that the command stopped before converting."""
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return source


def test_push_alone_is_refused_before_converting_when_the_hub_is_offline(unreadable_source, tmp_path, monkeypatch, capsys):
    # HF_HUB_OFFLINE=1 (conftest)
    monkeypatch.chdir(tmp_path)
    code = main([str(unreadable_source), "--max-len", "512", "--push-to-hub", REPO_ID])

    err = capsys.readouterr().err.strip()
    assert code == 7, err
    assert err == f"lsg-convert: error: Cannot push to '{REPO_ID}': HF_HUB_OFFLINE=1 is set; unset it to push."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_push_alone_is_refused_before_converting_without_a_token(unreadable_source, tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home")  # no HF_TOKEN, no saved login

    result = run_process(cli_command(unreadable_source, "--max-len", "512", "--push-to-hub", REPO_ID), tmp_path, environment)

    assert result.returncode == 7, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"lsg-convert: error: Cannot push to '{REPO_ID}': no Hugging Face token found; pass --token, set HF_TOKEN, "
        "or log in with `hf auth login`."
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home", "source"]


# ---------------------------------------------------------------------------------------------- the model card


def test_card_names_a_local_source_by_its_last_two_names_without_a_link_or_its_path(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out)]) == 0, capsys.readouterr().err

    card = (out / "README.md").read_text()
    assert f"`.../{tiny_bert_dir.parent.name}/{tiny_bert_dir.name}` converted to" in card
    assert f"[{tiny_bert_dir.name}]" not in card and "base_model" not in card
    assert str(tiny_bert_dir.parent) not in card and str(tmp_path) not in card


def test_card_links_a_hub_source_to_its_hub_page(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(tiny_bert_dir)
    model.config._name_or_path = "someone/tiny-bert"

    card = str(model_card(model))

    assert "[someone/tiny-bert](https://huggingface.co/someone/tiny-bert) converted to" in card
    assert "base_model: someone/tiny-bert" in card


def test_card_records_the_command_from_the_parsed_options(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    typed = [str(tiny_bert_dir.resolve()), "--num-global-tokens", "2", "--seed", "123", "--max-len", "512", "--quiet",
             "--save-path", str(out)]  # fmt: skip

    assert main(typed) == 0, capsys.readouterr().err

    # the parser's order, options at their default left out, absolute folders by their last two names
    recorded = f"lsg-convert .../{tiny_bert_dir.parent.name}/{tiny_bert_dir.name} --max-len 512 --save-path .../{tmp_path.name}/out"
    assert f"{recorded} --num-global-tokens 2\n" in (out / "README.md").read_text()


@pytest.mark.parametrize("how", ["HF_TOKEN", "--token", "--token="])
def test_a_token_appears_in_no_saved_or_pushed_file_and_no_printed_line(
    online, hub, tiny_bert_dir, tmp_path, monkeypatch, capfd, how
):
    out = tmp_path / "out"
    given = {"HF_TOKEN": [], "--token": ["--token", TOKEN], "--token=": [f"--token={TOKEN}"]}[how]
    if how == "HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", TOKEN)
    else:
        monkeypatch.delenv("HF_TOKEN")

    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--push-to-hub", REPO_ID, *given])

    printed = capfd.readouterr()
    assert code == 0, printed.err
    assert TOKEN not in printed.out + printed.err
    assert [path.name for path in files_under(out) if TOKEN.encode() in path.read_bytes()] == []
    assert [name for name, content in hub.commits[0][1].items() if TOKEN.encode() in content] == []


def test_an_abbreviated_flag_is_refused_without_echoing_its_value(tiny_bert_dir, tmp_path, capsys):
    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(tmp_path / "out"), "--tok", TOKEN])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == "lsg-convert: error: unrecognized arguments: --tok: did you mean --token? (see lsg-convert --help)"
    assert sorted(tmp_path.iterdir()) == []


def test_a_hub_sources_license_comes_from_the_hubs_record_in_one_request(tmp_path):
    script = """
        from lsg_converter.sources import source_license
        print("LICENSE", source_license("someone/model"))
        """
    with RecordingHub({"/api/models/someone/model": {"id": "someone/model", "cardData": {"license": "mit"}}}) as hub:
        result = run_process(python_command(script), tmp_path, hub_environment(hub.endpoint, tmp_path / "hf-home"))

    assert result.stdout.split() == ["LICENSE", "mit"], result.stderr
    assert [path for _, path, _ in hub.requests if "someone" in path] == ["/api/models/someone/model"]


# ---------------------------------------------------------------------------------------------- a local folder stays local

LOCAL_SPELLINGS = {  # how the source is named -> the folder the command runs in, relative to the tmp folder
    "mymodel": "work/checkpoints",
    "checkpoints/mymodel": "work",
    "./mymodel": "work/checkpoints",
    "ABSOLUTE": "work",
}


@pytest.fixture
def local_layout(tiny_bert_dir, tmp_path):
    """tmp/work/checkpoints/mymodel: a model folder without README.md."""
    shutil.copytree(tiny_bert_dir, tmp_path / "work" / "checkpoints" / "mymodel")
    return tmp_path


def spelt(spelling, layout):
    return str(layout / "work" / "checkpoints" / "mymodel") if spelling == "ABSOLUTE" else spelling


def requests_of_script(script, cwd, hf_home):
    """Run python `script` in a fresh process whose Hub is a RecordingHub (HF_TOKEN set, HF_HOME
    `hf_home`); it must succeed. Returns its output and the requests the Hub received."""
    with RecordingHub() as hub:
        result = run_process(python_command(script), cwd, hub_environment(hub.endpoint, hf_home, token=TOKEN))
    assert result.returncode == 0, result.stderr
    return result, hub.requests


def test_the_cli_never_asks_the_hub_about_a_local_folder(local_layout):
    runs = [
        (str(local_layout / cwd), [spelt(spelling, local_layout), "--max-len", "256", "--save-path", f"../out-{index}"])
        for index, (spelling, cwd) in enumerate(LOCAL_SPELLINGS.items())
    ]
    script = f"""
        import os
        from lsg_converter_cli import main
        for cwd, argv in {runs!r}:
            os.chdir(cwd)
            assert main(argv) == 0, argv
        """

    _, requests = requests_of_script(script, local_layout, local_layout / "hf-home")

    assert requests == []
    assert files_under(local_layout / "hf-home") == []


def test_the_python_api_never_asks_the_hub_about_a_local_folder(local_layout):
    runs = [(str(local_layout / cwd), spelt(spelling, local_layout)) for spelling, cwd in LOCAL_SPELLINGS.items()]
    script = f"""
        import os
        from lsg_converter import LSGConverter, model_card, save_converted
        from lsg_converter.sources import source_license
        for index, (cwd, source) in enumerate({runs!r}):
            os.chdir(cwd)
            model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(source)
            card = model_card(model, license=source_license(source))
            save_converted(model, tokenizer, {str(local_layout)!r} + f"/out-{{index}}", card=card)
        """

    _, requests = requests_of_script(script, local_layout, local_layout / "hf-home")

    assert requests == []
    assert files_under(local_layout / "hf-home") == []


def test_push_converted_never_asks_the_hub_about_a_local_source(local_layout):
    script = """
        from lsg_converter import HubError, LSGConverter, push_converted
        model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained("mymodel")
        try:
            push_converted(model, tokenizer, "me/mymodel-lsg")
        except HubError as error:
            print("HubError", error)
        """

    result, requests = requests_of_script(script, local_layout / "work" / "checkpoints", local_layout / "hf-home")

    assert "HubError" in result.stdout
    assert requests, "the push itself reaches the stand-in Hub"
    assert [path for _, path, _ in requests if "/mymodel/" in path or path.endswith("/mymodel")] == []


# ---------------------------------------------------------------------------------------------- an unreachable Hub


def assert_one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lsg-convert: error: "), result.stderr
    return lines[0]


def test_an_unreachable_hub_id_source_exits_7_in_one_line_within_15_seconds(tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home", token=TOKEN)

    result = run_process(timed_cli_command("someone/model", "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 7
    assert main_seconds(result) < OFFLINE_SECONDS
    assert "Cannot look up 'someone/model' on the Hub (no folder of that name here)" in line
    assert "is unreachable" in line and line.endswith("give a folder that exists.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-home"]


def test_an_unreachable_hub_id_in_the_cache_is_pointed_to_offline_mode(tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home", token=TOKEN)
    lay_out_as_hub_cache({"config.json": b'{"model_type": "bert"}'}, tmp_path / "hf-home" / "hub", "someone/model")

    result = run_process(cli_command("someone/model", "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 7
    assert "is unreachable" in line
    assert line.endswith("; set HF_HUB_OFFLINE=1 to convert the copy in the Hugging Face cache.")


def test_a_hub_id_the_hub_does_not_have_exits_4(tmp_path):
    with RecordingHub() as hub:
        environment = hub_environment(hub.endpoint, tmp_path / "hf-home", token=TOKEN)
        result = run_process(cli_command("someone/model", "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 4
    assert line == (
        "lsg-convert: error: No folder 'someone/model' here, and no model 'someone/model' on the Hub: "
        "check the name, or pass --token for a private model."
    )
    assert ("GET", "/api/models/someone/model", f"Bearer {TOKEN}") in hub.requests


def test_the_cli_push_to_an_unreachable_hub_exits_7_in_one_line_within_15_seconds(tiny_bert_dir, tmp_path):
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home", token=TOKEN)

    result = run_process(timed_cli_command(tiny_bert_dir, "--max-len", "512", "--push-to-hub", REPO_ID), tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 7
    assert main_seconds(result) < OFFLINE_SECONDS
    assert line.startswith(f"lsg-convert: error: Cannot push to '{REPO_ID}': the Hub at http://127.0.0.1:")
    assert "is unreachable" in line and "--token" in line


def test_the_cli_push_to_a_hub_that_never_answers_exits_7_in_one_line_at_its_deadline(tiny_bert_dir, tmp_path):
    with socket.socket() as silent_server:  # accepts connections (the kernel's backlog), never answers
        silent_server.bind(("127.0.0.1", 0))
        silent_server.listen(16)
        endpoint = f"http://127.0.0.1:{silent_server.getsockname()[1]}"
        environment = {**hub_environment(endpoint, tmp_path / "hf-home", token=TOKEN), HUB_TIMEOUT_VARIABLE: "2"}
        command = timed_cli_command(tiny_bert_dir, "--max-len", "512", "--push-to-hub", REPO_ID)
        result = run_process(command, tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 7
    assert main_seconds(result) < 60  # without a deadline the push waits forever (run_process gives up at 300 s)
    assert line.startswith(f"lsg-convert: error: Cannot push to '{REPO_ID}'") and "ReadTimeout" in line


def test_push_converted_to_an_unreachable_hub_raises_hub_error_within_15_seconds(tiny_bert_dir, tmp_path):
    script = f"""
        import time
        from lsg_converter import HubError, LSGConverter, push_converted
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained({str(tiny_bert_dir)!r})
        start = time.monotonic()
        try:
            push_converted(model, tokenizer, {REPO_ID!r})
        except HubError as error:
            print("SECONDS", time.monotonic() - start)
            print("EXIT_CODE", error.exit_code)
        """
    environment = hub_environment(closed_port_endpoint(), tmp_path / "hf-home", token=TOKEN)

    result = run_process(python_command(script), tmp_path, environment)

    assert result.returncode == 0, result.stderr
    assert "EXIT_CODE 7" in result.stdout
    assert float(result.stdout.split("SECONDS")[1].split()[0]) < OFFLINE_SECONDS


# ---------------------------------------------------------------------------------------------- failing downloads

REVISION = "1" * 40


class FileHub(RecordingHub):
    """A stand-in for the Hub that lists and serves the files of `folder` as model 'someone/model'
    (its record, an empty listing of any of its folders, each file's metadata and content at any
    revision, 404 EntryNotFound for a file it does not have), answering the files of `failing` with
    `status` instead."""

    def __init__(self, folder: Path, failing: tuple[str, ...] = (), status: int = 500) -> None:
        files = {path.relative_to(folder).as_posix(): path.read_bytes() for path in files_under(folder)}
        record = {"id": "someone/model", "sha": REVISION, "siblings": [{"rfilename": name} for name in files]}
        super().__init__({"/api/models/someone/model": record})
        answer_record, requests = self.server.RequestHandlerClass.do_GET, self.requests
        file_path = re.compile(r"/someone/model/resolve/[^/]+/(.+)")

        def answer(handler, status: int, body: bytes, headers: dict[str, str]) -> None:
            handler.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                handler.send_header(key, value)
            handler.end_headers()
            if handler.command == "GET":
                handler.wfile.write(body)

        def do_GET(handler) -> None:
            path = handler.path.partition("?")[0]
            match = file_path.fullmatch(path)
            if path.startswith("/api/models/someone/model/tree/"):
                requests.append((handler.command, path, handler.headers.get("Authorization")))
                return answer(handler, 200, b"[]", {"Content-Type": "application/json"})
            if match is None:
                return answer_record(handler)
            requests.append((handler.command, path, handler.headers.get("Authorization")))
            name = match[1]
            if name not in files:
                return answer(handler, 404, b"", {"X-Error-Code": "EntryNotFound"})
            if name in failing:
                return answer(handler, status, b'{"error": "failed"}', {"Content-Type": "application/json"})
            body = files[name]
            etag = f'"{hashlib.sha256(body).hexdigest()}"'
            answer(handler, 200, body, {"X-Repo-Commit": REVISION, "ETag": etag})

        self.server.RequestHandlerClass.do_GET = self.server.RequestHandlerClass.do_HEAD = do_GET


def test_a_hub_id_whose_files_download_converts_reading_only_the_weights_its_record_lists(tiny_bert_dir, tmp_path):
    with FileHub(tiny_bert_dir) as hub:
        environment = hub_environment(hub.endpoint, tmp_path / "hf-home", token=TOKEN)
        result = run_process(cli_command("someone/model", "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()
    weight_requests = {path.rpartition("/")[2] for _, path, _ in hub.requests if "/resolve/" in path}
    assert not weight_requests & {"pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


@pytest.mark.parametrize(
    "failing, status",
    [("model.safetensors", 500), ("model.safetensors", 403), ("tokenizer.json", 500)],
    ids=["weights-fail", "weights-refused", "tokenizer-fails"],
)
def test_a_failing_download_after_the_lookup_exits_7_in_one_line_within_15_seconds(
    tiny_bert_dir, tmp_path, failing, status
):
    with FileHub(tiny_bert_dir, failing=(failing,), status=status) as hub:
        environment = hub_environment(hub.endpoint, tmp_path / "hf-home", token=TOKEN)
        result = run_process(timed_cli_command("someone/model", "--max-len", "512", "--save-path", "out"), tmp_path, environment)

    line = assert_one_error_line(result)
    assert result.returncode == 7
    assert main_seconds(result) < OFFLINE_SECONDS
    assert f"Cannot download {failing} of 'someone/model': the Hub answered HTTP {status}" in line
    assert not (tmp_path / "out").exists()


def test_the_cards_license_reads_the_record_the_conversion_looked_up(tiny_bert_dir, tmp_path):
    script = """
        import os, urllib.error, urllib.request
        from lsg_converter import LSGConverter
        from lsg_converter.sources import source_license
        LSGConverter(max_sequence_length=512).convert_from_pretrained("someone/model")
        try:
            urllib.request.urlopen(os.environ["HF_ENDPOINT"] + "/after-the-conversion")
        except urllib.error.HTTPError:
            pass
        source_license("someone/model")
        """
    with FileHub(tiny_bert_dir) as hub:
        environment = hub_environment(hub.endpoint, tmp_path / "hf-home", token=TOKEN)
        result = run_process(python_command(script), tmp_path, environment)

    assert result.returncode == 0, result.stderr
    paths = [path.partition("?")[0] for _, path, _ in hub.requests]
    before, after = paths[: paths.index("/after-the-conversion")], paths[paths.index("/after-the-conversion") :]
    assert "/api/models/someone/model" in before
    assert "/api/models/someone/model" not in after
