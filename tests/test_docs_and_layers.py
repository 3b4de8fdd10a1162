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


# Packages that must stay free of I/O (ARCHITECTURE.md): maths, statistics, detection, rendering.
PURE = ["capacity", "analysis"]
IO_MODULES = {"socket", "subprocess", "urllib", "http", "aiohttp", "httpx", "requests", "sqlalchemy", "psycopg",
              "sqlite3", "pynvml", "psutil", "asyncio"}


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_import_nothing_that_does_io(package):
    for path in (ROOT / "src" / "vramlab" / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in IO_MODULES, f"{path.relative_to(ROOT)} imports {n}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                raise AssertionError(f"{path.relative_to(ROOT)} opens a file")


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
