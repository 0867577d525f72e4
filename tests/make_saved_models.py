"""Write this release's set of saved LSG models: tests/fixtures/saved-models/lsg-<version>/<case>/.

Each case is a tiny conversion saved as a user saves one (weights, config, remote code), with
``outputs.safetensors``: fixed inputs and the outputs the model gave when it was saved. One case per
architecture family: absolute positions (BERT), a relative bias (MPNet), disentangled attention
(DeBERTa-v3), an encoder-decoder (BART) and a causal head decoding with its cache (BERT).
tests/test_saved_models.py loads every release's set through its own saved code, on the installed
transformers, without lsg_converter, and compares the outputs. Each release adds its set:

    python tests/make_saved_models.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import padded_batch, save_tiny_source  # noqa: E402

from lsg_converter import LSGConverter, __version__, save_converted  # noqa: E402

SAVED_MODELS = Path(__file__).resolve().parent / "fixtures" / "saved-models"
MAX_LENGTH = 512
INPUT_LENGTH, PADDED_LENGTH = 300, 260  # > 2 blocks of 16: the blocked LSG path, one row padded
NEW_TOKENS = 12  # greedy tokens the causal case generates with its cache
# case -> (architecture, head, its Auto class, LSG settings)
CASES = {
    "bert-masked-lm": (
        "bert", "BertForMaskedLM", "AutoModelForMaskedLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="norm", num_global_tokens=2),
    ),
    "mpnet-masked-lm": (
        "mpnet", "MPNetForMaskedLM", "AutoModelForMaskedLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="pooling", num_global_tokens=2),
    ),
    "deberta-v3-masked-lm": (
        "deberta-v2", "DebertaV2ForMaskedLM", "AutoModelForMaskedLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="stride", num_global_tokens=1),
    ),
    "bart-conditional-generation": (
        "bart", "BartForConditionalGeneration", "AutoModelForSeq2SeqLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="lsh", num_global_tokens=2),
    ),
    "t5-conditional-generation": (
        "t5", "T5ForConditionalGeneration", "AutoModelForSeq2SeqLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="norm", num_global_tokens=2),
    ),
    "umt5-token-classification": (
        "umt5", "UMT5ForTokenClassification", "AutoModelForTokenClassification",
        dict(block_size=16, sparse_block_size=16, sparsity_type="pooling", num_global_tokens=1),
    ),
    "bert-causal-lm": (
        "bert", "BertLMHeadModel", "AutoModelForCausalLM",
        dict(block_size=16, sparse_block_size=16, sparsity_type="pooling", num_global_tokens=1),
    ),
}


def save_case(folder: Path, arch: str, head: str, auto_class: str, settings: dict) -> None:
    """Convert a tiny `head` of `arch`, save it into `folder` with its inputs and outputs."""
    with tempfile.TemporaryDirectory() as scratch:
        source = save_tiny_source(Path(scratch) / "source", arch, head)
        model, _ = LSGConverter(max_sequence_length=MAX_LENGTH).convert_from_pretrained(source, **settings)
    model.eval()
    input_ids, attention_mask = padded_batch([INPUT_LENGTH, PADDED_LENGTH], INPUT_LENGTH, arch, seed=1)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask}
    if model.config.is_encoder_decoder:
        tensors["decoder_input_ids"] = input_ids[:, :16]
    with torch.no_grad():
        tensors["logits"] = model(**tensors).logits
        if model.config.is_decoder:
            prompt = input_ids[:1, :40]
            tensors["generated_ids"] = model.generate(
                prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True
            )
    save_converted(model, None, folder)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / "outputs.safetensors")
    case = {
        "auto_class": auto_class,
        "class": type(model).__name__,
        "max_sequence_length": MAX_LENGTH,
        "lsg_converter": __version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
    }
    (folder / "case.json").write_text(json.dumps(case, indent=2) + "\n")


def main() -> None:
    release = SAVED_MODELS / f"lsg-{__version__}"
    if release.exists():
        shutil.rmtree(release)
    for name, (arch, head, auto_class, settings) in CASES.items():
        save_case(release / name, arch, head, auto_class, settings)
        print(f"saved {release / name}")


if __name__ == "__main__":
    main()
