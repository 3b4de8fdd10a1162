"""Calibrate from stored runs: the constants a run's measured memory composition informs.

A run that stored its capacity plan measured, per window, the resident model, the KV pool, the
runtime overhead and the peak (vramlab.analysis.composition). Of the model's constants, those
measurements inform:

- what the start-up log printed (the same figures `calibrate LOG` fits: activation peak, CUDA
  graphs, vLLM's non-torch memory), as check-log's parser read them at the run's start;
- vLLM's non-torch memory, from the device's reading at rest (before the first request): what it
  holds beyond the weights and the KV pool, less the CUDA graphs (the log's, else the plan's) and
  the CUDA context (the plan's), is the non-torch memory the profile charged. A run cannot tell
  those parts apart; the rest of the overhead is charged to the non-torch constant, and said so.

- a CPU engine's runtime terms (vLLM's CPU worker and its front end, llama.cpp's server process),
  from the host's readings of its processes, one reading a window (analysis/host_runtime.py): each
  window is one observation of the same terms under that window's load. These terms depend on no
  setting the plan has (a constant add-on for an engine build on a host), so one run of one
  configuration informs them: its windows are repeated readings of the terms, enough for the points a
  constant needs. The fitted value is the windows' robust centre; the band their spread.

The activation workspace a run sees is what its heaviest step needed: a lower bound of the
profiled peak, so it is reported, never fitted. The fit itself is `capacity.calibration.fit`,
one case per run (and one per window for the runtime terms). Pure: the caller reads the store and
resolves the models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.capacity.calibration import Case, Fit, Profile, fit, profile_from_fits
from vramlab.capacity.constants import MIN_POINTS, Constants
from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.settings import EngineSettings
from vramlab.capacity.spec import ModelSpec

MIB = 1 << 20

FIGURES = ("resident_model", "kv_cache", "runtime_overhead", "peak")
RUNTIME_FIGURES = ("runtime", "api_server")  # a CPU engine's runtime terms, as the plan names its components
_LOG_FIELDS = ("activation_peak_bytes", "cuda_graph_bytes", "non_torch_bytes", "init_non_torch_bytes")
_LOG_WORDS = {("llama.cpp", "activation_peak_bytes"): "compute buffer"}  # what the engine calls the field


@dataclass(frozen=True)
class RunMeasure:
    """What one stored run measured, with what it was planned for."""

    run_id: str
    engine: str
    model: ModelSpec
    gpu: GPU
    settings: EngineSettings
    measured: dict[str, int]  # figure -> bytes at the run's heaviest window (FIGURES)
    rest_overhead_bytes: int | None  # device at rest less weights and KV pool
    startup_fields: dict[str, float]  # plan-JSON field -> value, from the start-up log
    evidence: dict[str, str]  # figure -> where it was measured (the report's sources)
    rows: tuple[str, ...]  # the windows and readings the figures come from
    host: bool = False  # planned on the host: the host's readings are the plan's device
    resident_parts: tuple[str, ...] = ("weights",)  # the plan's components the measured resident model holds
    # a CPU engine's runtime per window: (window, its own runtime bytes, its front end's bytes or None)
    runtime_windows: tuple[tuple[str, int, int | None], ...] = ()
    # how those readings were derived, per observed field ("runtime_bytes", "api_server_bytes"); "none": why
    # a run planned on the host gave none
    runtime_how: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FigureError:
    run_id: str
    figure: str
    measured_bytes: int
    before_bytes: int
    after_bytes: int

    @property
    def before_pct(self) -> float:
        return 100.0 * (self.before_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def after_pct(self) -> float:
        return 100.0 * (self.after_bytes - self.measured_bytes) / self.measured_bytes


@dataclass(frozen=True)
class Change:
    name: str
    target: str
    default: float
    value: float
    evidence: str  # how the observation was derived
    runs: tuple[str, ...]


@dataclass
class RunCalibration:
    profile: Profile | None
    fits: list[Fit]
    changes: list[Change]
    learned: list[FigureError]
    holdout: list[FigureError]
    not_fitted: list[str] = field(default_factory=list)  # figures measured, why no constant moved
    sources: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # run -> windows and readings

    @property
    def fitted_any(self) -> bool:
        return bool(self.changes)


Estimator = Callable[[ModelSpec, GPU, EngineSettings, Constants | None], Estimate]


def predicted_figures(est: Estimate, resident_parts: Sequence[str] = ("weights",)) -> dict[str, int]:
    """The four figures the composition report compares: the resident model (the weights, and a CPU
    engine's runtime terms where the measured one is a host reading after load), KV pool, the rest,
    their sum; and the runtime terms themselves."""
    comps = {c.name: c.bytes for c in est.components}
    resident, kv = sum(comps.get(n, 0) for n in resident_parts), comps.get("kv_cache", 0)
    total = sum(comps.values())
    out = {
        "resident_model": resident,
        "kv_cache": kv,
        "runtime_overhead": total - resident - kv,
        "peak": total,
    }
    out.update({n: comps[n] for n in RUNTIME_FIGURES if n in comps})
    return out


def observed_fields(m: RunMeasure, est: Estimate) -> tuple[dict[str, float], dict[str, str]]:
    """The plan-JSON fields this run observed (for `fit`), and how each was derived."""
    obs: dict[str, float] = {k: v for k, v in m.startup_fields.items() if k in _LOG_FIELDS and v and v > 0}
    how = {
        k: f"run {m.run_id}: the start-up log's {_LOG_WORDS.get((m.engine, k), k)} ({v / (1 << 20):,.2f} MiB)"
        for k, v in obs.items()
    }
    comps = {c.name: c.bytes for c in est.components}
    if (
        m.engine == "vllm"
        and "non_torch_bytes" not in obs
        and m.rest_overhead_bytes is not None
        and "non_torch" in comps
    ):
        graphs = obs.get("cuda_graph_bytes", comps.get("cuda_graphs", 0))
        context = comps.get("cuda_context", 0) + comps.get("nccl", 0)
        derived = m.rest_overhead_bytes - graphs - context
        if derived > 0:
            obs["non_torch_bytes"] = derived
            how["non_torch_bytes"] = (
                f"run {m.run_id}: overhead at rest {m.rest_overhead_bytes / (1 << 30):.3f} GiB "
                f"(device before the first request less weights and KV pool) less CUDA graphs "
                f"{graphs / (1 << 30):.3f} GiB and CUDA context {context / (1 << 30):.3f} GiB "
                "(the plan's); the run cannot tell these parts apart"
            )
    return obs, how


def calibrate_runs(
    measures: Sequence[RunMeasure],
    holdout: Sequence[RunMeasure],
    estimator: Estimator,
    name: str = "calibration",
    min_points: int = MIN_POINTS,
) -> RunCalibration:
    """Fit per engine on *measures*; the four figures before and after on them and on *holdout*."""
    base, fits, changes, not_fitted = Constants.defaults(), list[Fit](), list[Change](), list[str]()
    for engine in sorted({m.engine for m in measures}):
        mine = [m for m in measures if m.engine == engine]
        cases, how_all, run_of = [], {}, {}
        for m in mine:
            obs, how = observed_fields(m, estimator(m.model, m.gpu, m.settings, base))
            how_all.update({(m.run_id, k): v for k, v in how.items()})
            mine_cases = ([Case(m.run_id, m.model, m.gpu, m.settings, obs)] if obs else []) + runtime_cases(m)
            cases += mine_cases
            run_of.update({c.label: m.run_id for c in mine_cases})
            how_all.update(runtime_evidence(m))
        not_fitted += runtime_notes(engine, mine)
        if not cases:
            not_fitted.append(f"{engine}: {_nothing_informs(mine)}")
            continue
        f = _fit_to_convergence(cases, engine, base, min_points)
        fits.append(f)
        for c in f.fitted:
            runs = tuple(dict.fromkeys(run_of[cs.label] for cs in cases if c.target in cs.observed))
            ev = "; ".join(how_all[(r, c.target)] for r in runs if (r, c.target) in how_all)
            changes.append(Change(c.name, c.target, c.default, c.value, ev, runs))
        not_fitted += _unmoved(engine, cases, f)
    act = [m for m in measures if "activation_peak_bytes" not in m.startup_fields and not m.host]
    if act:
        not_fitted.append(
            "activation peak: not fitted from the runs' readings: a run sees the workspace its "
            "heaviest step needed, a lower bound of the profiled peak"
        )
    profile = None
    calibrated = base
    if changes:
        profile = profile_from_fits(
            name,
            [f for f in fits if f.fitted],
            {
                "from": "stored runs",
                "runs": [m.run_id for m in measures],
                "holdout": [m.run_id for m in holdout],
            },
        )
        calibrated = base.with_overrides(
            {
                c.name: (
                    c.value,
                    next(x.rel_band for f in fits for x in f.fitted if x.name == c.name),
                    "calibrated",
                )
                for c in changes
            },
            name,
        )
    return RunCalibration(
        profile,
        fits,
        changes,
        _errors(measures, estimator, base, calibrated),
        _errors(holdout, estimator, base, calibrated),
        not_fitted,
        [(m.run_id, m.rows) for m in (*measures, *holdout) if m.rows],
    )


# A CPU engine's runtime figures, by the plan's component, as the fit names their observations.
RUNTIME_FIELDS = {"runtime": "runtime_bytes", "api_server": "api_server_bytes"}


def runtime_cases(m: RunMeasure) -> list[Case]:
    """One case a window for a CPU engine's runtime terms (its own process's, its front end's)."""
    out = []
    for window, own, front in m.runtime_windows:
        obs = {"runtime_bytes": float(own)}
        if front is not None:
            obs["api_server_bytes"] = float(front)
        out.append(Case(f"{m.run_id} {window}", m.model, m.gpu, m.settings, obs))
    return out


def runtime_evidence(m: RunMeasure) -> dict[tuple[str, str], str]:
    """What the run's window readings say of each runtime term, keyed as `observed_fields`' evidence."""
    out = {}
    for i, field_name in ((1, "runtime_bytes"), (2, "api_server_bytes")):
        vals = sorted(int(v) for w in m.runtime_windows if (v := w[i]) is not None)
        if vals:
            out[(m.run_id, field_name)] = (
                f"run {m.run_id}: {len(vals)} window(s), {vals[0] / MIB:,.1f}-{vals[-1] / MIB:,.1f} MiB "
                f"(middle {vals[len(vals) // 2] / MIB:,.1f} MiB): {m.runtime_how.get(field_name, '')}"
            )
    return out


def runtime_notes(engine: str, mine: Sequence[RunMeasure]) -> list[str]:
    """A run planned on the host whose readings gave no runtime figure: why, never silently dropped."""
    return [
        f"{engine} CPU runtime: run {m.run_id}: {m.runtime_how['none']}"
        for m in mine
        if m.host and not m.runtime_windows and m.runtime_how.get("none")
    ]


def _unmoved(engine: str, cases: Sequence[Case], f: Fit) -> list[str]:
    """Why a measurement moved no constant, said and never dropped: a refused fit, an observation the model could
    not predict, and a measured field no constant of the plan depends on."""
    out = [f"{r.name}: {r.reason}" for r in f.refused]
    out += list(dict.fromkeys(f"{engine}: {why}" for _, why in f.skipped))
    moved = {c.target for c in f.fitted} | {r.target for r in f.refused}
    counts: dict[str, int] = {}
    for case in cases:
        for name in case.observed:
            if name not in moved:
                counts[name] = counts.get(name, 0) + 1
    return out + [
        f"{engine} {'CPU runtime' if name == 'runtime_bytes' else name}: measured in {n} observation(s); no "
        "constant of this engine's plan depends on it, so it moved nothing"
        for name, n in sorted(counts.items())
    ]


def _nothing_informs(mine: Sequence[RunMeasure]) -> str:
    """The true reason no constant moved: what each run did measure, and why none of it depends on one."""
    parts = []
    for m in mine:
        got = sorted(set(m.measured) | {k.removesuffix("_bytes") for k in m.startup_fields})
        parts.append(f"run {m.run_id} measured {', '.join(got) or 'nothing'}")
    return (
        "; ".join(parts)
        + ": none of these depends on a fitted constant (the weights and the KV pool follow from the model "
        "file and the settings; the compute buffer, activation peak, CUDA graphs and non-torch memory do)"
    )


def _fit_to_convergence(
    cases: Sequence[Case], engine: str, base: Constants, min_points: int, rounds: int = 8
) -> Fit:
    """`fit` anchors each constant to its default with a small ridge and robust weights: right for many
    observations, but with one run per constant it stops short of the observation. Refit from the
    last fitted values until they settle; the defaults reported stay the model's own."""
    import dataclasses

    current = base
    f = fit(cases, engine, current, min_points=min_points, leave_one_out=False)
    for _ in range(rounds):
        if not f.fitted:
            break
        current = current.with_overrides({c.name: (c.value, c.rel_band, c.source) for c in f.fitted}, "fit")
        nxt = fit(cases, engine, current, min_points=min_points, leave_one_out=False)
        moved = max(
            (abs(a.value / b.value - 1) for a, b in zip(nxt.fitted, f.fitted, strict=False)), default=0.0
        )
        f = nxt
        if moved < 1e-3:
            break
    fitted = tuple(dataclasses.replace(c, default=base[c.name]) for c in f.fitted)
    return dataclasses.replace(f, fitted=fitted)


def _errors(
    measures: Sequence[RunMeasure], estimator: Estimator, before: Constants, after: Constants
) -> list[FigureError]:
    """Each measured figure, predicted with the default constants and with the fitted ones: the four
    composition figures, and the start-up log's own (the compute buffer, activation peak, ...)."""
    from vramlab.capacity.calibration import predicted_fields

    out = []
    for m in measures:
        est_b, est_a = (
            estimator(m.model, m.gpu, m.settings, before),
            estimator(m.model, m.gpu, m.settings, after),
        )
        b, a = predicted_figures(est_b, m.resident_parts), predicted_figures(est_a, m.resident_parts)
        for fig in (*FIGURES, *RUNTIME_FIGURES):
            got = m.measured.get(fig)
            if got and b.get(fig) and a.get(fig):  # a figure the plan has no term for teaches nothing here
                out.append(FigureError(m.run_id, fig, got, b[fig], a[fig]))
        fb, fa = predicted_fields(est_b), predicted_fields(est_a)
        for key in _LOG_FIELDS:
            seen = m.startup_fields.get(key)
            if seen and seen > 0 and fb.get(key) and fa.get(key):
                out.append(
                    FigureError(m.run_id, key.removesuffix("_bytes"), int(seen), int(fb[key]), int(fa[key]))
                )
    return out


def summary(cal: RunCalibration) -> dict[str, Any]:
    """JSON-ready: what changed, with evidence; errors before and after."""

    def err(e: FigureError) -> dict[str, Any]:
        return {
            "run_id": e.run_id,
            "figure": e.figure,
            "measured_bytes": e.measured_bytes,
            "before_bytes": e.before_bytes,
            "after_bytes": e.after_bytes,
            "before_pct": round(e.before_pct, 3),
            "after_pct": round(e.after_pct, 3),
        }

    return {
        "changed": [
            {
                "constant": c.name,
                "fitted_against": c.target,
                "default": c.default,
                "value": c.value,
                "evidence": c.evidence,
                "runs": list(c.runs),
            }
            for c in cal.changes
        ],
        "not_fitted": cal.not_fitted,
        "sources": {run_id: list(rows) for run_id, rows in cal.sources},
        "learned": [err(e) for e in cal.learned],
        "holdout": [err(e) for e in cal.holdout],
    }
