"""The layout: no import circle, no import from a room above, and docs/architecture.md drawn from the code as it is."""
import ast
import importlib.util
import subprocess
import sys

from conftest import ROOT


def architecture():
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "tools" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_circle_no_upward_arrow_and_the_picture_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "architecture.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_check_finds_a_circle_through_any_chain_and_an_upward_import():
    tool = architecture()
    edges = {"scaledl.a": {"scaledl.b"}, "scaledl.b": {"scaledl.c"}, "scaledl.c": {"scaledl.a"},
             "scaledl.d": {"scaledl.a"}, "scaledl.hpc.x": {"scaledl.workshop.y"}, "scaledl.workshop.y": {"scaledl.d"}}
    assert tool.circles(edges) == [["scaledl.a", "scaledl.b", "scaledl.c"]]
    assert tool.upward(edges) == [("scaledl.hpc.x", "scaledl.workshop.y")]


def test_the_graph_sees_deferred_and_relative_imports(tmp_path, monkeypatch):
    tool = architecture()
    package = tmp_path / "scaledl"
    (package / "hpc").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("def f():\n    from scaledl.hpc import jobs\n")
    (package / "hpc" / "__init__.py").write_text("")
    (package / "hpc" / "jobs.py").write_text("from .. import errors\n\n\ndef g():\n    from .binding import x\n")
    monkeypatch.setattr(tool, "SRC", tmp_path)
    mods = tool.modules()
    edges = tool.imports(mods)
    assert edges["scaledl.errors"] == {"scaledl.hpc.jobs"}
    assert edges["scaledl.hpc.jobs"] == {"scaledl.errors", "scaledl.hpc.binding"}
    assert tool.circles(edges) == [["scaledl.errors", "scaledl.hpc.jobs"]]
    # A module that moved away and an import that still names it (deferred, relative): no such module.
    assert tool.missing(mods, edges) == [("scaledl.hpc.jobs", "scaledl.hpc.binding")]


def test_each_room_says_what_it_is_for_and_what_it_may_import():
    for room, _ in architecture().ROOMS:
        init = ROOT / "src" / room.replace(".", "/") / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 30, f"{room}: its docstring should say what the room is for"
        assert "import" in doc.lower(), f"{room}: its docstring should say what it may import"
