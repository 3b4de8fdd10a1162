"""mypy checks every event's payload where it is written (vramlab.records.emit): a key its kind does not
declare, or a value of the wrong type, is a type error; the right payload is clean. mypy runs on small
snippets that import the real modules, so a constructor that loses its type (an `Any` on the emit
path) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

_HEAD = """\
from vramlab.records import SampleRecord, emit as E
from vramlab.records.emit import Draft
"""

SNIPPETS = {
    "right": """
a: Draft = E.FAULT("failed during context = 4096 tokens", {"step": 3, "mode": "oom", "t0_s": 1.5})
b: Draft = E.ALERT("kv firing", {"name": "kv", "for": "1m", "severity": None})
c: Draft = E.WARNING("rounds: 1 is fewer than 3", {"plan_field": "rounds"})
d: Draft = E.samples([SampleRecord(run_id="r", t_s=0.0, source="gpu", name="gpu.used_bytes", value=1.0)])
e: Draft = E.PHASE_END("baseline")
""",
    "wrong_key": """
E.FAULT("failed", {"step": 3, "mood": "oom"})
""",
    "wrong_value": """
E.FAULT("failed", {"step": "three"})
""",
    "wrong_kind_payload": """
E.STEP("a step", {"served_again_s": 1.0})
""",
    "untyped_dict": """
data = {"step": 3}
E.FAULT("failed", data)
""",
    "record_for_samples": """
E.samples("not records")
""",
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """mypy --strict over every snippet at once: each snippet's (error count, report)."""
    from mypy import api

    root = tmp_path_factory.mktemp("emit_types")
    paths = {}
    for name, body in SNIPPETS.items():
        paths[name] = root / f"snippet_{name}.py"
        paths[name].write_text(_HEAD + body)
    config = root / "mypy.ini"  # the snippets' own settings: the real package from src/, only they reported
    config.write_text(f"[mypy]\nmypy_path = {SRC}\nfollow_imports = silent\n")
    out, err, _ = api.run(
        ["--config-file", str(config), "--strict", "--cache-dir", "/dev/null", *map(str, paths.values())]
    )
    assert not err, err
    lines = out.splitlines()
    return {
        name: (sum(1 for ln in lines if ln.startswith(str(p)) and ": error:" in ln), out)
        for name, p in paths.items()
    }


@pytest.mark.slow
def test_the_right_payload_type_checks_clean(checked: dict[str, tuple[int, str]]) -> None:
    errors, out = checked["right"]
    assert errors == 0, out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["wrong_key", "wrong_value", "wrong_kind_payload", "untyped_dict", "record_for_samples"]
)
def test_a_wrong_payload_is_a_type_error(checked: dict[str, tuple[int, str]], name: str) -> None:
    errors, out = checked[name]
    assert errors == 1, out


def test_every_writer_in_src_goes_through_a_typed_constructor() -> None:
    """A `Draft` is made only by its kind's constructor (records/emit.py) and an `Event` only by the
    runner, which stamps a draft: no writer can hand the runner an unchecked payload."""
    import ast

    makers = {"Draft": {"records/emit.py"}, "Event": {"run/runner.py"}}
    bad = []
    for p in sorted((SRC / "vramlab").rglob("*.py")):
        rel = p.relative_to(SRC / "vramlab").as_posix()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and getattr(f.value, "id", None) in ("asyncio", "threading"):
                    continue  # their own Event, not ours
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in makers and rel not in makers[name]:
                    bad.append(f"{rel}:{node.lineno}: {name}(...)")
    assert not bad, bad
