"""benchmarks/loadgen.py --quick runs end to end and prints its table (correctness, not speed)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("server", ["auto", "stub"])
def test_quick_run_prints_the_table(server: str, tmp_path: Path) -> None:
    out = tmp_path / "loadgen.txt"
    tools = "vramlab,vramlab-aiohttp,locust,aiohttp" if server == "auto" else "vramlab,aiohttp"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "loadgen.py"),
            "--quick",
            "--server",
            server,
            "--tools",
            tools,
            "--json",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert text in r.stdout
    ep = re.search(r"^endpoint: (nginx|stub) ", text, re.M)
    assert ep, text
    if server == "stub":
        assert ep.group(1) == "stub"
    rows, clients = {}, {}
    for line in text.splitlines():
        m = re.match(
            r"^(vramlab \(client \+ driver\)|vramlab on aiohttp|locust FastHttpUser|plain asyncio \+ aiohttp)"
            r"\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+\S+\s+\S+\s+(\d+)$",
            line,
        )
        if m:
            g = m.groups()
            rows[g[0]] = (g[0], g[1], *g[3:])
            clients[g[0]] = g[2]
    assert "vramlab (client + driver)" in rows and "plain asyncio + aiohttp" in rows, text
    # which HTTP client each row used: vramlab's own for http://, aiohttp when forced
    assert (
        clients["vramlab (client + driver)"] == "fasthttp" and clients["plain asyncio + aiohttp"] == "aiohttp"
    )
    if server == "auto":
        assert clients["vramlab on aiohttp"] == "aiohttp"
    for name, (_, loop, rps, per_core, p50, p99, _ratio, errors) in rows.items():
        assert loop in ("uvloop", "asyncio", "gevent"), name
        assert int(rps) > 0 and int(per_core) > 0, name
        assert 0 < float(p50) <= float(p99), name
        assert errors == "0", name
    if "locust FastHttpUser" in rows:
        assert rows["locust FastHttpUser"][6] == "1.00x"
        assert re.match(r"\d+\.\d\dx", rows["vramlab (client + driver)"][6])
    else:
        assert "locust" not in tools.split(",") or "locust is not installed" in text
    # the client's own delay (schedule to send) over the bare-sleep floor measured in the same run,
    # with its bar; and the latency to the answer over the same floor, said apart
    floor = (
        r"^P99 over the floor: vramlab ([\d.]+) ms / ([\d.]+) ms = (\d+\.\d\d)x \(bar <= 2x: (met|NOT met); "
        r"the client's own delay, from a probe's scheduled time to its send\)$"
    )
    m = re.search(floor, text, re.M)
    assert m, text
    lag, fl, ratio, verdict = float(m.group(1)), float(m.group(2)), float(m.group(3)), m.group(4)
    # (the figures are printed to 0.01 ms: the ratio lies within what their rounding allows)
    assert (lag - 0.005) / (fl + 0.005) - 0.005 <= ratio <= (lag + 0.005) / max(fl - 0.005, 1e-9) + 0.005
    assert (verdict == "met") == (ratio <= 2)
    raw_lags = json.loads(r.stdout[r.stdout.index("\n{") + 1 :])["vramlab"]["overhead"]
    assert abs(statistics.median(o["lag_p99_ms"] for o in raw_lags) - lag) < 0.006  # the runs' dispatch lag
    assert re.search(
        r"^P99 to the answer over the floor: vramlab [\d.]+ ms / [\d.]+ ms = \d+\.\d\dx", text, re.M
    )
    # the bare request on the same schedule (wake-up + the endpoint's round trip), on both endpoints
    bare = re.search(r"^bare request: .* P50 ([\d.]+) ms, P99 ([\d.]+) ms from the schedule", text, re.M)
    assert bare and 0 < float(bare.group(1)) <= float(bare.group(2)), text
    assert re.search(r"^P99 over the bare request: vramlab [\d.]+ ms / [\d.]+ ms = \d+\.\d\dx", text, re.M)
    raw = json.loads(r.stdout[r.stdout.index("\n{") + 1 :])
    vr = raw["vramlab"]
    # Every probe of the overhead run came back, and the held streams were really cycling.
    assert vr["overhead"][0]["ok"] > 50 and vr["overhead"][0]["held_ok"] > 0
    assert vr["rate"][0]["ok"] > 100
