"""The engine registry (vramlab/engines.py) is the one list of engines: every reader takes its
names from it, a capability the registry denies is refused where a plan is validated, and no
other literal list of engine names is left in src/."""

from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path

import pytest

from vramlab.engines import ENGINES, aliases, canonical, label, names, served_engines, sim_engines

SRC = Path(__file__).resolve().parents[1] / "src" / "vramlab"


def test_every_reader_takes_the_registrys_names() -> None:
    from vramlab.capacity.settings import ENGINES as PLANNED
    from vramlab.cli.plan_args import ENGINES as PLAN_CHOICES
    from vramlab.logs.detect import ALIASES, PARSERS
    from vramlab.placement.inputs import ENGINES as PACKED
    from vramlab.sim.config import SIM_ENGINES

    assert PLANNED == PLAN_CHOICES == names() == tuple(PARSERS)
    assert SIM_ENGINES == sim_engines() == ("vllm", "sglang", "tgi", "llama.cpp")
    assert PACKED == served_engines() and "ollama" not in PACKED  # one daemon, many models: not packed
    assert ALIASES == aliases() and ALIASES["llamacpp"] == "llama.cpp"


@pytest.mark.parametrize("name", names())
def test_each_engines_modules_are_there(name: str) -> None:
    e = ENGINES[name]
    assert callable(import_module(e.plan_policy).plan)  # what `vramlab plan` calls
    assert callable(import_module(e.log_parser).parse)  # what check-log calls
    assert 0 < e.default_port < 65536 and label(name)


def test_names_and_aliases_resolve_in_any_case() -> None:
    assert canonical("LLAMACPP") == canonical(" llama-cpp ") == canonical("llama.cpp") == "llama.cpp"
    assert canonical("text-generation-inference") == "tgi" and canonical("vLLM") == "vllm"
    assert canonical("mystery") is None and label("mystery") == "mystery" and label("sglang") == "SGLang"


def test_the_metric_names_the_samplers_read_are_the_registrys() -> None:
    from vramlab.observe.prom_text import ALIASES

    for e in ENGINES.values():
        for canon, spellings in e.metrics.items():
            assert set(spellings) <= set(ALIASES[canon][0]), (e.name, canon)
    # first spelling first: vLLM's current name wins over its older one in the same scrape
    assert ALIASES["kv_cache_usage_perc"][0][:2] == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def test_a_sim_engine_is_one_the_registry_says_the_sim_plays() -> None:
    from pydantic import ValidationError

    from vramlab.plandoc import SimSettings

    for name, e in ENGINES.items():
        if e.sim:
            assert SimSettings(engine=name).engine == name  # type: ignore[arg-type]
        else:
            with pytest.raises(ValidationError):
                SimSettings(engine=name)  # type: ignore[arg-type]


def test_alerts_read_an_engine_by_any_of_its_names() -> None:
    from vramlab.alerts.rules import signals_for

    assert signals_for("llamacpp") == signals_for("llama.cpp")


# A per-engine table of behaviour (the sim's wordings, an engine's flags) is keyed by the registry's
# names, and a rule that holds for some engines names them (which engines read a flag, a policy's
# condition: from their source). What is left out is a list of the engines themselves, or of a
# capability the registry holds: every engine, the sim's, the served ones, or all but one.


def test_no_other_literal_list_of_engines_is_left_in_src() -> None:
    known = set(ENGINES) | {"llamacpp"}
    registry_sets = {frozenset(names()), frozenset(sim_engines()), frozenset(served_engines())}
    lists, tables = [], []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).as_posix()
        if rel == "engines.py":
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
                items = {e.value for e in n.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                named = frozenset(items & known)
                if named in registry_sets or len(named) >= len(ENGINES) - 1:
                    lists.append(f"{rel}:{n.lineno}: {sorted(items)}")
            if isinstance(n, ast.Dict):
                keys = {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if len(keys & known) >= 3 and not keys <= set(ENGINES):
                    tables.append(f"{rel}:{n.lineno}: {sorted(keys - set(ENGINES))}")
            if isinstance(n, ast.Subscript) and ast.unparse(n.value) == "Literal":
                text = ast.unparse(n)
                if sum(f"'{x}'" in text for x in known) >= 3:
                    lists.append(f"{rel}:{n.lineno}: {text}")
    assert not lists, lists
    assert not tables, tables  # keyed by a name the registry does not have
