"""Helpers shared by the test modules: tiny source models of every architecture, inputs, processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from lsg_converter.models.lsg_model import LSG_DEFAULTS

# Checkpoints the 2023 reference converted, with its outputs (see fixtures/README.md); part of the repository.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reference-lsg-0.1.9"
REFERENCE_CASES = ("bart-norm", "bert-norm", "bert-pooling", "distilbert-none", "roberta-pooling")
VOCAB = 99
TINY_LENGTH = 128  # tokens the tiny sources read (RoBERTa's table has 2 more rows)
PAD_ID = {
    "bert": 0, "distilbert": 0, "roberta": 1, "bart": 1, "albert": 0, "electra": 0, "camembert": 1, "xlm-roberta": 1,
    "mbart": 1, "pegasus": 0,
}
EOS_ID = 2
SHARED = dict(vocab_size=VOCAB)
TINY_CONFIGS = {
    "bert": lambda: transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "roberta": lambda: transformers.RobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "distilbert": lambda: transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=TINY_LENGTH, **SHARED
    ),
    # ALBERT and ELECTRA factorise their embeddings: global tokens live in the narrower embedding space
    "albert": lambda: transformers.AlbertConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "electra": lambda: transformers.ElectraConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "camembert": lambda: transformers.CamembertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "bart": lambda: transformers.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "mbart": lambda: transformers.MBartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, scale_embedding=True, **SHARED,
    ),
    "pegasus": lambda: transformers.PegasusConfig(  # pad 0, eos 1 as in google/pegasus-*
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, scale_embedding=True, **SHARED,
    ),
}


def lsg_config(**overrides) -> SimpleNamespace:
    """The LSG keys alone (the reference defaults with `overrides`), as the attention core reads them."""
    return SimpleNamespace(**{**LSG_DEFAULTS, **overrides})


def padding_mask(lengths, total) -> torch.Tensor:
    """(B, total) bool: row i is True on its first lengths[i] positions."""
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def is_causal_head(head: str) -> bool:
    return head.endswith(("LMHeadModel", "ForCausalLM"))


def save_tiny_source(folder: Path, arch: str, head: str, seed: int = 0) -> Path:
    """A tiny random `head` of `arch` saved with save_pretrained (no tokenizer)."""
    config = TINY_CONFIGS[arch]()
    config.is_decoder = is_causal_head(head)
    # question answering needs 2 labels (start, end); 3 elsewhere, as BART reads a 2-label config as 3
    config.num_labels = 2 if head.endswith("QuestionAnswering") else 3
    torch.manual_seed(seed)
    getattr(transformers, head)(config).save_pretrained(folder)
    return folder


def padded_batch(lengths, total, arch="bert", seed=0):
    """(input_ids, attention_mask): random tokens (no pad/eos ids), each row ending in eos, right padding."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (len(lengths), total), generator=generator)
    attention_mask = (torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = EOS_ID
    return input_ids.masked_fill(attention_mask == 0, PAD_ID[arch]), attention_mask


def run_without_lsg_converter(script: str, cwd: Path) -> subprocess.CompletedProcess:
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


class OpRecorder(TorchDispatchMode):
    """Records every torch operation that runs under it (forward and backward): its name and the sizes
    of the tensors it produced (none for views, which produce no new memory)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        outputs = [] if func.is_view else result if isinstance(result, (tuple, list)) else [result]
        self.ops.append((func.overloadpacket.__name__, [t.numel() for t in outputs if isinstance(t, torch.Tensor)]))
        return result

    @property
    def largest(self) -> int:
        """Element count of the largest tensor any operation produced."""
        return max((size for _, sizes in self.ops for size in sizes), default=0)

    def count(self, name: str) -> int:
        """How many times the aten operation `name` (e.g. "_softmax") ran."""
        return sum(op == name for op, _ in self.ops)

    def outputs_of_at_least(self, elements: int) -> list[str]:
        """Names of the operations that produced a tensor of at least `elements` elements."""
        return [name for name, sizes in self.ops if any(size >= elements for size in sizes)]


def reference_cases() -> list[str]:
    """Names of the checkpoints the 2023 reference converted, under FIXTURES: all of REFERENCE_CASES,
    or the test collection fails (a missing fixture must not shrink the suite silently)."""
    found = sorted(case.name for case in FIXTURES.glob("*") if (case / "case.json").is_file())
    assert found == sorted(REFERENCE_CASES), f"{FIXTURES} holds {found}, expected {sorted(REFERENCE_CASES)}"
    return found


def assert_reproduces_reference(model, case: str) -> None:
    """`model`'s outputs on the fixture's inputs equal the reference's within 1e-4 (real tokens)."""
    reference = load_file(FIXTURES / case / "reference_io.safetensors")
    inputs = {name: reference[name] for name in ("input_ids", "attention_mask", "decoder_input_ids") if name in reference}
    real = reference["attention_mask"].bool()
    with torch.no_grad():
        output = model(**inputs)
    if "encoder_last_hidden_state" in reference:  # seq2seq: the encoder output keeps its global tokens
        num_global = output.encoder_last_hidden_state.shape[1] - real.shape[1]
        encoder_real = torch.nn.functional.pad(real, (num_global, 0), value=True)
        assert (output.logits - reference["logits"]).abs().max() <= 1e-4
        difference = output.encoder_last_hidden_state - reference["encoder_last_hidden_state"]
        assert difference[encoder_real].abs().max() <= 1e-4
    else:
        with torch.no_grad():
            sequence_output = model.base_model(**inputs).last_hidden_state
        assert (output.logits - reference["logits"])[real].abs().max() <= 1e-4
        assert (sequence_output - reference["sequence_output"])[real].abs().max() <= 1e-4
