"""What a co-location drill found, from its stored events and samples (pure).

Per engine and phase: started / refused (with the engine's own text) / crashed / timeout; the
start-up race's verdict; each neighbour's probe errors while the target was loaded and while the
ramp added models (the blast radius); and what the ledger held after the rollback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vramlab.records.events import EventKind, engine_data, ledger_data, phase_start_data, race_data

PHASES = ("start_in_order", "race", "restart_in_order", "load", "ramp")


@dataclass(frozen=True)
class EngineOutcome:
    t_s: float
    phase: str
    engine: str
    outcome: str  # started | refused | crashed | timeout
    exit_code: int | None
    ready_s: float | None
    text: str


@dataclass(frozen=True)
class NeighbourErrors:
    name: str
    window: str  # "load" (baseline: the target loaded) | "ramp" (models added, until the rollback)
    probes: int
    failed: int


@dataclass(frozen=True)
class Colocation:
    outcomes: list[EngineOutcome]
    race_failed: list[str]
    race_started: list[str]
    neighbours: list[NeighbourErrors]
    ledger_used_bytes: int | None
    drill_pids_left: list[int] | None

    def engines(self) -> list[str]:
        seen: list[str] = []
        for o in self.outcomes:
            if o.engine not in seen:
                seen.append(o.engine)
        return seen

    def cell(self, engine: str, phase: str) -> EngineOutcome | None:
        """The last word on *engine* in *phase* (a crash after a start wins)."""
        found = [o for o in self.outcomes if o.engine == engine and o.phase == phase]
        return found[-1] if found else None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcomes": [o.__dict__ for o in self.outcomes],
            "race_failed": self.race_failed,
            "race_started": self.race_started,
            "neighbours": [n.__dict__ for n in self.neighbours],
            "ledger_used_bytes": self.ledger_used_bytes,
            "drill_pids_left": self.drill_pids_left,
        }


def _phase_of(ev: Any) -> str:
    during = str(engine_data(ev).get("during") or ev.phase or "")
    if during in PHASES:
        return during
    return "load" if during == "baseline" else "ramp"  # ramp, recovery: the models were being added


def analyse_colocation(events: Sequence[Any], samples: Sequence[Any]) -> Colocation | None:
    """None when the run had no co-location (no `engine` events)."""
    eng = [(e, engine_data(e)) for e in events if e.kind == EventKind.ENGINE]
    if not eng:
        return None
    outcomes = [
        EngineOutcome(
            e.t_s,
            _phase_of(e),
            str(d.get("engine")),
            str(d.get("outcome")),
            d.get("exit_code"),
            d.get("ready_s"),
            str(d.get("text") or ""),
        )
        for e, d in eng
    ]
    race_ev = next((e for e in events if e.kind == EventKind.RACE), None)
    ledger_ev = next((e for e in reversed(events) if e.kind == EventKind.LEDGER), None)
    race = race_data(race_ev) if race_ev else None
    ledger = ledger_data(ledger_ev) if ledger_ev else None
    return Colocation(
        outcomes,
        list(race.get("failed", [])) if race is not None else [],
        list(race.get("started", [])) if race is not None else [],
        _neighbour_errors(events, samples),
        ledger.get("used_bytes") if ledger is not None else None,
        ledger.get("drill_pids_left") if ledger is not None else None,
    )


def _windows(events: Sequence[Any]) -> dict[str, tuple[float, float]]:
    base = next(
        (
            e.t_s
            for e in events
            if e.kind == EventKind.PHASE_START and phase_start_data(e).get("phase") == "baseline"
        ),
        None,
    )
    first_step = next((e.t_s for e in events if e.kind == EventKind.STEP), None)
    end = next((e.t_s for e in events if e.kind == EventKind.ROLLBACK), None)
    end = end if end is not None else max((e.t_s for e in events), default=0.0)
    out: dict[str, tuple[float, float]] = {}
    if base is not None:
        out["load"] = (base, first_step if first_step is not None else end)
    if first_step is not None:
        out["ramp"] = (first_step, end)
    return out


def _neighbour_errors(events: Sequence[Any], samples: Sequence[Any]) -> list[NeighbourErrors]:
    wins = _windows(events)
    names = sorted(
        {s.name.split(".")[1] for s in samples if s.name.startswith("neighbour.") and s.name.endswith(".ok")}
    )
    out = []
    for n in names:
        oks = [(s.t_s, s.value) for s in samples if s.name == f"neighbour.{n}.ok"]
        for w, (a, b) in wins.items():
            inside = [v for t, v in oks if a <= t < b]
            out.append(NeighbourErrors(n, w, len(inside), sum(1 for v in inside if v < 0.5)))
    return out


__all__ = ["PHASES", "Colocation", "EngineOutcome", "NeighbourErrors", "analyse_colocation"]
