"""Fit the capacity model's free constants to observations, and apply a fitted profile.

Pure maths: touches no file. `vramlab.sources.profile.load_profile` reads a profile for `plan --calibration`;
`vramlab.logs.profile.write_profile` writes one.

The fit never re-implements a formula. For each constant it asks `estimate` how the component
the constant drives (`FIT_TARGETS`) moves when the constant moves, then solves a robust
(Huber then Tukey bisquare, ridge-anchored to the default) least-squares problem on
log(observed / predicted): a 7B and a 70B model weigh the same, and a row the model is far
off on (a trainer sharing the card) cannot lever the fit. Two Gauss-Newton passes take care of the mild
non-linearity (max(forward, sampler), block rounding). A constant too few observations
depend on is refused and reported, not guessed. Leave-one-out errors per component show
what the fit buys on data it did not see.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramlab.capacity.calibration_profile import (
    Profile,
    Section,
    apply_profile,
    profile_from_dict,
    profile_from_fits,
    profile_to_toml,
    select_section,
)
from vramlab.capacity.constants import MIN_POINTS, Constants
from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.settings import EngineSettings, parse_version
from vramlab.capacity.spec import ModelSpec
from vramlab.errors import VramlabError

# Constant -> the observed field (plan-JSON name) it is fitted against.
FIT_TARGETS: dict[str, str] = {
    "sampler_bytes_per_seq_vocab": "activation_peak_bytes",
    "legacy_sampler_bytes_per_seq_vocab": "activation_peak_bytes",
    "flashinfer_sampler_bytes_per_seq_vocab": "activation_peak_bytes",
    "forward_intermediate_copies": "activation_peak_bytes",
    "forward_hidden_copies": "activation_peak_bytes",
    "moe_workspace_copies": "activation_peak_bytes",
    "tgi_prefill_bytes_per_token_hidden": "activation_peak_bytes",
    "llamacpp_compute_scratch_bytes": "activation_peak_bytes",
    "hf_activation_hidden_copies": "activation_peak_bytes",
    "non_torch_forward_bytes": "non_torch_bytes",
    "non_torch_forward_tp_bytes": "non_torch_bytes",
    "non_torch_forward_tp_nonvls_bytes": "non_torch_bytes",
    "non_torch_forward_pp_bytes": "non_torch_bytes",
    "v0_non_torch_bytes": "non_torch_bytes",
    "v0_non_torch_tp_bytes": "non_torch_bytes",
    "v0_non_torch_tp_nvswitch_bytes": "non_torch_bytes",
    "cuda_graph_base_bytes": "cuda_graph_bytes",
    "cuda_graph_per_layer_bytes": "cuda_graph_bytes",
    "sglang_graph_bytes_per_bs": "cuda_graph_bytes",
    "cuda_context_bytes": "init_non_torch_bytes",
    "nccl_init_bytes": "init_non_torch_bytes",
    "nccl_init_pcie_bytes": "init_non_torch_bytes",
    # CPU engines' runtime terms: no log prints them; a run's host readings of the processes do (run_calibration)
    "llamacpp_cpu_runtime_bytes": "runtime_bytes",
    "transformers_cpu_runtime_bytes": "runtime_bytes",
    "vllm_cpu_worker_runtime_bytes": "runtime_bytes",
    "vllm_cpu_frontend_runtime_bytes": "api_server_bytes",
}
# Estimate component -> observed field.
COMPONENT_FIELDS = {
    "weights": "weights_bytes",
    "activation_peak": "activation_peak_bytes",
    "non_torch": "non_torch_bytes",
    "cuda_graphs": "cuda_graph_bytes",
    "runtime": "runtime_bytes",  # a CPU engine's own runtime (vLLM's CPU worker, llama.cpp's server process)
    "api_server": "api_server_bytes",  # vLLM's CPU front end: the API server and the engine core
}
SCORED_FIELDS = (
    "weights_bytes",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "init_non_torch_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "max_concurrency",
)

_STEP = 0.05  # relative step for the finite-difference sensitivity
_RIDGE = 0.01  # pull toward the default in relative units; only matters where data say nothing
_HUBER_K = 1.345
_TUKEY_C = 4.685
_SCALE_FLOOR = 0.02


@dataclass(frozen=True)
class Case:
    """One observation, ready for the model: what was run and what the engine printed."""

    label: str
    model: ModelSpec
    gpu: GPU
    settings: EngineSettings
    observed: Mapping[str, float]  # plan-JSON field -> value


@dataclass(frozen=True)
class FittedConstant:
    name: str
    target: str
    value: float
    default: float
    rel_band: float
    n_points: int
    source: str


@dataclass(frozen=True)
class Refusal:
    name: str
    target: str
    n_points: int
    needed: int
    reason: str


@dataclass(frozen=True)
class ComponentError:
    """Leave-one-out |relative error| of one field, with the defaults and with the fit."""

    field: str
    n: int
    median_before: float
    median_after: float
    p90_before: float
    p90_after: float


@dataclass(frozen=True)
class Fit:
    engine: str
    version_min: str | None
    version_max: str | None
    n_cases: int
    fitted: tuple[FittedConstant, ...]
    refused: tuple[Refusal, ...]
    loo: tuple[ComponentError, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (case, why the model could not predict it)
    residuals: dict[str, list[float]] = field(default_factory=dict, compare=False)  # after the fit
    # case label -> fields predicted by a fit that did not see that case (for per-row tables)
    loo_predicted: dict[str, dict[str, float]] = field(default_factory=dict, compare=False)

    def overrides(self) -> dict[str, tuple[float, float, str]]:
        return {f.name: (f.value, f.rel_band, f.source) for f in self.fitted}


def predicted_fields(est: Estimate) -> dict[str, float]:
    out: dict[str, float] = {
        "kv_cache_bytes": est.kv_cache_bytes,
        "kv_cache_tokens": est.kv_cache_tokens,
        "max_concurrency": est.max_concurrency,
    }
    init = 0
    for c in est.components:
        if c.name in COMPONENT_FIELDS:
            out[COMPONENT_FIELDS[c.name]] = c.bytes
        if c.name in ("cuda_context", "nccl"):
            init += c.bytes
    if init:
        out["init_non_torch_bytes"] = init
    return out


Estimator = Callable[[ModelSpec, GPU, EngineSettings, Constants], Estimate]


def _default_estimator() -> Estimator:
    from vramlab.capacity import estimate  # a fit reads figures: the re-planned suggestions are not wanted

    return lambda model, gpu, settings, constants: estimate(model, gpu, settings, constants, False)


def _with(constants: Constants, values: Mapping[str, float]) -> Constants:
    return constants.with_overrides(
        {k: (v, constants.get(k).rel_band, "fit") for k, v in values.items()}, constants.profile
    )


def _rel_err(pred: float | None, obs: float | None) -> float | None:
    if pred is None or obs is None or obs == 0:
        return None
    return (pred - obs) / abs(obs)


class _Model:
    """Predictions of every case at given constant values, cached; failures remembered."""

    def __init__(self, cases: Sequence[Case], base: Constants, est: Estimator):
        self.cases, self.base, self.est = cases, base, est
        self.failed: dict[int, str] = {}
        # (case, constant values) -> prediction: a Gauss-Newton step re-linearizes at the point the
        # one before ended at, so the same predictions were computed again (a quarter of a fit)
        self._seen: dict[tuple[int, tuple[tuple[str, float], ...]], dict[str, float] | None] = {}

    def predict(self, i: int, values: Mapping[str, float]) -> dict[str, float] | None:
        key = (i, tuple(sorted(values.items())))
        if key in self._seen:
            return self._seen[key]
        c = self.cases[i]
        try:
            out: dict[str, float] | None = predicted_fields(
                self.est(c.model, c.gpu, c.settings, _with(self.base, values))
            )
        except (VramlabError, ValueError, ZeroDivisionError, ImportError, NotImplementedError) as exc:
            self.failed[i] = f"{type(exc).__name__}: {exc}"
            out = None
        self._seen[key] = out
        return out


def _robust_ridge(J: Any, b: Any, lam: float) -> Any:
    """argmin sum rho(b - J theta) + lam |theta - 1|^2 by iteratively reweighted least squares.

    Huber first (convex, so it finds the basin), then Tukey's bisquare from there with the
    scale fixed: observations far off the model (a trainer sharing the card, another
    engine's graph sizes) get zero weight instead of pulling every constant their way.
    """
    import numpy as np

    n, k = J.shape

    informative = np.any(np.abs(J) > 1e-4, axis=1)  # rows no fitted constant moves say nothing
    J, b = J[informative], b[informative]
    n = len(b)

    def solve(w: Any) -> Any:
        reg = (
            lam * max(float(w.sum()), 1e-9) / max(n, 1)
        )  # the anchor keeps its weight as rows are downweighted
        M = J.T @ (w[:, None] * J) + reg * np.eye(k)
        return np.linalg.solve(M, J.T @ (w * b) + reg * np.ones(k))

    def scale(e: Any) -> float:
        # Engines print 2 decimals of GiB: a few per cent of a small component is rounding, not signal.
        return max(1.4826 * float(np.median(np.abs(e - np.median(e)))), _SCALE_FLOOR)

    w = np.ones(n)
    theta = solve(w)
    for _ in range(30):  # Huber
        e = b - J @ theta
        w_new = np.minimum(1.0, _HUBER_K * scale(e) / np.maximum(np.abs(e), 1e-12))
        theta = solve(w_new)
        if np.allclose(w_new, w, atol=1e-6):
            break
        w = w_new
    s = scale(b - J @ theta)
    for _ in range(30):  # bisquare, scale held
        u = (b - J @ theta) / (_TUKEY_C * s)
        w_new = np.where(np.abs(u) < 1, (1 - u**2) ** 2, 0.0)
        if w_new.sum() < k + 1:  # too few points left to trust: keep the last answer
            break
        theta = solve(w_new)
        if np.allclose(w_new, w, atol=1e-6):
            break
        w = w_new
    return np.maximum(theta, 0.05)  # a memory constant is positive


@dataclass
class _Linear:
    """The target field's residuals and sensitivities at one point, relative to the observation."""

    rows: list[int]  # case indices with an observation of the target
    names: list[str]  # active constants
    J: Any  # (rows, names): d log(pred) / d(value / default)
    b: Any  # log(obs / pred) + J @ theta0  (so that b ~ J @ theta)


def _linearize(
    model: _Model,
    target: str,
    names: list[str],
    values: dict[str, float],
    defaults: dict[str, float],
    rows: list[int],
) -> tuple[_Linear, dict[str, int]]:
    import numpy as np

    J = np.zeros((len(rows), len(names)))
    b = np.zeros(len(rows))
    theta0 = np.array([values[n] / defaults[n] for n in names])
    keep = []
    for r, i in enumerate(rows):
        obs = float(model.cases[i].observed[target])
        base = model.predict(i, values)
        if base is None or (base.get(target) or 0) <= 0:
            continue
        keep.append(r)
        for j, name in enumerate(names):
            bumped = dict(values)
            bumped[name] = values[name] * (1 + _STEP)
            p = model.predict(i, bumped)
            if p is not None and (p.get(target) or 0) > 0:
                J[r, j] = math.log(p[target] / base[target]) / (_STEP * theta0[j])
        b[r] = math.log(obs / base[target]) + J[r] @ theta0
    J, b = J[keep], b[keep]
    rows = [rows[r] for r in keep]
    active = {name: int(np.sum(np.abs(J[:, j]) > 1e-4)) for j, name in enumerate(names)}
    return _Linear(rows, names, J, b), active


def fit(
    cases: Sequence[Case],
    engine: str,
    constants: Constants | None = None,
    min_points: int = MIN_POINTS,
    estimator: Estimator | None = None,
    leave_one_out: bool = True,
) -> Fit:
    """Fit the constants `FIT_TARGETS` names to the cases of one engine."""
    import numpy as np

    base = constants or Constants.defaults()
    est = estimator or _default_estimator()
    model = _Model(cases, base, est)
    defaults = {n: base[n] for n in FIT_TARGETS if n in base.values}
    values = dict(defaults)
    fitted: list[FittedConstant] = []
    refused: list[Refusal] = []
    linear: dict[str, _Linear] = {}
    for target in dict.fromkeys(FIT_TARGETS.values()):
        names = [n for n in FIT_TARGETS if FIT_TARGETS[n] == target and n in defaults]
        rows = [i for i, c in enumerate(cases) if (c.observed.get(target) or 0) > 0]  # V0 can print negatives
        if not rows:
            continue
        lin, active = _linearize(model, target, names, values, defaults, rows)
        use = [n for n in names if active[n] >= min_points]
        for n in names:
            if 0 < active[n] < min_points:
                refused.append(
                    Refusal(
                        n,
                        target,
                        active[n],
                        min_points,
                        f"only {active[n]} observation(s) of {target} depend on it; {min_points} needed",
                    )
                )
        if not use:
            continue
        for _ in range(2):  # Gauss-Newton: re-linearize at the fitted point once
            lin, _active = _linearize(model, target, use, values, defaults, rows)
            theta = _robust_ridge(lin.J, lin.b, _RIDGE)
            values.update({n: defaults[n] * float(t) for n, t in zip(use, theta, strict=True)})
        lin, _active = _linearize(model, target, use, values, defaults, rows)
        linear[target] = lin
        theta = np.array([values[n] / defaults[n] for n in use])
        resid = lin.b - lin.J @ theta
        spread = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        for j, n in enumerate(use):
            n_pts = int(np.sum(np.abs(lin.J[:, j]) > 1e-4))
            fitted.append(
                FittedConstant(
                    n,
                    target,
                    values[n],
                    defaults[n],
                    round(max(0.02, spread), 4),
                    n_pts,
                    f"calibrated on {n_pts} {engine} observations of {target}",
                )
            )
    residuals = {}
    for target, lin in linear.items():
        theta = np.array([values[n] / defaults[n] for n in lin.names])
        residuals[target] = [float(x) for x in (lin.b - lin.J @ theta)]
    loo_predicted: dict[str, dict[str, float]] = {}
    loo = _leave_one_out(model, linear, values, defaults, loo_predicted) if leave_one_out and fitted else []
    versions = sorted(
        {c.settings.engine_version for c in cases if c.settings.engine_version}, key=parse_version
    )
    skipped = tuple((cases[i].label, why) for i, why in sorted(model.failed.items()))
    return Fit(
        engine,
        versions[0] if versions else None,
        versions[-1] if versions else None,
        len(cases),
        tuple(fitted),
        tuple(refused),
        tuple(loo),
        skipped,
        residuals,
        loo_predicted,
    )


def _leave_one_out(
    model: _Model,
    linear: dict[str, _Linear],
    values: dict[str, float],
    defaults: dict[str, float],
    predicted: dict[str, dict[str, float]],
) -> list[ComponentError]:
    """Refit without each case (on the linearization at the full fit) and predict that case."""

    before: dict[str, list[float]] = {f: [] for f in SCORED_FIELDS}
    after: dict[str, list[float]] = {f: [] for f in SCORED_FIELDS}
    involved = sorted({i for lin in linear.values() for i in lin.rows})
    for i in involved:
        held = dict(values)
        for lin in linear.values():
            keep = [r for r, row in enumerate(lin.rows) if row != i]
            if len(keep) < 2:
                continue
            theta = _robust_ridge(lin.J[keep], lin.b[keep], _RIDGE)
            held.update({n: defaults[n] * float(t) for n, t in zip(lin.names, theta, strict=True)})
        p0 = model.predict(i, defaults)
        p1 = model.predict(i, held)
        if p0 is None or p1 is None:
            continue
        predicted[model.cases[i].label] = p1
        for f in SCORED_FIELDS:
            e0, e1 = (
                _rel_err(p0.get(f), model.cases[i].observed.get(f)),
                _rel_err(p1.get(f), model.cases[i].observed.get(f)),
            )
            if e0 is not None and e1 is not None:
                before[f].append(abs(e0))
                after[f].append(abs(e1))
    out = []
    for f in SCORED_FIELDS:
        if before[f]:
            out.append(
                ComponentError(
                    f,
                    len(before[f]),
                    statistics.median(before[f]),
                    statistics.median(after[f]),
                    _p90(before[f]),
                    _p90(after[f]),
                )
            )
    return out


def _p90(xs: list[float]) -> float:
    from vramlab.records.stats import percentile  # the one definition (type 7, as this was)

    return percentile(xs, 90)


# the profile's names (capacity/calibration_profile.py) stay importable from here, where callers import them
__all__ = [
    "COMPONENT_FIELDS",
    "Case",
    "ComponentError",
    "FIT_TARGETS",
    "Fit",
    "FittedConstant",
    "Profile",
    "Refusal",
    "SCORED_FIELDS",
    "Section",
    "apply_profile",
    "fit",
    "predicted_fields",
    "profile_from_dict",
    "profile_from_fits",
    "profile_to_toml",
    "select_section",
]
