"""Fit the capacity model's constants to engine logs and measurement files.

Inputs are start-up logs (any engine `check-log` reads) and JSONL measurement files (one
observation per line, docs/logs-and-calibration.md; vramlab's data set format is read too).
Constants are fitted per engine; one that too few observations depend on is refused and
named. Leave-one-out errors per component are reported before and after the fit. The profile
is applied with `vramlab plan --calibration FILE`.

examples:
  vramlab calibrate logs/*.log measurements.jsonl -o my-fleet.calibration.toml
  vramlab calibrate observed_memory.jsonl --model-configs model_configs.json -o dev.calibration.toml
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="LOG_OR_JSONL", help="engine logs and/or .jsonl measurement files")
    parser.add_argument("-o", "--output", metavar="PROFILE", help="write the calibration profile here (.toml)")
    parser.add_argument("--model-configs", metavar="JSON", help="hf id -> config.json map for models not in the catalog")
    parser.add_argument("--engine", help="fit only this engine's observations")
    parser.add_argument("--min-points", type=int, default=3, help="observations a constant needs to be fitted (default 3)")
    parser.add_argument("--versions", metavar="MIN..MAX", help="engine versions the profile applies to "
                        "(default: the range of the observations)")
    parser.add_argument("--online", action="store_true", help="allow reading model configs from the Hugging Face Hub")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vramlab.errors import ConfigError
    from vramlab.logs.calibrate import calibrate

    if args.min_points < 2:
        raise ConfigError("--min-points must be at least 2")
    name = Path(args.output).name if args.output else "calibration"
    result = calibrate(args.inputs, args.model_configs, args.engine, args.min_points, args.versions,
                       offline=not args.online, name=name)
    written = None
    if args.output and result.fitted_any:
        from vramlab.logs.profile import write_profile

        write_profile(args.output, result.profile)
        written = args.output
    if args.json:
        print(json.dumps(to_json(result), indent=1))
    else:
        print(render(result, written))
    if not result.fitted_any:
        import sys

        reasons = sorted({r.reason for f in result.fits for r in f.refused})
        print("vramlab calibrate: error: no constant was fitted"
              + (f" ({reasons[0]}{'; ...' if len(reasons) > 1 else ''})" if reasons else "")
              + ("; no profile written" if args.output else ""), file=sys.stderr)
        return 1
    return 0


def to_json(result: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "observations": result.observations,
        "skipped": [{"source": s, "reason": r} for s, r in result.skipped],
        "fits": [{k: v for k, v in asdict(f).items() if k not in ("residuals", "loo_predicted")} for f in result.fits],
        "attribution": result.attribution,
        "outliers": result.outliers,
        "eras": result.eras,
        "fitted_any": result.fitted_any,
    }


def _const(name: str, value: float) -> str:
    return f"{value / (1 << 30):.3f} GiB" if name.endswith("_bytes") else f"{value:.3f}"


def render(result: Any, output: str | None) -> str:
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
            out.append(f"  {'constant':30} {'default':>12} {'fitted':>12} {'band':>6} {'n':>4}  fitted against")
            for c in f.fitted:
                out.append(f"  {c.name:30} {_const(c.name, c.default):>12} {_const(c.name, c.value):>12} "
                           f"{c.rel_band:>6.1%} {c.n_points:>4}  {c.target}")
        for r in f.refused:
            out.append(f"  not fitted: {r.name}: {r.reason}")
        if f.loo:
            out.append("  leave-one-out |error|, median / p90: defaults -> calibrated")
            for e in f.loo:
                out.append(f"    {e.field:24} {e.median_before:7.2%} / {e.p90_before:7.2%}  ->  "
                           f"{e.median_after:7.2%} / {e.p90_after:7.2%}   (n={e.n})")
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
