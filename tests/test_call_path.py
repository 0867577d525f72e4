"""benchmarks/call_path.py (issue 67): what one attention call enters in models/, and its transitions between files."""

import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_call_path():
    """benchmarks/call_path.py as a module (the folder is not a package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return __import__("call_path")
    finally:
        sys.path.remove(str(BENCHMARKS))


MODULES = ("call_path_first", "call_path_second", "call_path_outside")


@pytest.fixture
def modules(tmp_path: Path, monkeypatch):
    """Two modules in a folder (call_path_first calls call_path_second, once through a module outside it)
    and that outside module, imported afresh and forgotten after the test; yields (first, second, folder)."""
    folder, outside = tmp_path / "recorded", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "call_path_outside.py").write_text(textwrap.dedent("""
        def through(function):
            return function()
    """))
    (folder / "call_path_second.py").write_text(textwrap.dedent("""
        def helper():
            return leaf()

        def leaf():
            return 1
    """))
    (folder / "call_path_first.py").write_text(textwrap.dedent("""
        import call_path_outside
        import call_path_second

        def entry():
            call_path_second.helper()
            call_path_second.helper()
            same_file()
            call_path_outside.through(call_path_second.leaf)
            return [value for value in range(2)]

        def same_file():
            return 0
    """))
    monkeypatch.syspath_prepend(str(outside))
    monkeypatch.syspath_prepend(str(folder))
    import call_path_first
    import call_path_second

    yield call_path_first, call_path_second, folder
    for name in MODULES:
        sys.modules.pop(name, None)


def test_transitions_are_the_calls_from_another_file_of_the_folder(modules):
    call_path = import_call_path()
    first, _, folder = modules

    path = call_path.record_call_path(lambda: (first.entry(), first.entry()), first.entry.__code__, folder)

    assert [(entry.file, entry.name, entry.calls) for entry in path.entered if entry.is_function] == [
        ("call_path_first.py", "entry", 1),  # the first call only
        ("call_path_second.py", "helper", 2),
        ("call_path_second.py", "leaf", 3),
        ("call_path_first.py", "same_file", 1),
    ]
    assert path.functions == 4
    assert path.code_objects == (5 if sys.version_info < (3, 12) else 4)  # the list comprehension's own code object
    # helper -> leaf stays in its file; the module outside the folder is skipped: entry is leaf's caller
    assert [(t.caller, t.callee) for t in path.transitions] == [
        ("call_path_first.py:entry", "call_path_second.py:helper"),
        ("call_path_first.py:entry", "call_path_second.py:helper"),
        ("call_path_first.py:entry", "call_path_second.py:leaf"),
    ]


def test_the_entry_call_is_a_transition_from_another_file_of_the_folder(modules):
    call_path = import_call_path()
    first, second, folder = modules

    path = call_path.record_call_path(first.entry, second.helper.__code__, folder)

    assert [entry.name for entry in path.entered] == ["helper", "leaf"]
    assert [(t.caller, t.callee) for t in path.transitions] == [("call_path_first.py:entry", "call_path_second.py:helper")]


def test_one_sdpa_attention_call_enters_the_registered_attention_and_lsg_attention():
    call_path = import_call_path()

    path = call_path.measure(call_path.Case("sdpa", "none", "inference", "padded"))

    entered = [(entry.file, entry.name) for entry in path.entered]
    assert entered[0] == ("lsg_attention.py", "registered_attention_forward")
    assert ("lsg_attention.py", "lsg_attention") in entered
    assert 0 < path.functions <= path.code_objects == len({(entry.file, entry.name, entry.line) for entry in path.entered})
    assert len(path.transitions) > 0
    for transition in path.transitions:  # between two files of models/, into a function entered
        caller_file, callee_file = transition.caller.split(":")[0], transition.callee.split(":")[0]
        assert caller_file != callee_file
        assert tuple(transition.callee.split(":", 1)) in entered
