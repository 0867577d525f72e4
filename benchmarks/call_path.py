"""The call path of one LSG attention call (issue 67): how many functions of lsg_converter/models/ it enters
and how many times it crosses from one of those files to another.

    python benchmarks/call_path.py                  # the table: every backend, sparsity, mode and input
    python benchmarks/call_path.py --backends sdpa --sparsity none --modes inference --inputs padded --list
    PYTHONPATH=/path/to/another/checkout python benchmarks/call_path.py   # that tree's lsg_converter

The model: a tiny random BertModel (hidden 32, 4 heads, 1 layer, 128 positions) converted with
`LSGConverter` to 128 tokens in blocks of 16 (one global token, the library's default), with no sparse keys
(sparsity_type "none", sparse_block_size 0) or with "norm" sparse keys (sparse blocks of 16, factor 2). The
inputs (`INPUTS`), 128 tokens each: one unpadded row (``1 row``), two unpadded rows (``2 rows``), two rows
of which the second holds 100 real tokens and 28 of padding (``padded``). The modes: ``inference`` (eval
mode, no gradients) and ``training`` (train mode, gradients on, the forward pass only); flex_attention runs
without gradients only (on the CPU it has no backward pass).

One forward pass of the case's input warms every cache, then a second one runs under `sys.setprofile`,
which records the first call of `registered_attention_forward` (the function transformers' attention
layer dispatches to, registered with its AttentionInterface), from its entry to its return:

* functions: the distinct functions defined with ``def`` (functions, methods, properties, nested
  functions) whose file lies in lsg_converter/models/ and that the call enters, itself included; a
  lambda, comprehension or generator expression is counted as part of the function that holds it (in
  Python 3.12 and later a list, dict or set comprehension has no code object of its own, so counting
  them would make the figure depend on the Python version);
* code objects: the same with the lambdas, comprehensions and generator expressions counted too
  (Python 3.11: every one has its own code object);
* transitions: the calls that cross from one file of models/ to another: every call (a generator's
  resumption included, as the profiler reports it) of a code object of models/ whose nearest caller of
  models/ lies in another file, the nearest caller being the closest frame below it on the stack whose
  file lies in models/ (frames of torch, transformers or the standard library in between skipped). The
  entry call counts too: with LSG-BERT its nearest caller of models/ is the layer that runs transformers'
  BertLayer (at a5de2e9, `RecordsTokenStates.forward` in lsg_global_tokens.py). Returns are not counted:
  each goes back along a call counted.

Calibration against the figures of issue 67, measured on a5de2e9 (PYTHONPATH on a worktree of that
commit; torch 2.13 CPU, transformers 5.24, Python 3.11): the transitions above are the issue's exactly,
34 without sparse keys and 30 with norm sparse keys, in sdpa inference on ``1 row`` (without sparse
keys, on ``2 rows`` and ``padded`` the CPU flash kernel's window views run too: 39; norm on ``padded``:
32). No definition of the functions tried (every code object; without generator expressions, lambdas,
comprehensions or nested functions, alone or together; by name), on any of these inputs, modes, caches
warm or cold, gives both of the issue's 56 and 67: the one above gives 58 and 60 (code objects: 69 and
72). ``--list`` prints, in the order of their first entry, the code objects entered with their file,
line and number of calls (those not counted as functions marked), then each transition.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable

import torch
import transformers

import lsg_converter
from lsg_converter import LSGConverter
from lsg_converter.models import lsg_attention

MODELS_FOLDER = Path(lsg_attention.__file__).resolve().parent
BACKENDS = ("sdpa", "eager", "flex_attention")
SPARSITY_TYPES = ("none", "norm")
MODES = ("inference", "training")
LENGTH, BLOCK, VOCAB = 128, 16, 99
INPUTS: dict[str, tuple[int, ...]] = {"1 row": (LENGTH,), "2 rows": (LENGTH, LENGTH), "padded": (LENGTH, 100)}
# code object names of what is not a function of its own: lambdas, comprehensions, generator expressions
ANONYMOUS_NAMES = ("<lambda>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


@dataclass(frozen=True)
class FunctionEntered:
    """A code object the call entered: its `file` (relative to the folder recorded), qualified `name`,
    first `line` and the number of `calls` (a generator's resumptions included)."""

    file: str
    name: str
    line: int
    calls: int

    @property
    def is_function(self) -> bool:
        """Whether it is a function defined with ``def`` (not a lambda, comprehension or generator expression)."""
        return self.name.rsplit(".", 1)[-1] not in ANONYMOUS_NAMES


@dataclass(frozen=True)
class Transition:
    """A call from `caller` to `callee` ("file:qualified name" each), two files of the folder recorded."""

    caller: str
    callee: str


@dataclass(frozen=True)
class CallPath:
    """What one call entered in a folder: the code objects in the order of their first entry, and the
    calls between two of its files in the order they were made."""

    entered: tuple[FunctionEntered, ...]
    transitions: tuple[Transition, ...]

    @property
    def functions(self) -> int:
        """The distinct functions defined with ``def`` entered."""
        return sum(entry.is_function for entry in self.entered)

    @property
    def code_objects(self) -> int:
        """The distinct code objects entered (lambdas, comprehensions and generator expressions too)."""
        return len(self.entered)


@dataclass(frozen=True)
class Case:
    """One measured call: the model's attention `backend`, its `sparsity_type`, the `mode` ("inference"
    or "training") and the input (`input_name`, a key of `INPUTS`)."""

    backend: str
    sparsity_type: str
    mode: str
    input_name: str

    def __str__(self) -> str:
        return f"{self.backend}, {self.sparsity_type}, {self.mode}, {self.input_name}"


def qualified_name(code: CodeType) -> str:
    """The qualified name of `code`'s function ("Class.method", "function.<locals>.<lambda>"); its bare
    name before Python 3.11."""
    return getattr(code, "co_qualname", code.co_name)


def record_call_path(run: Callable[[], Any], entry: CodeType, folder: Path) -> CallPath:
    """Run `run` and record, by `sys.setprofile`, the first call of `entry` (a code object of `folder`)
    from its entry to its return: the code objects of `folder` it entered and the calls between two files
    of `folder` (see the module's docstring)."""
    prefix = str(folder.resolve()) + os.sep
    calls: dict[CodeType, int] = {}
    crossings: list[tuple[CodeType, CodeType]] = []
    recording: list[FrameType] = []  # the entry's frame while it runs
    finished = False

    def caller_in_folder(frame: FrameType) -> CodeType | None:
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(prefix):
            caller = caller.f_back
        return None if caller is None else caller.f_code

    def profile(frame: FrameType, event: str, _: Any) -> None:
        nonlocal finished
        if finished or event not in ("call", "return"):
            return
        code = frame.f_code
        if not recording:
            if event != "call" or code is not entry:
                return
            recording.append(frame)
        elif event == "return":
            if frame is recording[0]:
                finished = True
            return
        if not code.co_filename.startswith(prefix):
            return
        calls[code] = calls.get(code, 0) + 1
        caller = caller_in_folder(frame)
        if caller is not None and caller.co_filename != code.co_filename:
            crossings.append((caller, code))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    if not recording:
        raise RuntimeError(f"{qualified_name(entry)} was not called")

    def where(code: CodeType) -> str:
        return str(Path(code.co_filename).resolve().relative_to(folder.resolve()))

    entered = tuple(FunctionEntered(where(code), qualified_name(code), code.co_firstlineno, count) for code, count in calls.items())
    transitions = tuple(Transition(f"{where(a)}:{qualified_name(a)}", f"{where(b)}:{qualified_name(b)}") for a, b in crossings)
    return CallPath(entered, transitions)


@functools.lru_cache(maxsize=None)
def tiny_lsg_bert(sparsity_type: str) -> transformers.PreTrainedModel:
    """A 1-layer LSG-BERT for `LENGTH` tokens in blocks of `BLOCK`, converted by `LSGConverter` from a tiny
    random BertModel: no sparse keys ("none") or sparse blocks of `BLOCK`, factor 2 (any other type)."""
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=LENGTH, vocab_size=VOCAB,
    )
    sparse = {"sparse_block_size": 0} if sparsity_type == "none" else {"sparse_block_size": BLOCK, "sparsity_factor": 2}
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(folder)
        converter = LSGConverter(max_sequence_length=LENGTH)
        model, _ = converter.convert_from_pretrained(folder, block_size=BLOCK, sparsity_type=sparsity_type, **sparse)
    return model


def model_inputs(name: str) -> dict[str, torch.Tensor]:
    """Random token ids and the padding mask of the input `name` of `INPUTS` (right padding)."""
    real_tokens = torch.tensor(INPUTS[name])
    input_ids = torch.randint(3, VOCAB, (len(real_tokens), LENGTH), generator=torch.Generator().manual_seed(0))
    attention_mask = (torch.arange(LENGTH)[None, :] < real_tokens[:, None]).long()
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask}


def measure(case: Case) -> CallPath:
    """The call path of the attention call of `case` (caches warmed by a first forward pass; dropout's
    draws from a fixed seed, the global generator left as it was). The garbage collector runs before the
    measured forward pass and is paused during it: no callback of what an earlier pass left (a weak
    reference's) runs inside the call at the collector's whim."""
    model = tiny_lsg_bert(case.sparsity_type)
    model.set_attn_implementation(case.backend)
    training = case.mode == "training"
    model.train(training)
    inputs = model_inputs(case.input_name)
    with torch.set_grad_enabled(training), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model(**inputs)
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            return record_call_path(lambda: model(**inputs), lsg_attention.registered_attention_forward.__code__, MODELS_FOLDER)
        finally:
            if collecting:
                gc.enable()


def cases(backends: list[str], sparsity_types: list[str], modes: list[str], input_names: list[str]) -> list[Case]:
    """Every combination asked for, flex_attention in inference only."""
    return [
        Case(backend, sparsity_type, mode, name)
        for backend in backends
        for sparsity_type in sparsity_types
        for mode in modes
        if backend != "flex_attention" or mode == "inference"
        for name in input_names
    ]


def listing(path: CallPath) -> str:
    """The code objects entered (in the order of their first entry) and the transitions, one a line."""
    lines = ["| # | file | code object | line | calls | function |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {index} | {entry.file} | `{entry.name}` | {entry.line} | {entry.calls} | {'yes' if entry.is_function else 'no'} |"
        for index, entry in enumerate(path.entered, 1)
    ]
    lines += ["", "transitions:"]
    lines += [f"{index:>4}. {transition.caller} -> {transition.callee}" for index, transition in enumerate(path.transitions, 1)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--sparsity", nargs="+", choices=SPARSITY_TYPES, default=list(SPARSITY_TYPES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--inputs", nargs="+", choices=list(INPUTS), default=list(INPUTS))
    parser.add_argument("--list", action="store_true", help="print each case's code objects and transitions")
    args = parser.parse_args()

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("lsg_converter").setLevel(logging.ERROR)
    print(
        f"lsg_converter from {Path(lsg_converter.__file__).parent}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, Python {sys.version.split()[0]}\n"
    )
    rows = []
    for case in cases(args.backends, args.sparsity, args.modes, args.inputs):
        path = measure(case)
        rows.append(f"| {case} | {path.functions} | {path.code_objects} | {len(path.transitions)} |")
        if args.list:
            print(f"### {case}\n\n{listing(path)}\n")
    print("| backend, sparsity, mode, input | functions | code objects | transitions |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
