"""The docs keep up with the code, and the pure core stays pure."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.cli.main import COMMANDS, _available

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
VRAMLAB = str(Path(sys.executable).parent / "vramlab")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_exists_has_help_and_is_in_the_readme(name):
    assert name in _available(), f"vramlab {name} has no module"
    assert f"vramlab {name}" in README, f"README never shows `vramlab {name}`"
    r = subprocess.run([VRAMLAB, name, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: vramlab " + name in r.stdout


def test_readme_opens_with_the_install_and_test_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block, "README has no command block"
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert lines[0].startswith("pip install . && vramlab ")
    assert lines[1].startswith("scripts/test")
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_docs_linked_from_the_readme_exist():
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (ROOT / link).exists(), link


# Packages that must stay free of I/O: the contract "pure" in pyproject.toml forbids their imports
# of I/O modules (lint-imports, below); this catches what imports cannot show: builtins and
# methods that touch files or the terminal.
PURE = ["capacity", "analysis", "records", "report"]
IO_CALLS = {"open", "input", "print", "breakpoint", "exec", "eval", "__import__"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir", "unlink", "urlopen"}
PACKAGES = sorted(p.name for p in (ROOT / "src" / "vramlab").iterdir() if (p / "__init__.py").exists())


def _io_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in IO_CALLS:
                found.append(f"{node.func.id}() on line {node.lineno}")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in IO_METHODS:
                found.append(f".{node.func.attr}() on line {node.lineno}")
    return found


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_call_nothing_that_does_io(package):
    for path in (ROOT / "src" / "vramlab" / package).rglob("*.py"):
        uses = _io_uses(ast.parse(path.read_text()))
        assert not uses, f"{path.relative_to(ROOT)} does I/O: {uses}"


def test_the_io_check_catches_a_file_read():
    assert _io_uses(ast.parse("from pathlib import Path\nx = Path('p').read_text()\nopen('q')")) == [
        ".read_text() on line 2", "open() on line 3"]


def _contracts() -> list[dict]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _may_import_by_contract() -> dict[str, set[str]]:
    out = {}
    for c in _contracts():
        if c["id"] in ("acyclic", "pure"):
            continue
        (source,) = c["source_modules"]
        name = source.removeprefix("vramlab.")
        forbidden = {m.removeprefix("vramlab.") for m in c["forbidden_modules"]}
        assert c.get("allow_indirect_imports") is True, c["id"]  # "may import" means direct imports
        out[name] = set(PACKAGES) - forbidden - {name}
        shown = "nothing" if not out[name] else ", ".join(sorted(out[name]))
        assert c["name"] == f"{name} may import {shown}", f"contract {c['id']}: the name must say what it allows"
    return out


def _may_import_by_doc() -> dict[str, set[str]]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    out = {}
    for line in doc.splitlines():
        m = re.match(r"^\| `(\w+)/` \| .*? \| (.*?) \| .*? \|$", line)
        if not m:
            continue
        name, cell = m.group(1), m.group(2)
        if cell == "nothing":
            out[name] = set()
        elif cell == "everything":
            out[name] = set(PACKAGES) - {name}
        elif cell.startswith("everything but "):
            out[name] = set(PACKAGES) - {name} - set(re.findall(r"`(\w+)`", cell))
        else:
            out[name] = set(re.findall(r"`(\w+)`", cell))
    return out


def test_every_package_has_a_layering_contract_and_a_doc_row():
    assert set(_may_import_by_contract()) == set(PACKAGES)
    assert set(_may_import_by_doc()) == set(PACKAGES)


def test_architecture_doc_says_what_the_contracts_enforce():
    by_doc, by_contract = _may_import_by_doc(), _may_import_by_contract()
    wrong = {p: {"doc": sorted(by_doc[p]), "contract": sorted(by_contract[p])}
             for p in PACKAGES if by_doc[p] != by_contract[p]}
    assert not wrong, f"docs/architecture.md and pyproject.toml disagree: {wrong}"


def test_contracts_hold():
    """lint-imports (import-linter): no cycle between packages, the "may import" table, "pure"."""
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_help_imports_no_heavy_library():
    code = ("import sys; from vramlab.cli.main import main; main(['--help']); "
            "heavy = [m for m in ('aiohttp', 'sqlalchemy', 'matplotlib', 'pydantic', 'rich', 'numpy', 'prometheus_client')"
            " if m in sys.modules]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_plan_imports_no_heavy_library():
    code = ("import sys; from vramlab.cli.main import main; "
            "main(['plan', '--model', 'qwen3-8b', '--gpu', 'l4', '--offline', '--json']); "
            "heavy = [m for m in ('aiohttp', 'sqlalchemy', 'matplotlib', 'pydantic', 'rich', 'numpy')"
            " if m in sys.modules]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stderr


def _readme_commands() -> list[str]:
    """README lines that are self-contained `vramlab` commands (no placeholder paths, no servers)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            cmd = line.split("  #")[0].strip()
            if (not cmd.startswith("vramlab ") or "..." in cmd or "./" in cmd or "7f3a" in cmd or "91bc" in cmd
                    or "--calibration" in cmd):  # placeholders, stored runs, files other commands write
                continue
            first = cmd.split()[1]
            if first in ("plan", "models", "gpus", "pack", "alerts") and ">" not in cmd:
                out.append(cmd)
    return out


@pytest.mark.parametrize("cmd", _readme_commands())
def test_readme_commands_run(cmd, tmp_path):
    import shlex

    args = [a.replace("examples/", str(ROOT / "examples") + "/") for a in shlex.split(cmd)[1:]]
    r = subprocess.run([VRAMLAB, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode in (0, 1), f"{cmd}: {r.stderr}"  # 1: the plan's verdict is "does not fit"
    assert r.stdout.strip() and "Traceback" not in r.stderr


def test_no_code_writes_pydantic_private_attributes():
    """Records are built through pydantic's public API (model_validate, TypeAdapter, model_construct)."""
    for path in (ROOT / "src" / "vramlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("__pydantic_"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "object"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} calls object.__setattr__")
