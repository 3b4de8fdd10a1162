"""One plan loader (vramlab.planfile) for run plans, drill plans and pack's fleet/models files:
every file error names the file and the line, in one format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vramlab.drill.plan import load_plan as load_drill_plan
from vramlab.errors import ConfigError
from vramlab.experiment.plan import load_plan as load_run_plan
from vramlab.placement.inputs import load_fleet, load_models
from vramlab.planfile import parse_yaml, validate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LOADERS = {
    "run": (load_run_plan, "concurrency-ramp.yaml"),
    "drill": (load_drill_plan, "oom-drill.yaml"),
    "fleet": (load_fleet, "fleet.yaml"),
    "models": (load_models, "models.yaml"),
}


def _error(loader, path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        loader(path)
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("which", sorted(LOADERS))
def test_the_example_loads(which: str) -> None:
    loader, example = LOADERS[which]
    assert loader(EXAMPLES / example)


@pytest.mark.parametrize("which", sorted(LOADERS))
def test_an_unknown_key_is_named_at_its_line(which: str, tmp_path: Path) -> None:
    loader, example = LOADERS[which]
    lines = (EXAMPLES / example).read_text().splitlines()
    first_key = next(i for i, ln in enumerate(lines) if re.match(r"^[a-z_]+:", ln))
    lines.insert(first_key, "colour_of_the_sky: blue")
    bad = tmp_path / example
    bad.write_text("\n".join(lines) + "\n")
    assert _error(loader, bad) == f"{bad}:{first_key + 1}: colour_of_the_sky: unknown field"


@pytest.mark.parametrize("which", ["run", "drill"])
def test_an_unknown_nested_key_is_named_at_its_line(which: str, tmp_path: Path) -> None:
    loader, example = LOADERS[which]
    lines = (EXAMPLES / example).read_text().splitlines()
    head = next(
        i
        for i, ln in enumerate(lines)
        if re.match(r"^[a-z_]+:\s*(#.*)?$", ln) and re.match(r"^  [a-z_]+:", lines[i + 1])
    )
    lines.insert(head + 1, "  colour_of_the_sky: blue")
    bad = tmp_path / example
    bad.write_text("\n".join(lines) + "\n")
    section = lines[head].split(":")[0]
    assert _error(loader, bad) == f"{bad}:{head + 2}: {section}.colour_of_the_sky: unknown field"


@pytest.mark.parametrize("which", sorted(LOADERS))
def test_broken_yaml_empty_files_lists_and_missing_files(which: str, tmp_path: Path) -> None:
    loader, example = LOADERS[which]
    bad = tmp_path / example
    bad.write_text("name: x\nbroken: [1, 2\nmore: 3\n")
    assert re.match(rf"^{re.escape(str(bad))}:\d+: not valid YAML: ", _error(loader, bad))
    bad.write_text("")
    assert _error(loader, bad) == f"{bad}:1: the file is empty"
    bad.write_text("- a\n- b\n")
    assert re.match(
        rf"^{re.escape(str(bad))}:1: an? [a-z ]+ is a mapping \(.+\), got list$", _error(loader, bad)
    )
    assert re.match(
        rf"^{re.escape(str(tmp_path / 'nope.yaml'))}: no such \w+ file$",
        _error(loader, tmp_path / "nope.yaml"),
    )


def test_a_drill_plan_value_error_carries_the_line(tmp_path: Path) -> None:
    """Drill plans had no line numbers before the shared loader."""
    text = (EXAMPLES / "oom-drill.yaml").read_text().replace("  step_s: 1\n", "  step_s: soon\n")
    bad = tmp_path / "d.yaml"
    bad.write_text(text)
    assert _error(load_drill_plan, bad).startswith(f"{bad}:{_line_of(text, 'step_s: soon')}: ramp.step_s: ")


def test_a_missing_field_is_shown_at_its_parent_and_sequence_items_where_they_start() -> None:
    from pydantic import BaseModel, ConfigDict, Field

    class Item(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int = Field(gt=0)

    class Doc(BaseModel):
        model_config = ConfigDict(extra="forbid")
        target: dict[str, str]
        inner: Item
        items: list[Item]

    text = "target: {a: b}\ninner:\n  m: 1\nitems:\n  - n: 1\n  - n: 0\n"
    with pytest.raises(ConfigError, match=r"^x.yaml:2: inner.n: required field is missing \(and 2 more\)$"):
        validate(Doc, parse_yaml(text, "x.yaml"))
    with pytest.raises(ConfigError, match=r"^x.yaml:6: items\[1\].n: Input should be greater than 0$"):
        validate(Doc, parse_yaml(text.replace("  m: 1", "  n: 1"), "x.yaml"))
    with pytest.raises(ConfigError, match=r"^in memory: items\[1\].n: "):
        validate(Doc, {"target": {}, "inner": {"n": 1}, "items": [{"n": 1}, {"n": 0}]}, "in memory")
