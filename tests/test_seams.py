"""The seams between packages stay honest: no module left behind only to re-export moved names, no
`Any` in the report's renderer signatures, and no module-level state the report mutates at run time."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vramlab"


def _modules(under: Path = SRC) -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(SRC).as_posix(), ast.parse(p.read_text())) for p in sorted(under.rglob("*.py"))]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _shims(modules: list[tuple[str, ast.Module]]) -> list[str]:
    """Modules whose body is imports from vramlab (and an __all__): shims kept for an old import path.
    Packages' __init__ modules are their public face, not shims."""
    out = []
    for name, tree in modules:
        if name.endswith("__init__.py"):
            continue
        body = [n for n in tree.body if not _is_docstring(n)]
        if body and all(isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign)) for n in body):
            if any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vramlab") for n in body):
                out.append(name)
    return out


def test_no_module_only_re_exports_names_defined_elsewhere() -> None:
    # import a moved name from where it lives instead of keeping its old path alive
    assert _shims(_modules()) == []


def test_the_shim_check_sees_a_shim_and_passes_a_module() -> None:
    shim = ast.parse('"""Kept as the old path."""\nfrom vramlab.units import GIB\n__all__ = ["GIB"]\n')
    real = ast.parse("from vramlab.units import GIB\n\ndef half() -> int:\n    return GIB // 2\n")
    assert _shims([("old.py", shim), ("real.py", real), ("pkg/__init__.py", shim)]) == ["old.py"]


def test_old_import_paths_are_gone() -> None:
    assert not (SRC / "capacity" / "units.py").exists()
    assert not (SRC / "drill" / "health.py").exists()


def _any_in_signatures(tree: ast.Module) -> list[str]:
    """Functions whose parameters or return name `Any` (the report's renderers read typed views)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            notes = [p.annotation for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.annotation]
            notes += [x.annotation for x in (a.vararg, a.kwarg) if x is not None and x.annotation]
            if node.returns is not None:
                notes.append(node.returns)
            if any(isinstance(n, ast.Name) and n.id == "Any" for note in notes for n in ast.walk(note)):
                out.append(node.name)
    return out


def test_the_text_renderers_take_typed_views_not_any() -> None:
    # check-log, calibrate and the incident's text: views the lower layers define (or protocols of what
    # they read, where the report may not import the layer that makes the object)
    report = SRC / "report"
    renderers = sorted(report.glob("*_text.py"))
    assert {p.name for p in renderers} >= {"check_log_text.py", "calibrate_text.py", "incident_text.py"}
    found = {p.name: _any_in_signatures(ast.parse(p.read_text())) for p in renderers}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_any_check_sees_any_in_a_signature() -> None:
    tree = ast.parse("def f(x: 'int', y: dict[str, Any]) -> str: ...\ndef g(x: int) -> list[Any]: ...\n")
    assert _any_in_signatures(tree) == ["f", "g"]
