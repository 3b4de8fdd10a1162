"""Terminal and JSON rendering of `vramlab calibrate`: inputs per engine era, fitted constants,
refusals, leave-one-out errors, outliers."""

from __future__ import annotations

from vramlab.capacity.calibration_result import CalibrationResult
from vramlab.capacity.run_calibration import RunCalibration
from vramlab.units import SMALL_BYTES, gib, size


def to_json(result: CalibrationResult) -> dict[str, object]:
    from dataclasses import asdict

    return {
        "observations": result.observations,
        "skipped": [{"source": s, "reason": r} for s, r in result.skipped],
        "fits": [
            {k: v for k, v in asdict(f).items() if k not in ("residuals", "loo_predicted")}
            for f in result.fits
        ],
        "attribution": result.attribution,
        "outliers": result.outliers,
        "eras": result.eras,
        "fitted_any": result.fitted_any,
    }


def _const(name: str, value: float) -> str:
    if name.endswith("_bytes") and abs(value) < SMALL_BYTES:  # a small constant in MiB, not "0.000 GiB"
        return size(value)
    return gib(value, 3, unit=True) if name.endswith("_bytes") else f"{value:.3f}"


def _b(nbytes: float) -> str:
    return size(nbytes) if abs(nbytes) < SMALL_BYTES else gib(nbytes, 3, unit=True)


def render(result: CalibrationResult, output: str | None) -> str:
    out = [f"{result.observations} observations, {len(result.skipped)} skipped"]
    if result.eras:
        out.append("")
        out.append(f"  {'engine era':50} {'observations':>12} {'used in fit':>11}  era")
        for row in result.eras:
            how = "inferred from the wording" if row["inferred"] else "printed"
            out.append(f"  {row['era'][:50]:50} {row['observations']:>12} {row['used']:>11}  {how}")
    for f in result.fits:
        out.append("")
        out.append(f"{f.engine} {f.version_min or '?'}..{f.version_max or '?'}: {f.n_cases} observations")
        if f.fitted:
            out.append(
                f"  {'constant':30} {'default':>12} {'fitted':>12} {'band':>6} {'n':>4}  fitted against"
            )
            for c in f.fitted:
                out.append(
                    f"  {c.name:30} {_const(c.name, c.default):>12} {_const(c.name, c.value):>12} "
                    f"{c.rel_band:>6.1%} {c.n_points:>4}  {c.target}"
                )
        for r in f.refused:
            out.append(f"  not fitted: {r.name}: {r.reason}")
        if f.loo:
            out.append("  leave-one-out |error|, median / p90: defaults -> calibrated")
            for e in f.loo:
                out.append(
                    f"    {e.field:24} {e.median_before:7.2%} / {e.p90_before:7.2%}  ->  "
                    f"{e.median_after:7.2%} / {e.p90_after:7.2%}   (n={e.n})"
                )
    if result.attribution:
        out.append("")
        out.append("error attribution (default constants):")
        out.extend(f"  {line}" for line in result.attribution)
    if result.outliers:
        out.append("")
        out.append("outliers (warnings):")
        out.extend(f"  {w}" for w in result.outliers[:20])
    if not result.fitted_any:
        out.append("")
        out.append("no constant was fitted: the profile would change nothing, so none is written")
    if result.skipped:
        out.append("")
        out.append("skipped:")
        out.extend(f"  {s[:90]}: {r[:140]}" for s, r in result.skipped[:20])
        if len(result.skipped) > 20:
            out.append(f"  ... and {len(result.skipped) - 20} more (see --json)")
    if output:
        out.append("")
        out.append(f"wrote {output}")
    return "\n".join(out)


def render_runs(cal: RunCalibration, output: str | None) -> str:
    """`vramlab calibrate RUN_ID ...`: what changed (with its evidence), what was not fitted and why,
    the composition's error before and after on the runs learned from and on the held-out ones."""
    out: list[str] = []
    if cal.changes:
        out.append("changed:")
        for c in cal.changes:
            same = abs(c.value / c.default - 1) < 0.01 if c.default else False
            out.append(
                f"  {c.name} ({c.target}): {_const(c.name, c.default)} -> {_const(c.name, c.value)} "
                f"from run{'s' if len(c.runs) > 1 else ''} {', '.join(c.runs)}"
                + (" (within 1 % of the default: the evidence's own rounding)" if same else "")
            )
            out.append(f"    evidence: {c.evidence}")
    else:
        out.append("changed: nothing")
    for n in cal.not_fitted:
        out.append(f"not fitted: {n}")
    for run_id, rows in cal.sources:
        out.append(f"run {run_id} measured at: " + "; ".join(rows))
    for title, errors in (
        ("on the runs learned from", cal.learned),
        ("held out (not learned from)", cal.holdout),
    ):
        if not errors:
            continue
        out.append(f"error {title} (predicted - measured, GiB = 2^30 bytes; before -> after):")
        for e in errors:
            out.append(
                f"  {e.run_id} {e.figure:<17} measured {_b(e.measured_bytes)}  before "
                f"{_b(e.before_bytes)} ({e.before_pct:+.2f}%) -> after {_b(e.after_bytes)} "
                f"({e.after_pct:+.2f}%)"
            )
    if output:
        out.append(f"profile written to {output}; use it with: vramlab plan ... --calibration {output}")
    elif cal.changes:
        out.append("no profile written (give -o PROFILE.toml)")
    return "\n".join(out)
