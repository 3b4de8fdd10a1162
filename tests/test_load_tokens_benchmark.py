"""benchmarks/tokens.py --quick runs end to end and prints its table (correctness, not speed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("server", ["auto", "stub"])
def test_quick_run_times_the_known_schedule(server: str, tmp_path: Path) -> None:
    pytest.importorskip("uvloop")  # the plain reference loop runs on uvloop
    out = tmp_path / "tokens.txt"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "tokens.py"),
            "--quick",
            "--server",
            server,
            "--json",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert text in r.stdout and re.search(r"^machine: .*load average", text, re.M)
    ep = re.search(r"^endpoint: (nginx|stub) ", text, re.M)
    assert ep and (server == "auto" or ep.group(1) == "stub"), text
    raw = json.loads(r.stdout[r.stdout.index("\n{") + 1 :])
    assert set(raw) == {"vramlab", "vramlab-w2", "vramlab-trace", "vramlab-aiohttp", "aiohttp-uvloop"}
    assert raw["vramlab-trace"]["20"]["client"] == "fasthttp"  # the trace's open loop, on the own client
    assert raw["vramlab"]["20"]["client"] == raw["vramlab-w2"]["20"]["client"] == "fasthttp"
    assert raw["vramlab-aiohttp"]["20"]["client"] == "aiohttp"
    for tool in raw:  # every gap of the completed requests is counted, the untimed among them
        assert 0 <= raw[tool]["20"]["untimed_gaps"] <= raw[tool]["20"]["gaps"] and raw[tool]["20"]["gaps"] > 0
    for tool, by_n in raw.items():
        res = by_n["20"]
        assert "error" not in res, (tool, res)
        assert res["errors"] == 0 and res["ok"] > 0, tool
        # 20 streams of 8 tokens, 20 ms apart: every tool received tokens and held streams open
        assert 0 < res["streams_held"] <= 20.5 and 0 < res["tokens_per_s"] <= res["ideal_tokens_per_s"] * 1.1
        # the per-gap error is measured against the 20 ms schedule: a gap can be late, never 20 ms early
        assert res["itl_err_p50_ms"] > -20 and res["itl_err_p99_ms"] >= res["itl_err_p50_ms"], tool
        assert res["ttft_err_p99_ms"] >= res["ttft_err_p50_ms"] > -20, tool
    assert raw["vramlab-w2"]["20"]["workers"] == 2
    assert "how each tool defines ITL:" in text and "vramlab-w2:" in text


@pytest.mark.slow
def test_the_wire_check_compares_every_timed_gap_with_nginx_packets(tmp_path: Path) -> None:
    """tokens.py --wire: tcpdump records nginx's packets while vramlab's client runs; every gap the
    client timed in that span is set beside the same gap on the wire. Both ends are kernel stamps of
    one loopback delivery, so they agree to well under a millisecond however busy the machine."""
    import os
    import shutil

    nginx = shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")
    echo = os.path.exists("/usr/lib/nginx/modules/ngx_http_echo_module.so")  # as benchmarks/_nginx.py looks
    if os.geteuid() != 0 or not shutil.which("tcpdump") or not (nginx and echo):
        pytest.skip("needs root, tcpdump and nginx with its echo module (scripts/test installs them)")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "tokens.py"),
            *("--streams", "20", "--tools", "vramlab,vramlab-trace", "--tokens", "16"),
            *("--warmup-s", "1", "--measure-s", "3", "--wire", "on", "--wire-s", "1.5", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    raw = json.loads(r.stdout[r.stdout.index("\n{") + 1 :])
    for tool in ("vramlab", "vramlab-trace"):  # closed-loop users, and the trace's open loop
        res = raw[tool]["20"]
        assert res["ok"] > 0 and res["errors"] == 0, res  # the capture's spy broke no request
        assert "wire_error" not in res and res["wire_gaps"] > 50, res  # every request's connection known
        assert res["wire_abs_err_p99_ms"] < 1.0, res
    for label in (r"20 streams", r"20 streams \(trace\)"):
        line = rf"^\s+{label}: \d+ gaps compared; client - wire P50"
        assert re.search(line, r.stdout, re.M), r.stdout[-1500:]
