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


def _stored(store: Any, run_id: str) -> tuple[Any, Any, list[Any]]:
    """The run's report context, its composition and its measured windows; ConfigError (one line) when the
    run is unknown, stored no plan, or measured nothing."""
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
    return ctx, comp, measured_rows


def measure(store: Any, run_id: str) -> Any:
    """A RunMeasure from the store; ConfigError (one line) when the run cannot teach anything."""
    from vramlab.capacity.run_calibration import RunMeasure
    from vramlab.run.capacity_plan import PlanFacts, resolve_facts

    ctx, comp, measured_rows = _stored(store, run_id)
    rid = ctx.run.run_id
    f = comp.plan_facts
    planned, printed = dict(f.get("settings") or {}), engine_settings(comp.startup)
    spec, card, settings = resolve_facts(
        PlanFacts(
            f.get("model"),
            f.get("engine"),
            f.get("gpu"),
            f.get("gpu_memory_gib"),
            f.get("engine_version"),
            {**planned, **printed},
        )
    )
    heaviest = (
        max(measured_rows, key=lambda r: r.figure("peak").measured_bytes or 0) if measured_rows else None
    )
    host = bool(comp.plan and comp.plan.get("gpu") == "cpu")
    measured, evidence, rows = heaviest_figures(heaviest, host)
    differs = {k: v for k, v in printed.items() if planned.get(k) != v}
    if differs:
        said = ", ".join(f"{k} {v}" for k, v in sorted(differs.items()))
        rows.append(
            f"planned with the settings its start-up log printed ({said}): the constants, not the settings, are fitted"
        )
    startup = startup_fields(comp.startup)
    rest = None
    w = (comp.startup or {}).get("weights_bytes") or measured.get("resident_model")
    pool = measured.get("kv_cache")
    if comp.rest_bytes is not None and w and pool and heaviest is not None and not host:
        rest = comp.rest_bytes - int(w) - pool
        rows.append(f"device at rest: {comp.rest_bytes / (1 << 30):.3f} GiB")
    windows, how = runtime_windows(ctx.samples, comp, startup, settings.engine) if host else ((), {})
    if heaviest is not None:
        at = next((x for x in windows if x[0] == window_label(heaviest)), None)
        measured.update(
            {"runtime": at[1], **({"api_server": at[2]} if at[2] is not None else {})} if at else {}
        )
    resident_src = heaviest.figure("resident_model").source if heaviest is not None else ""
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
        host,
        ("weights", "runtime", "api_server")
        if host and resident_src.startswith("host memory")
        else ("weights",),
        windows,
        how,
    )


def window_label(row: Any) -> str:
    return (
        f"round {row.round} {row.phase} {row.step_value:g}"
        if row.step_value is not None
        else (f"round {row.round} {row.phase}")
    )


def heaviest_figures(heaviest: Any, host: bool = False) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """The figures measured at the run's heaviest window (a device's; a host reading only where the plan
    is for the host: it is no card's), their sources, and the window's line."""
    from vramlab.capacity.run_calibration import FIGURES

    measured: dict[str, int] = {}
    evidence: dict[str, str] = {}
    if heaviest is None:
        return measured, evidence, []
    for name in FIGURES:
        fig = heaviest.figure(name)
        if fig.measured_bytes is not None and (host or not fig.host_memory):
            measured[name], evidence[name] = fig.measured_bytes, fig.source
    h = heaviest
    return measured, evidence, [f"round {h.round} {h.phase} {h.step_value} ({h.start_s:.1f}-{h.end_s:.1f} s)"]


def runtime_windows(
    samples: Any, comp: Any, startup: dict[str, float], engine: str
) -> tuple[tuple[tuple[str, int, int | None], ...], dict[str, str]]:
    """A CPU engine's runtime per window from the host's readings of its processes (analysis/host_runtime.py),
    and how they were derived per observed field (or, under "none", why there are none)."""
    from vramlab.analysis.host_runtime import Window, split_readings, tree_readings

    wins = [Window(window_label(r), r.start_s, r.end_s) for r in comp.rows]
    pool = next((r.figure("kv_cache").measured_bytes for r in comp.rows), None)
    mib = 1 << 20
    if engine == "vllm":
        if not pool:
            return (), {
                "none": "the engine showed its KV pool in tokens only: the worker's reading cannot be split"
            }
        comps = (comp.plan or {}).get("components", ())
        weights = next((int(c["bytes"]) for c in comps if c["name"] == "weights"), 0)
        reads = split_readings(samples, wins, weights + pool)
        how = {
            "runtime_bytes": f"the worker process's (VLLM::Worker) highest resident set less the weights "
            f"({weights / mib:,.1f} MiB: the model file's tensors, as planned; the CPU build prints no loaded size) "
            f"and the KV pool ({pool / mib:,.1f} MiB, the engine's words)",
            "api_server_bytes": "the rest of the process tree (API server, engine core) at its highest",
            "none": "the host's readings name no VLLM::Worker process (a build without setproctitle, or a run "
            "stored before vramlab read each process): the worker cannot be told from the front end",
        }
    elif engine == "llama.cpp":
        model = ((comp.startup or {}).get("extra") or {}).get("host_weights_bytes")
        compute = startup.get("activation_peak_bytes")
        if not (model and pool and compute):
            return (), {
                "none": "its start-up log printed no model, KV or compute buffer: its runtime is not told apart"
            }
        held = int(model + pool + compute)
        reads = tree_readings(samples, wins, held)
        how = {
            "runtime_bytes": "the server's process tree at its highest less the model, KV and compute buffers its "
            f"start-up log printed ({held / mib:,.1f} MiB)",
            "none": "no reading of the server's process tree above its buffers",
        }
    else:
        return (), {
            "none": "its KV cache grows inside the same resident set as its runtime: a window's reading is no "
            "runtime alone, so nothing is fitted from it"
        }
    return tuple((r.window, r.runtime_bytes, r.front_bytes) for r in reads), how


# settings a start-up log prints that the plan takes (logs/<engine>.py parse them into these names)
_PRINTED_SETTINGS = ("ctx_size", "parallel", "n_ubatch", "flash_attn", "kv_cache_dtype", "cache_type_v")


def engine_settings(startup: dict[str, Any] | None) -> dict[str, Any]:
    """The settings the engine printed at start-up (its truth where the plan's block guessed)."""
    printed = (startup or {}).get("settings") or {}
    return {k: printed[k] for k in _PRINTED_SETTINGS if printed.get(k) is not None}


def startup_fields(startup: dict[str, Any] | None) -> dict[str, float]:
    """The start-up log's byte figures by their plan-JSON names. A CPU-only llama.cpp prints its graph's
    compute buffer on the host ("CPU compute buffer size"): that is the compute buffer the plan sizes
    (its activation_peak component) when no device printed one."""
    s = startup or {}
    out = {k: float(v) for k, v in s.items() if k.endswith("_bytes") and isinstance(v, int)}
    host_compute = (s.get("extra") or {}).get("host_compute_bytes")
    if s.get("engine") == "llama.cpp" and "activation_peak_bytes" not in out and host_compute:
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
