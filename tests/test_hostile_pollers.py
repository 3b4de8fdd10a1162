"""The pollers against a target whose monitoring endpoints answer badly on purpose (the hostile-server
suite's other half: tests/test_hostile_server.py is the load client's).

Every poller is bounded like the load client (vramlab.observe.http): a gzip bomb, a body of hundreds
of MB, a million series or ten thousand Ollama models cost a bounded amount of memory and time; its
trouble is a note that names the poller and the cause, never an error of the run, the load or the
store. NaN and Inf, legal in Prometheus text, are left out of the store and said so.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _hostile_pollers import MODES, gzip_bomb, make_app, many_series, prometheus_series
from _threaded_app import serve_app
from vramlab.observe.base import Sampler, SamplerSet
from vramlab.observe.health import HealthSampler, discover_health
from vramlab.observe.ollama import OllamaSampler
from vramlab.observe.prom_api import PromApiSampler
from vramlab.observe.prom_text import PromTextSampler

VRAMLAB = str(Path(sys.executable).with_name("vramlab"))
INTERVAL_S = 0.5  # a poll may take 1 s: a busy two-core machine reads 4 MiB slowly
GROWTH_MIB = 96  # a poller that read a bomb or a huge body whole would grow by 256 MiB or more


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sampler(mode: str, root: str) -> Sampler:
    if mode.startswith("metrics") or mode == "normal":
        return PromTextSampler(root + "/metrics")
    if mode.startswith(("ps", "version")):
        return OllamaSampler(root)
    if mode.startswith("health"):
        return HealthSampler(root + "/health")
    return PromApiSampler(root, {"q": "up"})


async def _poll(sampler: Sampler, times: int) -> tuple[list[str], list[Any], float]:
    """Run the sampler in a SamplerSet for *times* intervals; (notes, samples, the longest the
    event loop was held while it ran, in seconds)."""
    notes: list[str] = []
    got: list[Any] = []
    held = 0.0

    async def tick() -> None:
        nonlocal held
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            held, last = max(held, now - last), now

    ticker = asyncio.ensure_future(tick())
    ss = SamplerSet([sampler], INTERVAL_S, got.extend, notes.append)
    await ss.start()
    await asyncio.sleep(INTERVAL_S * times)
    await ss.stop()
    ticker.cancel()
    return notes, got, held


# mode -> what a note must say (the poller's name is checked for every mode)
SAYS = {
    "normal": "",
    "metrics-bomb": "compression bomb",
    "metrics-huge": "no metric vramlab knows",
    "metrics-series": "only the first",
    "metrics-nan": "not stored",
    "ps-bomb": "BodyTooLarge",
    "ps-huge": "over the 256 KiB read",
    "ps-many": "over the 256 KiB read",
    "version-bomb": "not used",
    "health-bomb": "",
    "health-huge": "",
    "health-headers": "",
    "prometheus-bomb": "compression bomb",
    "prometheus-series": "over the 1 MiB read",
}


def test_every_mode_is_covered() -> None:
    assert set(SAYS) == set(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_a_hostile_poll_is_bounded_and_named(mode: str) -> None:
    gzip_bomb(), many_series(), prometheus_series()  # built before the peak is taken: the server's
    before = _peak_mib()
    with serve_app(lambda: make_app(mode)) as port:
        t = time.monotonic()
        notes, samples, held = asyncio.run(_poll(_sampler(mode, f"http://127.0.0.1:{port}"), 6))
        took = time.monotonic() - t
    grew = _peak_mib() - before
    print(f"{mode}: {len(samples)} samples, notes {notes}, loop held {held * 1000:.0f} ms, +{grew:.0f} MiB")
    assert grew < GROWTH_MIB, f"peak RSS grew {grew:.0f} MiB"
    assert took < 2 + 6 * INTERVAL_S + 10, took  # open's bound, the intervals, the stop; a busy machine
    name = _sampler(mode, "http://x").source
    assert all(n.startswith(f"sampler {name}") for n in notes), notes
    if SAYS[mode]:
        assert any(SAYS[mode] in n for n in notes), notes
    assert all(x.value == x.value and abs(x.value) != float("inf") for x in samples)  # never NaN or Inf
    if mode.startswith("health"):  # an answer no client reads is the target down, not a failing sampler
        ups = [x.value for x in samples if x.name == "health.up"]
        assert ups and not notes, (ups, notes)
    if mode == "metrics-nan":
        names = {x.name for x in samples}
        assert names == {"engine.num_preemptions_total"}, names  # the finite one is kept
        assert sum("read nan" in n for n in notes) == 1 and sum("read inf" in n for n in notes) == 1


def test_health_discovery_reads_a_bounded_answer() -> None:
    with serve_app(lambda: make_app("health-huge")) as port:
        before = _peak_mib()
        found = asyncio.run(discover_health(f"http://127.0.0.1:{port}", "/health", 5.0, settle=True))
    assert _peak_mib() - before < GROWTH_MIB
    assert found.path == "/health"


# -- through the installed CLI --------------------------------------------------------------------
PLAN = """\
name: pollers-{mode}
target: {{base_url: "{url}/v1", model: m, kind: {kind}}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 4, seed: 1, count: 8}}}}}}
change: {{variable: request_rate, steps: [20]}}
load: {{mode: open, request_rate: 20}}
phases: {{duration_s: 2, drain_s: 0.5}}
rounds: 1
stop_conditions: {{wall_clock_s: 60}}
samplers: {{interval_s: 0.5, sources: {sources}}}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, kind, sources, says",
    [
        ("metrics-series", "vllm", "[engine]", "sampler engine:"),
        ("metrics-nan", "vllm", "[engine]", "read nan"),
        ("ps-many", "ollama", "[ollama]", "sampler ollama: failing"),
        ("ps-bomb", "ollama", "[ollama]", "sampler ollama: failing: BodyTooLarge"),
        ("health-headers", "other", "[health]", ""),
    ],
)
def test_vramlab_run_is_not_slowed_or_failed_by_its_pollers(
    tmp_path: Path, mode: str, kind: str, sources: str, says: str
) -> None:
    """The run completes (exit 0), sends what it planned (20/s, three 2 s windows), its windows keep
    their length, the store keeps its samples, and the poller's trouble is in the run's notes."""
    many_series() if mode == "metrics-series" else gzip_bomb()
    with serve_app(lambda: make_app(mode)) as port:
        plan = tmp_path / "p.yaml"
        plan.write_text(PLAN.format(mode=mode, url=f"http://127.0.0.1:{port}", kind=kind, sources=sources))
        env = {k: v for k, v in os.environ.items() if k not in ("VRAMLAB_DB", "VRAMLAB_DEBUG")}
        res = subprocess.run(
            [VRAMLAB, "run", str(plan), "--db", str(tmp_path / "v.db"), "--json"],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["status"] == "completed" and out["requests"] >= 0.9 * 20 * 2 * 3, out
    con = sqlite3.connect(tmp_path / "v.db")
    notes = json.loads(con.execute("SELECT notes FROM runs").fetchone()[0])
    starts = [t for (t,) in con.execute("SELECT t_s FROM events WHERE kind = 'phase_start' ORDER BY t_s")]
    ends = [t for (t,) in con.execute("SELECT t_s FROM events WHERE kind = 'phase_end' ORDER BY t_s")]
    con.close()
    for a, b in zip(starts, ends, strict=True):
        assert b - a < 2 * (2 + 0.5), (a, b)  # a million series once stretched 2 s windows to 8 s
    assert not any("store" in n and "refused" in n for n in notes), notes
    if says:
        assert any(says in n for n in notes), notes
