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
    from vramlab.infile import exists

    return bool(inputs) and all(RUN_ID.match(x) and not exists(x) for x in inputs)


def measure(store: Any, run_id: str, notes: list[str]) -> Any:
    """A RunMeasure from the store; ConfigError (one line) when the run cannot teach anything.
    A stored figure no measurement can have is left out, and said in *notes*."""
    from vramlab.errors import ConfigError
    from vramlab.report import load_context
    from vramlab.report.composition import composition_of
    from vramlab.report.sections import DATA_ERRORS
    from vramlab.store.sql import StoreRowError

    try:
        ctx = load_context(store, run_id)
    except (KeyError, LookupError) as exc:
        raise ConfigError(f"run {run_id}: not in the store ({exc})") from None
    try:
        return _measure(ctx, composition_of(ctx), notes)
    except ConfigError as exc:
        problems = getattr(store, "read_problems", None)
        if not problems:
            raise
        # the run would teach something but for rows the store could not read: say which (exit 1)
        raise StoreRowError(f"{exc}; {problems.summary()}"[:600]) from None
    except DATA_ERRORS as exc:  # a stored plan or figure of the wrong shape: that run, said so
        raise StoreRowError(
            f"run {ctx.run.run_id}: its stored capacity plan or measurements cannot be read "
            f"({type(exc).__name__}: {exc})"[:400]
        ) from None


def _measure(ctx: Any, comp: Any, notes: list[str]) -> Any:
    from vramlab.capacity.run_calibration import RunMeasure
    from vramlab.errors import ConfigError
    from vramlab.run.capacity_plan import PlanFacts, resolve_facts

    rid = ctx.run.run_id
    if comp.plan is None or comp.plan_facts is None:
        why = (
            "; ".join(comp.notes)
            or "the run stored no capacity plan (it predates it, or its facts were unknown)"
        )
        raise ConfigError(f"run {rid}: no capacity plan stored with it, nothing to compare against: {why}")
    f = comp.plan_facts
    startup_doc = _startup(comp.startup.document if comp.startup else None, rid, notes)
    planned, printed = dict(f.settings), engine_settings(startup_doc)
    spec, card, settings = resolve_facts(
        PlanFacts(
            f.model,
            f.engine,
            f.gpu,
            f.gpu_memory_gib,
            f.engine_version,
            {**planned, **printed},
        )
    )
    usable = _checker(rid, card.memory_bytes or None, notes)
    measured_rows = [r for r in comp.rows if usable("peak", r.figure("peak"))]
    if not measured_rows and not startup_doc:
        raise ConfigError(
            f"run {rid}: no usable memory measurement (no start-up log figures and no device or "
            "host reading it could use); run it with a gpu/ledger sampler or target.log_file"
            + (f" ({notes[-1]})" if notes else "")
        )
    heaviest = max(measured_rows, key=lambda r: r.figure("peak").measured_bytes) if measured_rows else None
    # planned on the host, or measured there (a run whose plan named no card): a host reading is the run's own
    host = (comp.plan is not None and comp.plan.gpu == "cpu") or (
        heaviest is not None and heaviest.figure("peak").host_memory
    )
    measured, evidence, rows = heaviest_figures(heaviest, usable, host)
    differs = {k: v for k, v in printed.items() if planned.get(k) != v}
    if differs:
        said = ", ".join(f"{k} {v}" for k, v in sorted(differs.items()))
        rows.append(
            f"planned with the settings its start-up log printed ({said}): the constants, not the settings, are fitted"
        )
    startup = startup_fields(startup_doc)
    w = startup_doc.get("weights_bytes") or measured.get("resident_model")
    pool = measured.get("kv_cache")
    rest = None
    if comp.rest_bytes is not None and w and pool and heaviest is not None and not host:
        if usable("device at rest", comp.rest_bytes):
            rest = _at_rest(comp.rest_bytes, int(w), pool, rid, notes, rows)
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


def _checker(rid: str, card_bytes: int | None, notes: list[str]) -> Any:
    """usable(name, figure or bytes): whether a stored figure passes the checks a log's figures pass
    (logs.calibrate.implausible_bytes; a host reading against no card); a failure is noted."""
    from vramlab.logs.calibrate import implausible_bytes

    def usable(name: str, fig: Any) -> bool:
        value, host = (
            (fig, False) if not hasattr(fig, "measured_bytes") else (fig.measured_bytes, fig.host_memory)
        )
        if value is None:
            return False
        component = name in ("resident_model", "kv_cache")
        why = implausible_bytes(name, value, None if host else card_bytes, component)
        if why is not None:
            notes.append(f"run {rid}: stored {why}; left out of the fit")
        return why is None

    return usable


def _at_rest(
    rest_bytes: int, weights: int, pool: int, rid: str, notes: list[str], rows: list[str]
) -> int | None:
    """What the device held at rest beyond the weights and the KV pool; None (said) when it held less."""
    if rest_bytes - weights - pool < 0:
        notes.append(
            f"run {rid}: the device at rest ({rest_bytes / (1 << 30):.3f} GiB) holds less than "
            "the weights and the KV pool it measured; its overhead is left out of the fit"
        )
        return None
    rows.append(f"device at rest: {rest_bytes / (1 << 30):.3f} GiB")
    return rest_bytes - weights - pool


def heaviest_figures(
    heaviest: Any, usable: Any = None, host: bool = False
) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """The figures measured at the run's heaviest window (a device's; a host reading only where the plan
    is for the host: it is no card's) that pass *usable*, their sources, and the window's line."""
    from vramlab.capacity.run_calibration import FIGURES

    measured: dict[str, int] = {}
    evidence: dict[str, str] = {}
    if heaviest is None:
        return measured, evidence, []
    for name in FIGURES:
        fig = heaviest.figure(name)
        if (
            fig.measured_bytes is not None
            and (host or not fig.host_memory)
            and (usable is None or usable(name, fig))
        ):
            measured[name], evidence[name] = int(fig.measured_bytes), fig.source
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
        comps = comp.plan.components if comp.plan is not None else ()
        weights = next((c.bytes for c in comps if c.name == "weights"), 0)
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
        model = ((comp.startup.document if comp.startup else {}).get("extra") or {}).get("host_weights_bytes")
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


def _startup(doc: Any, rid: str, notes: list[str]) -> dict[str, Any]:
    """The run's start-up log figures if they pass the checks `calibrate LOG` applies, else {}."""
    from pydantic import ValidationError

    from vramlab.logs.calibrate import impossible
    from vramlab.logs.observation import Observation

    if not doc:
        return {}
    flags = (
        [k for k, v in doc.items() if k.endswith("_bytes") and isinstance(v, bool)]
        if isinstance(doc, dict)
        else []
    )
    if flags:  # pydantic would read true as 1 byte
        notes.append(
            f"run {rid}: stored start-up figures left out of the fit: {flags[0]} is {doc[flags[0]]!r}, not a number"
        )
        return {}
    try:
        obs = Observation.model_validate(doc)
        why = impossible(obs)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        why = f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    except TypeError:
        why = f"not an observation ({type(doc).__name__})"
    if why is not None:
        notes.append(f"run {rid}: stored start-up figures left out of the fit: {why}")
        return {}
    return {k: v for k, v in obs.model_dump().items() if v is not None}


def run(args: argparse.Namespace) -> int:
    from vramlab.capacity import estimate
    from vramlab.capacity.run_calibration import calibrate_runs, summary
    from vramlab.errors import ConfigError
    from vramlab.store import open_store

    holdout_ids = list(args.holdout or [])
    if any(not RUN_ID.match(h) for h in holdout_ids):
        raise ConfigError("--holdout takes run ids")
    if args.output:
        from vramlab.cli.outputs import check_writable

        check_writable(args.output, "calibration profile")  # before the fit, not after it
    notes: list[str] = []
    with open_store(args.db) as store:
        learned = [measure(store, r, notes) for r in args.inputs]
        held = [measure(store, r, notes) for r in holdout_ids]
        unread = getattr(store, "read_problems", None)
    name = Path(args.output).name if args.output else "calibration"
    cal = calibrate_runs(
        learned, held, lambda m, g, s, c: estimate(m, g, s, c, with_suggestions=False), name, args.min_points
    )
    written, failed = _write(args.output, cal.profile)
    if args.json:
        print(
            json.dumps({**summary(cal), "profile": written, "left_out": list(dict.fromkeys(notes))}, indent=1)
        )
    else:
        from vramlab.report.calibrate_text import render_runs

        print(render_runs(cal, written))
    import sys
    from collections import Counter

    for note, times in Counter(notes).items():  # one line per finding, however many windows had it
        print(
            f"vramlab calibrate: note: {note}" + (f" ({times} windows)" if times > 1 else ""), file=sys.stderr
        )
    if failed is not None:
        raise failed  # after the fit is printed: the work is not lost
    if unread:
        print(f"vramlab calibrate: warning: {unread.summary()}", file=sys.stderr)
    if not cal.fitted_any:
        print(
            "vramlab calibrate: error: no constant was fitted ("
            + "; ".join(cal.not_fitted[:2])
            + ")"
            + ("; no profile written" if args.output else ""),
            file=sys.stderr,
        )
        return 1
    return 1 if unread else 0


def _write(output: str | None, profile: Any) -> tuple[str | None, Exception | None]:
    """Write the profile; a failure is returned, to be raised after the fit is printed."""
    if not output or profile is None:
        return None, None
    from vramlab.capacity.calibration import profile_to_toml
    from vramlab.cli.outputs import write_output
    from vramlab.errors import OutputError

    try:
        write_output(
            output,
            profile_to_toml(profile),
            "calibration profile",
            "no profile written; the fit is printed (run calibrate again to write it)",
        )
    except OutputError as exc:
        return None, exc
    return output, None
