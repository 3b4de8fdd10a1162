"""Size gates across src/: a module stays under 500 lines, a function under 80.

A long function is where six nested closures hide; a long module is two modules. The allow-list is
short and every entry says why it is still long. An entry that is no longer needed fails too, so the
list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _narrow import some

SRC = Path(__file__).resolve().parents[1] / "src" / "vramlab"
MODULE_MAX, FUNCTION_MAX = 500, 80

# "path:function": why it is still longer than FUNCTION_MAX lines
LONG_FUNCTIONS = {
    "load/driver.py:drive": "the load loop with its closures over one run's state; to be split with the one run engine",
    "sources/hf_config.py:_spec_from_config": "one flat read of config.json's many spellings, field by field",
    "sources/gguf_file.py:config_from_gguf": "one flat read of GGUF metadata keys, field by field",
    "placement/inputs.py:_schemas": "the pydantic schemas of the fleet and models files, declared in one place",
    "placement/explain.py:explain": "the pack explanation's sentences in reading order",
    "analysis/incident.py:analyse": "the incident's timings in the order a reader checks them",
    "drill/recovery.py:recover": "the recovery probe loop and its clocks",
    "report/svg.py:render_svg": "one SVG chart's elements in drawing order",
    "load/workers.py:_serve": "a worker process's loop: receive, run, report",
}
LONG_MODULES: dict[str, str] = {}


def _sizes(root: Path = SRC):
    modules, functions = {}, {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        text = p.read_text()
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{rel}:{node.name}"] = some(node.end_lineno) - node.lineno + 1
    return modules, functions


def test_modules_stay_under_the_line_limit():
    modules, _ = _sizes()
    long = {m: n for m, n in modules.items() if n > MODULE_MAX and m not in LONG_MODULES}
    assert not long, f"modules over {MODULE_MAX} lines: {long}"
    assert not [m for m in LONG_MODULES if modules.get(m, 0) <= MODULE_MAX], "allow-list entry no longer needed"


def test_functions_stay_under_the_line_limit():
    _, functions = _sizes()
    long = {f: n for f, n in functions.items() if n > FUNCTION_MAX and f not in LONG_FUNCTIONS}
    assert not long, f"functions over {FUNCTION_MAX} lines: {long}"
    stale = [f for f in LONG_FUNCTIONS if functions.get(f, 0) <= FUNCTION_MAX]
    assert not stale, f"allow-list entries no longer needed: {stale}"


def test_the_gate_sees_a_long_function_and_a_long_module(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_MAX))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"class C:\n    def long(self):\n{body}\n" + "\n" * MODULE_MAX)
    modules, functions = _sizes(tmp_path)
    assert functions["pkg/m.py:long"] == FUNCTION_MAX + 1
    assert modules["pkg/m.py"] > MODULE_MAX
