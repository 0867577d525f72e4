"""The package's layout: its modules import each other without cycles, and remote code imports nothing of it.

Read from the source files with ast, without importing them. An import counts wherever it stands (a
function's body included), except under ``if TYPE_CHECKING:``. ``__init__.py`` files and ``cli.py``
gather the others (the public API, the command line): their imports are left out of the graph.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = "lsg_converter"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
GATHERING_FILES = ("__init__.py", "cli.py")


def module_name(path: Path) -> str:
    """"lsg_converter.models.lsg_model" for lsg_converter/models/lsg_model.py, "lsg_converter" for its __init__.py."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def package_of(path: Path) -> str:
    return module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def import_nodes(node: ast.AST):
    """The Import and ImportFrom nodes under `node`, those under ``if TYPE_CHECKING:`` left out."""
    for child in ast.iter_child_nodes(node):
        if is_type_checking_block(child):
            for orelse in child.orelse:
                yield from import_nodes(orelse)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from import_nodes(child)


def imported_names(path: Path) -> set[str]:
    """Every absolute module name `path` imports (relative imports resolved); for ``from X import y``,
    X.y where that is a module of the package, else X."""
    names = set()
    for node in import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            package = package_of(path).split(".")
            anchor = package[: len(package) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, for every module but the gathering files."""
    return {
        name: {imported for imported in imported_names(path) if imported in MODULES and imported != name}
        for name, path in MODULES.items()
        if path.name not in GATHERING_FILES
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], None when it has none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node))), None)


def test_the_package_has_modules_to_check():
    assert {f"{PACKAGE}.converter", f"{PACKAGE}.models.lsg_model"} <= MODULES.keys()


def test_the_import_graph_of_the_package_modules_has_no_cycle():
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize("name", [name for name, path in MODULES.items() if path.name not in GATHERING_FILES])
def test_a_module_imports_no_gathering_file(name):
    gathering = {module_name(path) for path in MODULES.values() if path.name in GATHERING_FILES}
    assert not import_graph()[name] & gathering


def imports_of_the_package(path: Path) -> list[str]:
    """The imports in `path` that a folder of remote code cannot satisfy: absolute ones of the package,
    relative ones that leave the file's folder (``from ..``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom) and (
            node.level > 1 or (node.level == 0 and (node.module or "").split(".")[0] == PACKAGE)
        ):
            found.append("." * node.level + (node.module or ""))
    return found


@pytest.mark.parametrize("name", [name for name in MODULES if name.startswith(f"{PACKAGE}.models")])
def test_remote_code_imports_nothing_of_the_package(name):
    imports = imports_of_the_package(MODULES[name])
    assert imports == [], "remote code imports torch, transformers and its own folder only"


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


@pytest.mark.slow
def test_the_wheel_carries_py_typed_and_every_remote_code_file(tmp_path):
    """A type checker reads the package's hints (PEP 561), and a saved model's files all come with it."""
    import subprocess
    import sys
    import zipfile

    from helpers import REMOTE_CODE_FILES

    repository = ROOT.parent
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(repository)],
        check=True, capture_output=True,
    )  # fmt: skip
    names = zipfile.ZipFile(next(tmp_path.glob("lsg_converter-*.whl"))).namelist()
    assert "lsg_converter/py.typed" in names
    shared = [name for name in REMOTE_CODE_FILES if "{stem}" not in name]
    assert all(f"lsg_converter/models/{name}" in names for name in shared)
