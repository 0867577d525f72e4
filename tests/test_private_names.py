"""Every private torch or transformers name the remote code touches goes through lsg_transformers.

A private name is an identifier with one leading underscore (``_check``, ``_init_weights``) that belongs to
torch or transformers: an import from a private module (``torch._inductor``), an attribute chain that starts
at torch, transformers or a name imported from them (``torch._dynamo``, ``torch.ops.aten._...`` read with
getattr), or a private attribute of the objects every file meets (tensors, modules, models, configs) or of
the torch and transformers classes the file's own classes subclass, read, written, called or named in a
string. Another file of lsg_converter/models/ may name one only to define it in a class body, where
`PRIVATE_NAMES` (the table of every private name the remote code relies on, with what LSG does with it)
lists it as overridden; every name in that table exists in the installed torch and transformers, and
is still overridden or reached.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
import torch
import transformers

from lsg_converter.models import lsg_transformers


class PrivateName(NamedTuple):
    """A private torch or transformers name the remote code relies on."""

    path: str  # where it lives, importable: "torch._check", "transformers.PreTrainedModel._init_weights"
    purpose: str  # what LSG does with it, and through what function or name of lsg_transformers
    overridden: bool = False  # an LSG class defines it (the one way another file of models/ may name it)


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "torch._check",
        "shape_check: lsg_attention tells torch.export that an exported input holds at least two blocks",
    ),
    PrivateName(
        "torch._inductor.compile_fx.compile_fx",
        "inductor_compile: lsg_flex's compiled flex_attention runs inductor through a backend that counts its compiles",
    ),
    PrivateName(
        "torch._dynamo.exc.TorchDynamoException",
        "compile_error: what a failed compile of lsg_flex's flex_attention raises (inductor's errors derive from it)",
    ),
    PrivateName(
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
        "CPU_FLASH_ATTENTION: the CPU flash kernel, which also returns each query's log-sum-exp (lsg_sdpa's "
        "window views join their local and global keys through it)",
    ),
    PrivateName(
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "CPU_FLASH_ATTENTION_BACKWARD: the CPU flash kernel's backward, given the output and log-sum-exp of "
        "all of a query's keys (lsg_sdpa's window views in training: the local keys' gradients without a copy of them)",
    ),
    PrivateName(
        "torch.autograd._unsafe_preserve_version_counter",
        "unchanged_version: lsg_flex writes the global queries' output into the rows of the flex kernel's "
        "output whose every key was masked (no weight, no gradient), which the kernel keeps for its backward: "
        "the layer's output is then kept once",
    ),
    PrivateName(
        "transformers.PretrainedConfig._attn_implementation",
        "attn_implementation: the attention implementation a config names (\"eager\", \"sdpa\", \"flex_attention\"), "
        "which lsg_attention.DispatchConfig turns into the registered LSG attention its layers dispatch on "
        "(lsg_model refuses another when a config is made; lsg_attention_layers reads a swapped layer's backend "
        "from it)",
    ),
    PrivateName(
        "transformers.PretrainedConfig._attn_implementation",
        "overridden by lsg_attention.DispatchConfig, the config an LSG layer holds: the registered LSG attention "
        "of the backend the model's config names",
        overridden=True,
    ),
    PrivateName(
        "transformers.PretrainedConfig._attn_implementation_internal",
        "store_attn_implementation: the value behind a config's _attn_implementation, written without its setter "
        "as transformers' set_attn_implementation writes it (LSGModelMixin._name_attention)",
    ),
    PrivateName(
        "transformers.PreTrainedModel._supports_sdpa",
        "overridden by LSGModelMixin (LSG attention has an sdpa backend); read by dense_implementations",
        overridden=True,
    ),
    PrivateName(
        "transformers.PreTrainedModel._supports_flex_attn",
        "overridden by LSGModelMixin (LSG attention has a flex_attention backend); read by dense_implementations",
        overridden=True,
    ),
    PrivateName(
        "transformers.PreTrainedModel._supports_flash_attn",
        "overridden by LSGModelMixin: LSG attention has no flash-attention backend",
        overridden=True,
    ),
    PrivateName(
        "transformers.PreTrainedModel._supports_attention_backend",
        "overridden by LSGModelMixin: LSG attention takes no kernel of transformers' attention backends",
        overridden=True,
    ),
    PrivateName(
        "transformers.PreTrainedModel._can_set_attn_implementation",
        "overridden by LSGModelMixin: set_attn_implementation may always switch an LSG model's backend",
        overridden=True,
    ),
    PrivateName(
        "transformers.PreTrainedModel._init_weights",
        "init_weights: lsg_model draws a pooler added after the model was built as the model draws its own",
    ),
    PrivateName(
        "transformers.PreTrainedModel._auto_class",
        "clear_auto_class: a subclass of an LSG head does not inherit the head's remote-code registration",
    ),
    PrivateName(
        "transformers.utils.output_capturing._CAN_RECORD_REGISTRY",
        "record_outputs_like_source: a step class lsg_global_tokens makes from a built model (a recorder, a "
        "decoder) is entered under its own name, so that capture_outputs records what its source class records",
    ),
    PrivateName(
        "transformers.PreTrainedModel._can_record_outputs",
        "record_outputs_like_source: what a step class's source class records, entered under the step class's name",
    ),
    PrivateName(
        "transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket",
        "relative_position_buckets: T5's bucket of a relative distance (lsg_t5_bias)",
    ),
    PrivateName(
        "transformers.models.mt5.modeling_mt5.MT5Attention._relative_position_bucket",
        "relative_position_buckets: mT5's bucket of a relative distance (lsg_t5_bias)",
    ),
    PrivateName(
        "transformers.models.umt5.modeling_umt5.UMT5Attention._relative_position_bucket",
        "relative_position_buckets: UMT5's bucket of a relative distance, a method reading the module's settings",
    ),
)

MODELS = Path(lsg_transformers.__file__).parent
MODEL_FILES = [path for path in sorted(MODELS.glob("*.py")) if path.name != "lsg_transformers.py"]
ROOTS = ("torch", "transformers")
REFLECTION = ("getattr", "hasattr", "setattr", "delattr")
# The classes whose objects every file of models/ meets, besides those its own classes subclass.
MET_CLASSES = (torch.Tensor, torch.nn.Module, transformers.PreTrainedModel, transformers.PretrainedConfig)
OVERRIDDEN = {entry.path.rsplit(".", 1)[-1] for entry in PRIVATE_NAMES if entry.overridden}


class PrivateUse(NamedTuple):
    line: int
    name: str
    definition: bool  # defined in a class body (an override), not read, written, called or imported


def is_private(identifier: str) -> bool:
    return identifier.startswith("_") and not identifier.startswith("__") and identifier != "_"


def is_private_path(path: str) -> bool:
    return any(is_private(part) for part in path.split("."))


def private_attributes(module: ModuleType) -> set[str]:
    """The private attributes of the torch and transformers classes that `module`'s code meets: `MET_CLASSES`
    (with what a module's and a config's __init__ set) and those its own classes subclass."""
    classes = set(MET_CLASSES)
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == module.__name__:
            classes.update(base for base in value.__mro__ if base.__module__.split(".")[0] in ROOTS)
    names = {name for cls in classes for name in dir(cls)}
    names |= {*vars(torch.nn.Module()), *vars(transformers.PretrainedConfig())}
    return {name for name in names if is_private(name)}


def import_aliases(tree: ast.Module) -> tuple[dict[str, str], list[PrivateUse]]:
    """The names `tree` binds by importing from torch or transformers -> their dotted paths (``F`` ->
    "torch.nn.functional"), and the imports of private names among them."""
    aliases: dict[str, str] = {}
    uses: list[PrivateUse] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [(alias.asname or alias.name.split(".")[0], alias.name) for alias in node.names]
            aliases.update((bound, path if bound != path.split(".")[0] else bound) for bound, path in imported
                           if path.split(".")[0] in ROOTS)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in ROOTS:
            imported = [(alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names]
            aliases.update(imported)
        else:
            continue
        uses.extend(PrivateUse(node.lineno, path, False) for _, path in imported
                    if path.split(".")[0] in ROOTS and is_private_path(path))
    return aliases, uses


def class_body_definitions(node: ast.ClassDef, foreign: set[str]) -> list[PrivateUse]:
    """The methods and class attributes a class defines under names in `foreign` (overrides)."""
    definitions = []
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [statement.name]
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
        else:
            names = []
        definitions.extend(PrivateUse(statement.lineno, name, True) for name in names if name in foreign)
    return definitions


def private_uses(source: str, foreign: set[str]) -> list[PrivateUse]:
    """Where `source` names a private torch or transformers name; `foreign`: the private attributes of the
    torch and transformers classes its objects are (see `private_attributes`)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    aliases, uses = import_aliases(tree)

    def dotted(node: ast.expr) -> str | None:
        """The torch or transformers path an expression names (``F.pad`` -> "torch.nn.functional.pad"), else None."""
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = dotted(node.value)
            return None if owner is None else f"{owner}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if dotted(node) is not None:  # named by the whole chain it is part of
                chain = node
                while isinstance(parents.get(chain), ast.Attribute) and parents[chain].value is chain:
                    chain = parents[chain]
                uses.append(PrivateUse(node.lineno, dotted(chain), False))
            elif node.attr in foreign:
                uses.append(PrivateUse(node.lineno, ast.unparse(node), False))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION:
            owner = dotted(node.args[0]) if node.args else None
            name = node.args[1] if len(node.args) > 1 else None
            if owner is not None and isinstance(name, ast.Constant) and is_private(str(name.value)):
                uses.append(PrivateUse(node.lineno, f"{owner}.{name.value}", False))
        elif isinstance(node, ast.Call) and dotted(node.func) is not None:
            uses.extend(PrivateUse(node.lineno, f"{dotted(node.func)}({keyword.arg}=)", False)
                        for keyword in node.keywords if keyword.arg and is_private(keyword.arg))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in foreign:
            uses.append(PrivateUse(node.lineno, repr(node.value), False))
        elif isinstance(node, ast.ClassDef):
            uses.extend(class_body_definitions(node, foreign))
    return sorted(set(uses))


def unlisted_uses(path: Path) -> list[str]:
    """"file:line: name" for each private name the models/ file `path` names other than an override the
    table lists."""
    listed = [use for use in file_uses(path) if not (use.definition and use.name in OVERRIDDEN)]
    return [f"{path.name}:{use.line}: {use.name}" for use in listed]


def resolved(path: str) -> Any:
    """The object at a dotted torch or transformers path; raises AttributeError where it is gone. A class's
    attribute may be one its instances get in __init__ (a config's ``_attn_implementation_internal``)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
            break
        except ImportError:
            continue
    for part in parts[split:]:
        if isinstance(value, type) and not hasattr(value, part):
            value = value()
        value = getattr(value, part)
    return value


def file_uses(path: Path) -> list[PrivateUse]:
    """The private torch and transformers names the models/ file `path` names."""
    return private_uses(path.read_text(), private_attributes(importlib.import_module(f"lsg_converter.models.{path.stem}")))


@functools.cache
def overridden_names() -> set[str]:
    """The private names some class of models/ defines in its body."""
    return {use.name for path in MODEL_FILES for use in file_uses(path) if use.definition}


def reached_names() -> set[str]:
    """The identifiers lsg_transformers' code names as attributes, imports or strings."""
    tree = ast.parse(Path(lsg_transformers.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(node.module.split("."))
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


FORBIDDEN_SNIPPETS = {
    "import torch\ntorch._check(x)": "torch._check",
    "import torch\ntry:\n    pass\nexcept torch._dynamo.exc.TorchDynamoException:\n    pass": "torch._dynamo.exc.TorchDynamoException",
    "def f():\n    from torch._inductor.compile_fx import compile_fx": "torch._inductor.compile_fx.compile_fx",
    "from torch import _C": "torch._C",
    "import torch as t\nop = getattr(t.ops.aten, '_scaled_dot_product_flash_attention_for_cpu', None)":
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
    "def f(self, module):\n    self._init_weights(module)": "self._init_weights",
    "def f(config):\n    config._attn_implementation_internal = 'sdpa'": "config._attn_implementation_internal",
    "def f(model):\n    return getattr(model, '_supports_sdpa', False)": "'_supports_sdpa'",
    "def f(owner):\n    return owner._modules.get('a')": "owner._modules",
    "class A:\n    _supports_sdpa = True": "_supports_sdpa",
    "import torch\nf = torch.compile(g, _private_option=1)": "torch.compile(_private_option=)",
}


@pytest.mark.parametrize("source, name", FORBIDDEN_SNIPPETS.items(), ids=FORBIDDEN_SNIPPETS.values())
def test_the_scan_finds_a_private_name_however_the_code_reaches_it(source, name):
    foreign = private_attributes(lsg_transformers)

    assert [use.name for use in private_uses(source, foreign)] == [name]


def test_the_scan_leaves_the_project_s_own_private_names_alone():
    source = (
        "import torch\nfrom .lsg_pattern import _padded_masks\n"
        "class Kernel:\n    _padded = None\n    def _run_once(self):\n        return self._padded, _padded_masks(torch.ones(1))\n"
        "def _helper(_, __x):\n    return getattr(_, '_padded', None)\n"
    )

    assert private_uses(source, private_attributes(lsg_transformers)) == []


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda path: path.name)
def test_no_file_of_models_but_lsg_transformers_names_a_private_torch_or_transformers_name(path):
    assert unlisted_uses(path) == [], "reach these through lsg_transformers (or list an override in PRIVATE_NAMES)"


def test_every_private_name_lsg_transformers_reaches_is_in_the_table():
    path = MODELS / "lsg_transformers.py"
    listed = {entry.path.rsplit(".", 1)[-1] for entry in PRIVATE_NAMES}
    unlisted = [f"{path.name}:{use.line}: {use.name}" for use in file_uses(path)
                if use.name.rsplit(".", 1)[-1].strip("'") not in listed]

    assert unlisted == [], "list these in PRIVATE_NAMES with what LSG does with them"


@pytest.mark.compat
@pytest.mark.parametrize("entry", PRIVATE_NAMES, ids=lambda entry: entry.path)
def test_every_name_in_the_table_exists_in_the_installed_torch_and_transformers(entry):
    assert is_private_path(entry.path)

    resolved(entry.path)


@pytest.mark.parametrize("entry", PRIVATE_NAMES, ids=lambda entry: entry.path)
def test_every_name_in_the_table_is_still_overridden_or_reached(entry):
    name = entry.path.rsplit(".", 1)[-1]

    assert name in (overridden_names() if entry.overridden else reached_names())
