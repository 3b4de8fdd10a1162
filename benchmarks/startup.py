#!/usr/bin/env python3
"""Start-up cost of `vramlab plan` and a 1,000-configuration sweep, beside a bare interpreter.

    python benchmarks/startup.py            # needs `farm-bench` on PATH for whole-process timing

Prints a table of medians and the ratio to `python -c pass`, measured side by side (paired
runs) in one call each, because these machines are noisy. Targets: plan under 0.3 s
cold (about 15x a bare start), the sweep under 1 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
VRAMLAB = shutil.which("vramlab", path=str(BIN)) or "vramlab"
PY = sys.executable
CASES = [
    ("vramlab --help", [VRAMLAB, "--help"]),
    (
        "plan (offline, catalog model)",
        [
            VRAMLAB,
            "plan",
            "--model",
            "llama-3.1-8b-instruct",
            "--gpu",
            "h100-80gb",
            "--max-model-len",
            "8192",
            "--offline",
        ],
    ),
    ("plan --json", [VRAMLAB, "plan", "--model", "qwen3-8b", "--gpu", "l4", "--json", "--offline"]),
    # 10 x 10 x 10 = 1,000 configurations.
    (
        "plan --sweep 1,000 configs",
        [
            VRAMLAB,
            "plan",
            "--model",
            "llama-3.1-8b-instruct",
            "--gpu",
            "h100-80gb",
            "--offline",
            "--json",
            "--sweep",
            "max-model-len=1k,2k,4k,8k,16k,24k,32k,48k,64k,128k",
            "--sweep",
            "max-num-seqs=8,16,32,64,128,256,384,512,768,1024",
            "--sweep",
            "gpu-memory-utilization=0.5,0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9,0.95",
        ],
    ),
]


def median_wall(out: str) -> tuple[float, float | None]:
    """(median wall seconds of A, median ratio A/B) from farm-bench's report."""
    wall = re.search(r"^A wall s\s+([0-9.]+)\s+([0-9.]+)", out, re.M)
    ratio = re.search(r"^A/B wall\s+([0-9.]+)\s+([0-9.]+)", out, re.M)
    return (float(wall.group(2)) if wall else float("nan"), float(ratio.group(2)) if ratio else None)


def main() -> int:
    bench = shutil.which("farm-bench")
    if not bench:
        print("startup: farm-bench is not on PATH; timing with subprocess instead", file=sys.stderr)
    print(f"{'command':34} {'median s':>9} {'x bare python':>14}")
    for label, cmd in CASES:
        if bench:
            r = subprocess.run(
                [bench, "-n", "7", "--vs", f"{PY} -c pass", "--", *cmd],
                capture_output=True,
                text=True,
                timeout=300,
            )
            wall, ratio = median_wall(r.stdout + r.stderr)
        else:
            import time

            def t(c: list[str]) -> float:
                start = time.perf_counter()
                subprocess.run(c, capture_output=True, check=False)
                return time.perf_counter() - start

            pairs = [(t(cmd), t([PY, "-c", "pass"])) for _ in range(7)]
            walls = sorted(a for a, _ in pairs)
            ratios = sorted(a / b for a, b in pairs)
            wall, ratio = walls[3], ratios[3]
        print(f"{label:34} {wall:9.3f} {ratio if ratio is not None else float('nan'):14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
