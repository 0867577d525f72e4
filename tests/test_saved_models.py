"""Models saved by earlier releases keep working: every set under tests/fixtures/saved-models/ (one per
release, written by tests/make_saved_models.py) loads through its own saved code on the installed
transformers, in a process without lsg_converter, and gives the outputs recorded when it was saved."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import run_without_lsg_converter

pytestmark = pytest.mark.compat

SAVED_MODELS = Path(__file__).resolve().parent / "fixtures" / "saved-models"
CASES = sorted(path.parent for path in SAVED_MODELS.glob("*/*/case.json"))
TOLERANCE = 1e-5

LOAD_EVERY_CASE = """
import json, sys, torch, transformers
from safetensors.torch import load_file

results = {}
for folder in sys.argv[1:]:
    case = json.load(open(f"{folder}/case.json"))
    model = getattr(transformers, case["auto_class"]).from_pretrained(folder, trust_remote_code=True).eval()
    recorded = load_file(f"{folder}/outputs.safetensors")
    inputs = {name: recorded[name] for name in ("input_ids", "attention_mask", "decoder_input_ids") if name in recorded}
    with torch.no_grad():
        logits = model(**inputs).logits
        result = {
            "module": type(model).__module__,
            "class": type(model).__name__,
            "logits": (logits - recorded["logits"]).abs().max().item(),
        }
        if "generated_ids" in recorded:
            expected = recorded["generated_ids"]
            prompt = expected[:, :40]
            generated = model.generate(
                prompt, max_new_tokens=expected.shape[1] - 40, min_new_tokens=expected.shape[1] - 40, do_sample=False
            )
            result["same_generation"] = torch.equal(generated, expected)
    results[folder] = result
print("RESULTS" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, dict]:
    """What each saved case gave, loaded without lsg_converter: folder -> result. One process per release
    (transformers names a folder's code module after the folder, and every release has the same case names)."""
    results = {}
    for release in sorted({case.parent for case in CASES}):
        folders = [str(case) for case in CASES if case.parent == release]
        script = LOAD_EVERY_CASE.replace("sys.argv[1:]", repr(folders))
        process = run_without_lsg_converter(script, cwd=tmp_path_factory.mktemp(release.name))
        assert process.returncode == 0, process.stderr[-3000:]
        results.update(json.loads(process.stdout.split("RESULTS", 1)[1]))
    return results


def test_every_release_set_holds_the_five_families():
    releases = sorted({case.parent.name for case in CASES})
    assert releases, "no saved models under tests/fixtures/saved-models"
    for release in releases:
        names = {case.name for case in CASES if case.parent.name == release}
        assert {"bert-masked-lm", "mpnet-masked-lm", "deberta-v3-masked-lm", "bart-conditional-generation",
                "bert-causal-lm"} <= names, release


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.parent.name}/{case.name}")
def test_saved_model_loads_through_its_own_code_and_gives_its_recorded_outputs(case, loaded):
    result = loaded[str(case)]
    recorded = json.loads((case / "case.json").read_text())
    assert result["module"].startswith("transformers_modules"), result["module"]
    assert result["class"] == recorded["class"]
    assert result["logits"] <= TOLERANCE, f"{case.name}: logits differ by {result['logits']:.2e}"


@pytest.mark.parametrize("case", [case for case in CASES if "causal" in case.name], ids=lambda case: case.parent.name)
def test_saved_causal_model_generates_its_recorded_tokens_with_its_cache(case, loaded):
    assert loaded[str(case)]["same_generation"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.parent.name}/{case.name}")
def test_saved_model_converted_again_at_its_length_carries_the_current_code_and_the_same_outputs(case, tmp_path):
    """What the version warning advises (`lsg-convert <model> --max-len <same>`): the re-saved model
    holds this release's remote code and gives the outputs recorded when it was first saved."""
    import torch
    from safetensors.torch import load_file

    from lsg_converter import LSGConverter, save_converted

    max_length = json.loads((case / "case.json").read_text())["max_sequence_length"]
    model, _ = LSGConverter(max_sequence_length=max_length).convert_from_pretrained(str(case))
    folder = save_converted(model, None, tmp_path / "resaved")
    recorded = load_file(case / "outputs.safetensors")
    inputs = {name: recorded[name] for name in ("input_ids", "attention_mask", "decoder_input_ids") if name in recorded}
    with torch.no_grad():
        logits = model.eval()(**inputs).logits

    assert (real_rows(logits, inputs) - real_rows(recorded["logits"], inputs)).abs().max().item() <= TOLERANCE
    package_code = Path(lsg_transformers_file()).parent
    for code in folder.glob("*.py"):
        assert code.read_text() == (package_code / code.name).read_text(), code.name


def real_rows(logits, inputs):
    """The logits of the real tokens: an encoder's rows of padding are no output (since 0.5.0 those in blocks
    of padding only are zero); a decoder's rows (as many as its inputs) are all real."""
    mask = inputs.get("attention_mask")
    if mask is None or logits.dim() < 3 or logits.shape[1] != mask.shape[1]:
        return logits
    return logits[inputs["attention_mask"].bool()]


def lsg_transformers_file() -> str:
    from lsg_converter.models import lsg_transformers

    return lsg_transformers.__file__


def test_a_saved_model_on_a_transformers_outside_its_tested_range_says_so_once(tmp_path):
    """The saved code's own check: a copy whose recorded range ends before the installed transformers
    loads, runs twice, and logs the warning once, naming both versions and how to re-save."""
    import shutil

    case = next(case for case in CASES if case.name == "bert-masked-lm")
    folder = shutil.copytree(case, tmp_path / "old-range")
    code = folder / "lsg_transformers.py"
    code.write_text(re.sub(r"TESTED_TRANSFORMERS = \([^)]*\)", 'TESTED_TRANSFORMERS = ("1.0.0", "1.1.0")', code.read_text()))

    process = run_without_lsg_converter(
        f"""
        import torch, transformers
        from safetensors.torch import load_file
        recorded = load_file({str(folder / "outputs.safetensors")!r})
        for _ in range(2):
            model = transformers.AutoModelForMaskedLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
            with torch.no_grad():
                model(input_ids=recorded["input_ids"][:, :40])
        """,
        cwd=tmp_path,
    )

    assert process.returncode == 0, process.stderr[-2000:]
    warnings = [line for line in process.stderr.splitlines() if "tested with transformers 1.0.0 to 1.1.0" in line]
    assert len(warnings) == 1, process.stderr[-2000:]
    assert "is newer" in warnings[0] and "lsg-convert <model> --max-len" in warnings[0]


def test_two_saved_models_with_different_code_each_run_their_own_attention_in_one_process(tmp_path):
    """transformers' attention registry is one dictionary per process: a model saved by another release,
    loaded after one of this release, must not replace the attention the first one runs."""
    import shutil

    from helpers import save_tiny_source
    from lsg_converter import LSGConverter, save_converted

    source = save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")
    model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        str(source), block_size=16, sparse_block_size=16, sparsity_type="pooling"
    )
    first = save_converted(model, tokenizer, tmp_path / "first")
    second = shutil.copytree(first, tmp_path / "second")  # another release's code: its attention output doubled
    code = second / "lsg_attention.py"
    returned = "    return output.transpose(1, 2).contiguous(), weights\n"
    assert code.read_text().count(returned) == 1
    code.write_text(code.read_text().replace(returned, returned.replace("return output", "return 2 * output")))

    process = run_without_lsg_converter(
        f"""
        import torch, transformers
        load = lambda folder: transformers.AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
        input_ids = torch.randint(5, 90, (1, 200))
        with torch.no_grad():
            first = load({str(first)!r})
            before = first(input_ids=input_ids).logits
            second = load({str(second)!r})
            print("SECOND_DIFFERS", not torch.allclose(second(input_ids=input_ids).logits, before))
            print("FIRST_UNCHANGED", torch.equal(first(input_ids=input_ids).logits, before))
        """,
        cwd=tmp_path,
    )

    assert process.returncode == 0, process.stderr[-2000:]
    assert "SECOND_DIFFERS True" in process.stdout, process.stdout
    assert "FIRST_UNCHANGED True" in process.stdout, process.stdout
