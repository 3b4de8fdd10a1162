"""The docs keep up with the code, and the pure core stays pure."""

from __future__ import annotations

import ast
import os
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


def test_readme_how_to_begins_on_its_first_screen():
    """Before the first recipe: the title, what vramlab answers in a short paragraph and the two
    commands; nothing else (no accuracy batches, no caveats). About 15 source lines, which render
    in well under 900 px."""
    lines = README.splitlines()
    first = next(n for n, ln in enumerate(lines) if ln.startswith("## "))
    assert lines[first] == "## Plan a model on a card", lines[first]
    intro = "\n".join(lines[:first])
    prose = re.sub(r"```.*?```", "", intro, flags=re.S)
    assert first <= 18 and len(prose.split()) <= 120, (first, len(prose.split()))
    assert intro.count("```bash") == 1
    # the other pieces a new user asks about have their own place further down
    headings = [ln for ln in lines if ln.startswith("## ")]
    assert headings.index("## Run against your own vLLM, SGLang, llama.cpp or Ollama") < headings.index(
        "## Multi-node"
    )
    assert headings.index("## Multi-node") < headings.index("## Accuracy")
    multi = README.split("## Multi-node", 1)[1].split("\n## ", 1)[0]
    assert "does **not** plan" in multi and "**inside one node**" in multi


def test_docs_linked_from_the_readme_exist():
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (ROOT / link).exists(), link


def test_every_relative_link_in_the_readme_and_docs_resolves():
    """A Markdown link to a file of the repository, from the README or a docs/ page, names a file that
    exists (relative to the page; an #anchor is left aside); web links are not followed."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or re.match(r"^[a-z]+:", path):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


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
        ".read_text() on line 2",
        "open() on line 3",
    ]


def _contracts() -> list[dict]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]  # same API under the 3.11 name
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _may_import_by_contract() -> dict[str, set[str]]:
    out = {}
    for c in _contracts():
        if c["id"] in ("acyclic", "pure") or c["id"].startswith("module-"):
            continue
        (source,) = c["source_modules"]
        name = source.removeprefix("vramlab.")
        forbidden = {m.removeprefix("vramlab.") for m in c["forbidden_modules"]}
        assert c.get("allow_indirect_imports") is True, c["id"]  # "may import" means direct imports
        out[name] = set(PACKAGES) - forbidden - {name}
        shown = "nothing" if not out[name] else ", ".join(sorted(out[name]))
        assert c["name"] == f"{name} may import {shown}", (
            f"contract {c['id']}: the name must say what it allows"
        )
    return out


def _may_import_by_doc() -> dict[str, set[str]]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    out: dict[str, set[str]] = {}
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


def test_every_top_level_module_has_a_contract():
    # vramlab/errors.py, planfile.py, redact.py...: a module beside the packages is layered too
    modules = {p.stem for p in (ROOT / "src" / "vramlab").glob("*.py")} - {"__init__", "__main__"}
    by_contract = {
        c["source_modules"][0].removeprefix("vramlab."): c
        for c in _contracts()
        if c["id"].startswith("module-")
    }
    assert set(by_contract) == modules
    for name, c in by_contract.items():
        allowed = (
            {m.removeprefix("vramlab.") for m in modules | set(PACKAGES)}
            - {name}
            - {m.removeprefix("vramlab.") for m in c["forbidden_modules"]}
        )
        shown = "nothing" if not allowed else ", ".join(sorted(allowed))
        assert c["name"] == f"module {name} may import {shown}", c["id"]


def test_architecture_doc_says_what_the_contracts_enforce():
    by_doc, by_contract = _may_import_by_doc(), _may_import_by_contract()
    wrong = {
        p: {"doc": sorted(by_doc[p]), "contract": sorted(by_contract[p])}
        for p in PACKAGES
        if by_doc[p] != by_contract[p]
    }
    assert not wrong, f"docs/architecture.md and pyproject.toml disagree: {wrong}"


def test_contracts_hold():
    """lint-imports (import-linter): no cycle between packages, the "may import" table, "pure"."""
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_help_imports_no_heavy_library():
    code = (
        "import sys; from vramlab.cli.main import main; main(['--help']); "
        "heavy = [m for m in ('aiohttp', 'sqlalchemy', 'matplotlib', 'pydantic', 'rich', 'numpy', 'prometheus_client')"
        " if m in sys.modules]; print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_plan_imports_no_heavy_library():
    code = (
        "import sys; from vramlab.cli.main import main; "
        "main(['plan', '--model', 'qwen3-8b', '--gpu', 'l4', '--offline', '--json']); "
        "heavy = [m for m in ('aiohttp', 'sqlalchemy', 'matplotlib', 'pydantic', 'rich', 'numpy')"
        " if m in sys.modules]; print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stderr


def _readme_commands() -> list[str]:
    """README lines that are self-contained `vramlab` commands (no placeholder paths, no servers)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            cmd = line.split("  #")[0].strip()
            if (
                not cmd.startswith("vramlab ")
                or "..." in cmd
                or "./" in cmd
                or "7f3a" in cmd
                or "91bc" in cmd
                or "--calibration" in cmd
            ):  # placeholders, stored runs, files other commands write
                continue
            first = cmd.split()[1]
            if first in ("plan", "models", "gpus", "pack", "alerts") and ">" not in cmd:
                out.append(cmd)
            elif first == "check-log" and (ROOT / cmd.split()[2]).exists():  # a log shipped in the repository
                out.append(cmd)
    return out


@pytest.mark.parametrize("cmd", _readme_commands())
def test_readme_commands_run(cmd, tmp_path):
    import shlex

    # In an empty folder, with the examples the installed package writes (not the repository's).
    assert (
        subprocess.run([VRAMLAB, "examples"], capture_output=True, timeout=60, cwd=tmp_path).returncode == 0
    )
    args = shlex.split(cmd)[1:]
    # pasted in a clone's root where it names a file of the repository, else in an empty folder
    cwd = ROOT if args[0] == "check-log" else tmp_path
    r = subprocess.run([VRAMLAB, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    # a plan verdict (0 fits, 1 does not fit, 3 at risk, 4 part of the model on the CPU), never bad input or a bug
    assert r.returncode in (0, 1, 3, 4), f"{cmd}: {r.stderr}"
    assert r.stdout.strip() and "Traceback" not in r.stderr


def test_readme_plans_for_your_own_endpoint_load_as_written():
    """The README's plans for a real server, as a reader saves them: the experiment whole, the drill's
    target into examples/oom-drill.yaml. `target.kind` names the engine in the one and the process
    manager in the other, and each says so beside it."""
    import yaml

    from vramlab.drill.plan import parse_plan as parse_drill
    from vramlab.experiment.plan import parse_plan as parse_experiment

    experiment, drill_target = re.findall(r"```yaml\n(.*?)```", README, re.S)
    plan = parse_experiment(experiment, "my-endpoint.yaml")
    assert (plan.target.kind, plan.target.environment) == ("vllm", "test")
    assert plan.target.metrics_url and plan.metrics and plan.capacity is not None
    doc = yaml.safe_load((ROOT / "examples" / "oom-drill.yaml").read_text())
    doc["target"] = yaml.safe_load(drill_target)["target"]
    drill = parse_drill(doc, "oom-drill.yaml")
    assert (drill.target.kind, drill.target.engine, drill.target.environment) == ("systemd", "vllm", "test")
    assert "here, the engine" in experiment and "here, how to stop, start and restart it" in drill_target


def test_no_code_writes_pydantic_private_attributes():
    """Records are built through pydantic's public API (model_validate, TypeAdapter, model_construct)."""
    for path in (ROOT / "src" / "vramlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("__pydantic_")
            ):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__setattr__"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "__dict__"
            ):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} replaces an object's __dict__")


def _readme_block(heading: str) -> list[str]:
    part = README.split(f"## {heading}", 1)[1]
    block = re.search(r"```bash\n(.*?)```", part, re.S)
    assert block, heading
    return [ln.split("  #")[0].strip() for ln in block.group(1).splitlines() if ln.strip()]


def test_examples_in_the_repo_are_the_packaged_ones():
    from vramlab.cli.examples import packaged

    files = packaged()
    assert {"concurrency-ramp.yaml", "oom-drill.yaml", "demo.yaml", "fleet.yaml", "trace.jsonl"} <= set(files)
    here = {p.name: p for p in (ROOT / "examples").iterdir()}
    assert set(here) == set(files), (
        "examples/ differs from src/vramlab/data/examples/: run `vramlab examples --force`"
    )
    for name, data in files.items():
        assert not here[name].is_symlink(), f"examples/{name} is a link (breaks when copied)"
        assert here[name].read_bytes() == data, f"examples/{name} differs from the packaged copy"


def test_examples_command_writes_refuses_a_clash_and_forces(tmp_path):
    r = subprocess.run([VRAMLAB, "examples"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "examples" / "oom-drill.yaml").read_text().startswith("# An OOM drill")
    (tmp_path / "examples" / "fleet.yaml").write_text("edited\n")
    r = subprocess.run([VRAMLAB, "examples"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "fleet.yaml" in r.stderr and "--force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = subprocess.run(
        [VRAMLAB, "examples", "--force"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0 and (tmp_path / "examples" / "fleet.yaml").read_text() != "edited\n"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_readme_experiment_and_drill_commands_run_in_an_empty_folder(tmp_path):
    """The README's experiment, drill and shared-GPU blocks, pasted in order in an empty folder (the examples come
    from `vramlab examples`, the ids from the runs just made; the experiment windows shortened with
    --rounds 1 --phase-s 1). Skipped: the PostgreSQL line (needs a server) and `vramlab demo` (its
    own test)."""
    env = {k: v for k, v in os.environ.items() if k != "VRAMLAB_DB"}
    ids: list[str] = []
    ran: list[str] = []

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        import shlex

        args = shlex.split(cmd)
        out = subprocess.run(
            [VRAMLAB, *args[1:]]
            if ">" not in args
            else ["/bin/sh", "-c", cmd.replace("vramlab ", VRAMLAB + " ", 1)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env=env,
        )
        assert out.returncode == 0, f"{cmd}: exit {out.returncode}: {out.stderr[-1500:]}"
        assert "Traceback" not in out.stderr
        ran.append(cmd)
        return out

    for cmd in _readme_block("Run against your own vLLM, SGLang, llama.cpp or Ollama"):
        if "postgresql://" in cmd or cmd.startswith("vramlab demo"):
            continue
        if cmd.startswith("vramlab run "):
            for _ in range(2):  # two runs, for `compare`
                out = sh(cmd + " --rounds 1 --phase-s 1")
                ids.append(re.search(r"^run ([0-9a-f]{8}):", out.stdout, re.M).group(1))  # type: ignore[union-attr]
                assert f"vramlab report {ids[-1]}" in out.stdout
            continue
        if "7f3a" in cmd or "91bc" in cmd:
            cmd = cmd.replace("7f3a", ids[0]).replace("91bc", ids[1])
        sh(cmd)
    assert (tmp_path / "report.html").read_text().count("<table") >= 4
    for cmd in _readme_block("Drill an OOM and write the incident report"):
        if cmd.startswith("vramlab drill "):
            out = sh(cmd)
            ids.append(re.search(r"^([0-9a-f]{8}): ", out.stdout, re.M).group(1))  # type: ignore[union-attr]
            continue
        sh(cmd.replace("7f3a", ids[-1]))
    assert "restarted vllm" in (tmp_path / "incident.html").read_text()
    assert "groups:" in (tmp_path / "rules.yml").read_text()
    for cmd in _readme_block(
        "Pack several models on shared GPUs"
    ):  # pack, and the co-location drill as pasted
        sh(cmd)
    assert (tmp_path / "memmap.png").stat().st_size > 0
    assert len(ran) >= 12, ran


def _cited_texts():
    for base in ("src", "docs", "benchmarks", "tests"):
        for p in (ROOT / base).rglob("*"):
            if p.suffix in (".py", ".md") and ".venv" not in p.parts and p.name != "test_docs_and_layers.py":
                yield p, p.read_text(encoding="utf-8", errors="replace")
    yield ROOT / "README.md", (ROOT / "README.md").read_text()


def test_docs_and_comments_cite_only_what_is_in_the_repository():
    # A citation a reader of a clone cannot follow: the team's shared folder, the team's own issue tracker
    # (its numbers are small; an upstream project's issue or PR is a public source and stays), or a
    # repository path that does not exist.
    outside = re.compile(
        r"shared/(research|data|seeds)|/work/shared|\bissue #?\d{1,2}\b|\(#\d{1,2}\)|\(issue #?\d{1,2}\b"
    )
    missing, foreign = [], []
    for p, text in _cited_texts():
        if "docs/research" in p.as_posix():
            continue  # the research notes cite the public sources they were read from
        for n, line in enumerate(text.splitlines(), 1):
            if outside.search(line):
                foreign.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
            for ref in re.findall(
                r"\b((?:docs|benchmarks|tests|scripts|examples)/[\w./-]+\.(?:md|py|txt|jsonl|json|yaml))",
                line,
            ):
                if not (ROOT / ref).exists() and "*" not in ref:
                    missing.append(f"{p.relative_to(ROOT)}:{n}: {ref}")
    assert not foreign, "\n".join(foreign)
    assert not missing, "\n".join(missing)
