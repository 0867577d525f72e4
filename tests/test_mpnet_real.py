"""LSG-MPNet on the real all-mpnet-base-v2 (five PyPI parts, assembled once: benchmarks/real_models.py).

Slow: a 438 MB model. Still run in CI.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import REPO_ROOT, run_without_lsg_converter
from lsg_converter import LSGConverter, save_converted

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import bench_extrapolation  # noqa: E402
from real_models import all_mpnet_base_v2_path  # noqa: E402

TEXTS = ["The sea was calm that night.", "A play by Shakespeare, in five acts.", "short"]


@pytest.fixture(scope="module")
def mpnet_path():
    return all_mpnet_base_v2_path()


def test_sentence_transformers_embeds_as_the_source_without_lsg_converter_installed(mpnet_path, tmp_path):
    from sentence_transformers import SentenceTransformer

    model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained(
        str(mpnet_path), num_global_tokens=0, block_size=512, sparsity_type="none"
    )
    folder = save_converted(model, tokenizer, tmp_path / "all-mpnet-base-v2-lsg-4096")
    expected = SentenceTransformer(str(mpnet_path)).encode(TEXTS, convert_to_tensor=True)
    torch.save(expected, tmp_path / "expected.pt")

    result = run_without_lsg_converter(
        f"""
        import torch
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({str(folder)!r}, trust_remote_code=True)
        assert type(model[0].auto_model).__name__ == "LSGMPNetModel", type(model[0].auto_model)
        embeddings = model.encode({TEXTS!r}, convert_to_tensor=True)
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        print((embeddings - expected).abs().max().item())
        """,
        tmp_path,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-5


def test_at_4096_tokens_the_defaults_read_a_play_at_least_as_well_as_independent_chunks():
    rows, _ = bench_extrapolation.evaluate(
        4096, 1, [bench_extrapolation.DEFAULTS], full_attention=False, source_name="all-mpnet-base-v2"
    )
    token = {name: value for name, value, _ in rows}

    assert token[f"lsg {bench_extrapolation.DEFAULTS}"] >= token[bench_extrapolation.CHUNKS]


def test_a_16384_token_forward_stays_within_3_gib_above_the_loaded_model(mpnet_path, tmp_path):
    model, _ = LSGConverter(max_sequence_length=16384).convert_from_pretrained(str(mpnet_path))
    folder = save_converted(model, None, tmp_path / "all-mpnet-base-v2-lsg-16384")
    script = textwrap.dedent(
        f"""
        import json, re, torch
        from pathlib import Path
        from transformers import AutoModel

        def resident_kib(field):
            return int(re.search(rf"^{{field}}:\\s+(\\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))

        model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        input_ids = torch.randint(1000, 30000, (1, 16384))
        with torch.no_grad():
            model(input_ids=input_ids[:, :1024])  # settle lazy allocations
            baseline = resident_kib("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")
            output = model(input_ids=input_ids).last_hidden_state
        print(json.dumps({{"shape": list(output.shape), "peak_mib": (resident_kib("VmHWM") - baseline) / 1024}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])

    assert measured["shape"] == [1, 16384, 768]
    assert measured["peak_mib"] < 3 * 1024, measured
