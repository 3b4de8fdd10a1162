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


_MUTATORS = {
    "append",
    "extend",
    "insert",
    "update",
    "setdefault",
    "pop",
    "popitem",
    "clear",
    "add",
    "remove",
    "discard",
}
_CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _module_state(tree: ast.Module) -> list[str]:
    """What keeps state at module level: a `global`, a statement run at import beyond definitions (a
    loop that registers), a cache decorator, or a module-level dict/list/set that the module mutates."""
    out: list[str] = []
    containers = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, _CONTAINERS):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            containers |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif not isinstance(
            node,
            ast.Import
            | ast.ImportFrom
            | ast.FunctionDef
            | ast.AsyncFunctionDef
            | ast.ClassDef
            | ast.Assign
            | ast.AnnAssign
            | ast.If,
        ) and not _is_docstring(node):
            out.append(f"line {node.lineno}: a {type(node).__name__} at import")
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                name = ast.unparse(d)
                if "cache" in name:
                    out.append(f"{node.name}: @{name}")
    for walked in ast.walk(tree):
        if isinstance(walked, ast.Global):
            out.append(f"global {', '.join(walked.names)}")
        elif isinstance(walked, ast.Call) and isinstance(walked.func, ast.Attribute):
            obj = walked.func.value
            if isinstance(obj, ast.Name) and obj.id in containers and walked.func.attr in _MUTATORS:
                out.append(f"{obj.id}.{walked.func.attr}()")
        elif isinstance(walked, ast.Assign | ast.AugAssign | ast.Delete):
            targets = walked.targets if isinstance(walked, ast.Assign | ast.Delete) else [walked.target]
            for t in targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in containers
                ):
                    out.append(f"{t.value.id}[...] written")
    return out


def test_the_report_keeps_no_module_level_state() -> None:
    # the report is pure: what a document holds comes from its context, never from what ran before
    # (sections are constant tuples per module, read by sections.registered; nothing registers at import)
    found = {name: s for name, tree in _modules(SRC / "report") if (s := _module_state(tree))}
    assert found == {}


def test_the_state_check_sees_a_registry() -> None:
    tree = ast.parse(
        "import functools\n_REG: dict[str, int] = {}\n_SEEN = []\nflag = False\n"
        "def register(k: str) -> None:\n    global flag\n    _REG[k] = 1\n    _SEEN.append(k)\n"
        "@functools.lru_cache\ndef f() -> int:\n    return 1\n"
        "for k in ('a', 'b'):\n    register(k)\n"
    )
    assert sorted(_module_state(tree)) == sorted(
        [
            "line 12: a For at import",
            "f: @functools.lru_cache",
            "global flag",
            "_REG[...] written",
            "_SEEN.append()",
        ]
    )
    assert _module_state(ast.parse("_T = {'a': 1}\ndef g() -> int:\n    return _T['a']\n")) == []
