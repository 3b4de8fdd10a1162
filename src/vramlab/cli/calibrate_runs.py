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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.records.capacity_plan import StartupObservation

RUN_ID = re.compile(r"^[0-9a-f]{4,8}$")


def looks_like_runs(inputs: list[str]) -> bool:
    """Every input is a run id (or its prefix) and none is a file: the run mode."""
    return bool(inputs) and all(RUN_ID.match(x) and not Path(x).exists() for x in inputs)


def measure(store: Any, run_id: str) -> Any:
    """A RunMeasure from the store; ConfigError (one line) when the run cannot teach anything."""
    from vramlab.capacity.run_calibration import RunMeasure
    from vramlab.errors import ConfigError
    from vramlab.report import load_context
    from vramlab.report.composition import composition_of
    from vramlab.run.capacity_plan import PlanFacts, resolve_facts

    try:
        ctx = load_context(store, run_id)
    except (KeyError, LookupError) as exc:
        raise ConfigError(f"run {run_id}: not in the store ({exc})") from None
    rid = ctx.run.run_id
    comp = composition_of(ctx)
    if comp.plan is None or comp.plan_facts is None:
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
    planned, printed = dict(f.settings), engine_settings(comp.startup)
    spec, card, settings = resolve_facts(
        PlanFacts(f.model, f.engine, f.gpu, f.gpu_memory_gib, f.engine_version, {**planned, **printed})
    )
    heaviest = (
        max(measured_rows, key=lambda r: r.figure("peak").measured_bytes or 0) if measured_rows else None
    )
    measured, evidence, rows = heaviest_figures(heaviest)
    differs = {k: v for k, v in printed.items() if planned.get(k) != v}
    if differs:
        said = ", ".join(f"{k} {v}" for k, v in sorted(differs.items()))
        rows.append(
            f"planned with the settings its start-up log printed ({said}): the constants, not the settings, are fitted"
        )
    startup = startup_fields(comp.startup)
    rest = None
    w = (comp.startup.weights_bytes if comp.startup else None) or measured.get("resident_model")
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
        rid,
        settings.engine,
        spec,
        card,
        settings,
        measured,
        rest,
        startup,
        evidence,
        tuple(rows),
        host_runtime(comp, heaviest, startup),
    )


def heaviest_figures(heaviest: Any) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """The figures measured at the run's heaviest window (a device's: a host reading is no card's),
    their sources, and the window's line."""
    from vramlab.capacity.run_calibration import FIGURES

    measured: dict[str, int] = {}
    evidence: dict[str, str] = {}
    if heaviest is None:
        return measured, evidence, []
    for name in FIGURES:
        fig = heaviest.figure(name)
        if fig.measured_bytes is not None and not fig.host_memory:
            measured[name], evidence[name] = fig.measured_bytes, fig.source
    h = heaviest
    return measured, evidence, [f"round {h.round} {h.phase} {h.step_value} ({h.start_s:.1f}-{h.end_s:.1f} s)"]


def host_runtime(comp: Any, heaviest: Any, startup: dict[str, float]) -> int | None:
    """A CPU engine's runtime: its process tree's RSS at rest (before the first request) less the
    model, KV and compute buffers its start-up log printed; None where any of them is unknown."""
    if heaviest is None or not heaviest.figure("peak").host_memory or comp.rest_bytes is None:
        return None
    model = heaviest.figure("resident_model").measured_bytes
    pool = heaviest.figure("kv_cache").measured_bytes
    compute = startup.get("activation_peak_bytes")
    if not (model and pool and compute):
        return None
    left = int(comp.rest_bytes - model - pool - compute)
    return left if left > 0 else None


# settings a start-up log prints that the plan takes (logs/<engine>.py parse them into these names)
_PRINTED_SETTINGS = ("ctx_size", "parallel", "n_ubatch", "flash_attn", "kv_cache_dtype", "cache_type_v")


def engine_settings(startup: StartupObservation | None) -> dict[str, object]:
    """The settings the engine printed at start-up (its truth where the plan's block guessed)."""
    printed = startup.settings if startup else {}
    return {k: printed[k] for k in _PRINTED_SETTINGS if printed.get(k) is not None}


def startup_fields(startup: StartupObservation | None) -> dict[str, float]:
    """The start-up log's byte figures by their plan-JSON names. A CPU-only llama.cpp prints its graph's
    compute buffer on the host ("CPU compute buffer size"): that is the compute buffer the plan sizes
    (its activation_peak component) when no device printed one."""
    if startup is None:
        return {}
    out = {k: float(v) for k, v in startup.byte_figures.items()}
    host_compute = startup.extra_number("host_compute_bytes")
    if startup.engine == "llama.cpp" and "activation_peak_bytes" not in out and host_compute:
        out["activation_peak_bytes"] = float(host_compute)
    return out


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
