"""benchmarks/loadgen.py --quick runs end to end and prints its table (correctness, not speed)."""

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
    # the client's P99 over the bare-sleep floor measured in the same run, with its bar
    floor = r"^P99 over the floor: vramlab [\d.]+ ms / [\d.]+ ms = \d+\.\d\dx \(bar <= 2x: (met|NOT met)\)$"
    assert re.search(floor, text, re.M), text
    # the bare request on the same schedule (wake-up + the endpoint's round trip), on both endpoints
    bare = re.search(r"^bare request: .* P50 ([\d.]+) ms, P99 ([\d.]+) ms from the schedule", text, re.M)
    assert bare and 0 < float(bare.group(1)) <= float(bare.group(2)), text
    assert re.search(r"^P99 over the bare request: vramlab [\d.]+ ms / [\d.]+ ms = \d+\.\d\dx", text, re.M)
    raw = json.loads(r.stdout[r.stdout.index("\n{") + 1 :])
    vr = raw["vramlab"]
    # Every probe of the overhead run came back, and the held streams were really cycling.
    assert vr["overhead"][0]["ok"] > 50 and vr["overhead"][0]["held_ok"] > 0
    assert vr["rate"][0]["ok"] > 100
