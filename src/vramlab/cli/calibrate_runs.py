"""`vramlab calibrate RUN_ID [RUN_ID ...]`: learn from stored runs (capacity.run_calibration).

Reads each run from the store, sets its stored capacity plan beside its measured composition
(vramlab.analysis.composition), fits the constants the measurements inform, writes the same
profile `plan --calibration` reads, and prints the error before and after, on the runs learned
from and on `--holdout` runs. A run with no plan or no usable measurement is refused (exit 2).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

RUN_ID = re.compile(r"^[0-9a-f]{4,8}$")


def looks_like_runs(inputs: list[str]) -> bool:
    """Every input is a run id (or its prefix) and none is a file: the run mode."""
    return bool(inputs) and all(RUN_ID.match(x) and not Path(x).exists() for x in inputs)


def measure(store: Any, run_id: str) -> Any:
    """A RunMeasure from the store; ConfigError (one line) when the run cannot teach anything."""
    from vramlab.capacity.run_calibration import FIGURES, RunMeasure
    from vramlab.drill.capacity_plan import PlanFacts, resolve_facts
    from vramlab.errors import ConfigError
    from vramlab.report import load_context
    from vramlab.report.composition import composition_of

    try:
        ctx = load_context(store, run_id)
    except (KeyError, LookupError) as exc:
        raise ConfigError(f"run {run_id}: not in the store ({exc})") from None
    rid = ctx.run.run_id
    comp = composition_of(ctx)
    if comp.plan is None or not comp.plan_facts:
        why = (
            "; ".join(comp.notes)
            or "the run stored no capacity plan (it predates it, or its facts were unknown)"
        )
        raise ConfigError(f"run {rid}: no capacity plan stored with it, nothing to compare against: {why}")
    measured_rows = [r for r in comp.rows if r.figure("peak").measured_bytes is not None]
    if not measured_rows and comp.startup is None:
        raise ConfigError(
            f"run {rid}: no usable memory measurement (no start-up log figures and no device or "
            "host reading); run it with a gpu/ledger sampler or target.log_file"
        )
    f = comp.plan_facts
    spec, card, settings = resolve_facts(
        PlanFacts(
            f.get("model"),
            f.get("engine"),
            f.get("gpu"),
            f.get("gpu_memory_gib"),
            f.get("engine_version"),
            dict(f.get("settings") or {}),
        )
    )
    heaviest = (
        max(measured_rows, key=lambda r: r.figure("peak").measured_bytes or 0) if measured_rows else None
    )
    measured: dict[str, int] = {}
    evidence: dict[str, str] = {}
    rows: list[str] = []
    if heaviest is not None:
        rows.append(
            f"round {heaviest.round} {heaviest.phase} {heaviest.step_value} "
            f"({heaviest.start_s:.1f}-{heaviest.end_s:.1f} s)"
        )
        for name in FIGURES:
            fig = heaviest.figure(name)
            if fig.measured_bytes is not None and not fig.host_memory:
                measured[name], evidence[name] = fig.measured_bytes, fig.source
    startup = {
        k: float(v) for k, v in (comp.startup or {}).items() if k.endswith("_bytes") and isinstance(v, int)
    }
    rest = None
    w = (comp.startup or {}).get("weights_bytes") or measured.get("resident_model")
    pool = measured.get("kv_cache")
    if (
        comp.rest_bytes is not None
        and w
        and pool
        and heaviest is not None
        and not heaviest.figure("peak").host_memory
    ):
        rest = comp.rest_bytes - int(w) - pool
        rows.append(f"device at rest: {comp.rest_bytes / (1 << 30):.3f} GiB")
    return RunMeasure(
        rid, settings.engine, spec, card, settings, measured, rest, startup, evidence, tuple(rows)
    )


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity import estimate
    from vramlab.capacity.run_calibration import calibrate_runs, summary
    from vramlab.errors import ConfigError
    from vramlab.store import open_store

    holdout_ids = list(args.holdout or [])
    if any(not RUN_ID.match(h) for h in holdout_ids):
        raise ConfigError("--holdout takes run ids")
    with open_store(args.db) as store:
        learned = [measure(store, r) for r in args.inputs]
        held = [measure(store, r) for r in holdout_ids]
    name = Path(args.output).name if args.output else "calibration"
    cal = calibrate_runs(
        learned, held, lambda m, g, s, c: estimate(m, g, s, c, with_suggestions=False), name, args.min_points
    )
    written = None
    if args.output and cal.profile is not None:
        from vramlab.logs.profile import write_profile

        write_profile(args.output, cal.profile)
        written = args.output
    if args.json:
        print(json.dumps({**summary(cal), "profile": written}, indent=1))
    else:
        from vramlab.report.calibrate_text import render_runs

        print(render_runs(cal, written))
    if not cal.fitted_any:
        import sys

        print(
            "vramlab calibrate: error: no constant was fitted ("
            + "; ".join(cal.not_fitted[:2])
            + ")"
            + ("; no profile written" if args.output else ""),
            file=sys.stderr,
        )
        return 1
    return 0
