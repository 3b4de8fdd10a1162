"""The client side of benchmarks/loadgen.py: one measurement in one process, its result as JSON.

    python benchmarks/loadgen_workers.py TOOL MODE CONFIG_JSON

TOOL is ``vramlab`` (vramlab's own client and driver: ``vramlab.load.client.OpenAIClient`` +
``vramlab.load.driver.drive``, the code path ``vramlab run`` takes for a window, on the event
loop ``vramlab run`` picks; for http:// that is vramlab's own HTTP client, load/fasthttp.py),
``vramlab-aiohttp`` (the same, forced onto aiohttp's ClientSession: ``load.http_client: aiohttp``), ``aiohttp`` (a plain asyncio + aiohttp loop) or ``aiohttp-uvloop``
(the same loop on uvloop). MODE is ``rate`` (closed loop, N workers, no think time: the most
requests one core completes) or ``overhead`` (500 streams held open against an endpoint that
answers after ``hold_s``, plus a Poisson open loop of probes against an endpoint that answers at
once; the probes' latency from their *scheduled* send time, and for vramlab the dispatch lag:
the schedule to the send, the client's own delay). vramlab
opens its held streams with its own open loop (Poisson, streams / hold_s per second); the plain
loop keeps ``streams`` workers busy, each starting at a random offset so they end out of step.
Locust runs through its own CLI with benchmarks/loadgen_locust.py instead.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

CHAT = "/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "bench",
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}],
    }
).encode()
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class CpuWindow:
    """This process's CPU seconds over the measured window (os.times: user + system)."""

    def __init__(self) -> None:
        self.a = self.b = (0.0, 0.0)

    @staticmethod
    def now() -> tuple[float, float]:
        t = os.times()
        return time.perf_counter(), t.user + t.system

    def start(self) -> None:
        self.a = self.now()

    def stop(self) -> None:
        self.b = self.now()

    def result(self) -> dict[str, float]:
        wall = self.b[0] - self.a[0]
        return {
            "window_s": round(wall, 3),
            "client_cpu_s": round(self.b[1] - self.a[1], 3),
            "client_cpu_pct": round(100 * (self.b[1] - self.a[1]) / wall, 1) if wall > 0 else 0.0,
        }


async def _at(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


async def _cpu_window(cpu: Any, ws: float, we: float) -> None:
    """Count the client's CPU time over the measured window only."""
    await _at(ws)
    cpu.start()
    await _at(we)
    cpu.stop()


# -- vramlab: the client + driver that `vramlab run` uses -----------------------------------------------
async def vramlab_rate(c: dict[str, Any]) -> dict[str, Any]:
    from vramlab.load.client import OpenAIClient
    from vramlab.load.driver import LoadShape, Window, drive
    from vramlab.load.prompts import cycle, synthetic_prompts

    pc, cpu = time.perf_counter, CpuWindow()
    ok, errors = [0], [0]
    t0 = pc()
    ws, we = t0 + c["warmup_s"], t0 + c["warmup_s"] + c["measure_s"]

    def on_result(r: Any) -> None:
        if ws <= r.end_at <= we:
            if r.ok:
                ok[0] += 1
            else:
                errors[0] += 1

    async with OpenAIClient(
        c["url"], "bench", "openai-chat", max_connections=c["conc"], http_client=c.get("http_client", "auto")
    ) as client:
        c["client"] = client.http_client
        mon = asyncio.ensure_future(_cpu_window(cpu, ws, we))
        await drive(
            client,
            cycle(synthetic_prompts(8, 1, 16, 0)),
            LoadShape(mode="closed", concurrency=c["conc"], max_tokens=1),
            Window(duration_s=c["warmup_s"] + c["measure_s"], drain_s=1.0),
            on_result,
        )
        await mon
    return {
        "ok": ok[0],
        "errors": errors[0],
        "rps": round(ok[0] / c["measure_s"], 1),
        "client": c["client"],
        **cpu.result(),
    }


async def vramlab_overhead(c: dict[str, Any]) -> dict[str, Any]:
    from vramlab.load.client import OpenAIClient
    from vramlab.load.driver import LoadShape, Window, drive
    from vramlab.load.prompts import cycle, synthetic_prompts

    cpu = CpuWindow()
    probes: list[Any] = []
    held = {"ok": 0, "errors": 0}

    def on_hold(r: Any) -> None:
        if r.error_class != "cancelled":
            held["ok" if r.ok else "errors"] += 1

    prompts = synthetic_prompts(8, 1, 16, 0)
    long_s = c["warmup_s"] + c["measure_s"] + 5 * c["hold_s"] + 5
    via = c.get("http_client", "auto")
    async with (
        OpenAIClient(
            c["hold_url"],
            "bench",
            "openai-chat",
            max_connections=2 * c["streams"],
            timeout_s=c["hold_s"] + 30,
            http_client=via,
        ) as hold,
        OpenAIClient(
            c["url"], "bench", "openai-chat", max_connections=c["probe_cap"], http_client=via
        ) as probe,
    ):
        # The held streams are vramlab's own open loop: Poisson arrivals at streams / hold_s keep
        # ``streams`` open on average (Little's law), out of step as real generations are.
        bg = asyncio.ensure_future(
            drive(
                hold,
                cycle(prompts),
                LoadShape(
                    mode="open",
                    concurrency=2 * c["streams"],
                    request_rate=c["streams"] / c["hold_s"],
                    seed=2,
                    max_tokens=1,
                ),
                Window(duration_s=long_s, drain_s=0.0),
                on_hold,
                id_prefix="h",
            )
        )
        await asyncio.sleep(c["warmup_s"] + 2 * c["hold_s"])  # all open, and out of step
        cpu.start()
        await drive(
            probe,
            cycle(prompts),
            LoadShape(
                mode="open", concurrency=c["probe_cap"], request_rate=c["probe_rate"], seed=1, max_tokens=1
            ),
            Window(duration_s=c["measure_s"], drain_s=2.0),
            probes.append,
            id_prefix="p",
        )
        cpu.stop()
        bg.cancel()
        await asyncio.gather(bg, return_exceptions=True)
    good = [r for r in probes if r.ok]
    return {
        "ok": len(good),
        "errors": len(probes) - len(good),
        "held_ok": held["ok"],
        "held_errors": held["errors"],
        "p50_ms": pct([r.e2e_from_scheduled_ms for r in good], 0.50),
        "p99_ms": pct([r.e2e_from_scheduled_ms for r in good], 0.99),
        "p99_from_sent_ms": pct([r.e2e_ms for r in good], 0.99),
        "lag_p99_ms": pct([r.dispatch_lag_ms for r in good], 0.99),
        "client": probe.http_client,
        **cpu.result(),
    }


# -- a plain asyncio + aiohttp loop ------------------------------------------------------------------
def _session(limit: int) -> Any:
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit))


async def aiohttp_rate(c: dict[str, Any]) -> dict[str, Any]:
    pc, cpu = time.perf_counter, CpuWindow()
    url = c["url"] + CHAT
    ok, errors = [0], [0]
    t0 = pc()
    ws, we = t0 + c["warmup_s"], t0 + c["warmup_s"] + c["measure_s"]
    async with _session(c["conc"]) as s:

        async def worker() -> None:
            while pc() < we:
                try:
                    async with s.post(url, data=BODY, headers=HEADERS) as r:
                        await r.read()
                        good = r.status == 200
                except Exception:
                    good = False
                if ws <= pc() <= we:
                    if good:
                        ok[0] += 1
                    else:
                        errors[0] += 1

        tasks = [asyncio.ensure_future(worker()) for _ in range(c["conc"])] + [
            asyncio.ensure_future(_cpu_window(cpu, ws, we))
        ]
        _, pending = await asyncio.wait(tasks, timeout=we + 1.0 - pc())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return {"ok": ok[0], "errors": errors[0], "rps": round(ok[0] / c["measure_s"], 1), **cpu.result()}


async def aiohttp_overhead(c: dict[str, Any]) -> dict[str, Any]:
    pc, cpu = time.perf_counter, CpuWindow()
    url, hold_url = c["url"] + CHAT, c["hold_url"] + CHAT
    lat: list[float] = []
    errors, held = [0], [0]
    stop = [False]
    async with _session(c["streams"] + 10) as hs, _session(c["probe_cap"]) as ps:

        async def holder() -> None:
            await asyncio.sleep(random.uniform(0, c["hold_s"]))  # out of step, as real generations are
            while not stop[0]:
                async with hs.post(hold_url, data=BODY, headers=HEADERS) as r:
                    await r.read()
                held[0] += 1

        async def probe(scheduled: float) -> None:
            try:
                async with ps.post(url, data=BODY, headers=HEADERS) as r:
                    await r.read()
                    good = r.status == 200
            except Exception:
                good = False
            if good:
                lat.append((pc() - scheduled) * 1000)
            else:
                errors[0] += 1

        holders = [asyncio.ensure_future(holder()) for _ in range(c["streams"])]
        await asyncio.sleep(c["warmup_s"] + 2 * c["hold_s"])
        cpu.start()
        rng = random.Random(1)
        t, end = pc(), pc() + c["measure_s"]
        tasks = []
        while t < end:
            await _at(t)
            tasks.append(asyncio.ensure_future(probe(t)))
            t += rng.expovariate(c["probe_rate"])
        await asyncio.wait(tasks, timeout=2.0)
        cpu.stop()
        stop[0] = True
        for h in holders + tasks:
            h.cancel()
        await asyncio.gather(*holders, *tasks, return_exceptions=True)
    return {
        "ok": len(lat),
        "errors": errors[0],
        "held_ok": held[0],
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        **cpu.result(),
    }


def _on_schedule(c: dict[str, Any], act: Callable[[], None]) -> list[float]:
    """The probes' Poisson schedule kept by a bare process: time.sleep to each time, then *act*;
    how late each one finished, in ms from its scheduled time."""
    pc, rng = time.perf_counter, random.Random(1)
    late: list[float] = []
    t = pc()
    end = t + c["measure_s"]
    while t < end:
        d = t - pc()
        if d > 0:
            time.sleep(d)
        act()
        late.append((pc() - t) * 1000)
        t += rng.expovariate(c["probe_rate"])
    return late


async def noise_overhead(c: dict[str, Any]) -> dict[str, Any]:
    """No client at all: the probes' Poisson schedule, and how late a bare process wakes up for
    each one (time.sleep, no event loop, no sockets). A stall of the core (a neighbour, the
    hypervisor) delays every probe scheduled inside it, exactly as it would a client's, so no
    tool's P99 can be below this floor, measured in the same interleaved slot."""
    late = _on_schedule(c, lambda: None)
    bare = _bare_requests(c)
    return {
        "ok": len(late),
        "errors": 0,
        "p50_ms": pct(late, 0.5),
        "p99_ms": pct(late, 0.99),
        "request_p50_ms": pct(bare, 0.5),
        "request_p99_ms": pct(bare, 0.99),
    }


def _bare_requests(c: dict[str, Any]) -> list[float]:
    """The same probe schedule sent by a bare process: time.sleep to each send, the same request on
    one kept-alive blocking socket, read to the end of its answer. Its latency from the schedule is
    the wake-up plus the endpoint's own round trip with no client in between: what no client's
    probe latency can go under, measured in the same slot (printed beside the bare-sleep floor)."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(c["url"])
    request = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    with socket.create_connection((u.hostname, u.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def exchange() -> None:
            sock.sendall(request)
            _read_answer(sock)

        return _on_schedule(c, exchange)


def _read_answer(sock: Any) -> None:
    """One HTTP/1.1 answer off a blocking socket: Content-Length or chunked framing."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    length = next(
        (int(h.split(b":", 1)[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")),
        None,
    )
    while (len(body) < length) if length is not None else not body.endswith(b"0\r\n\r\n"):
        body += sock.recv(65536)


WORKERS = {
    ("noise", "overhead"): noise_overhead,
    ("vramlab", "rate"): vramlab_rate,
    ("vramlab", "overhead"): vramlab_overhead,
    ("vramlab-aiohttp", "rate"): vramlab_rate,
    ("vramlab-aiohttp", "overhead"): vramlab_overhead,
    ("aiohttp", "rate"): aiohttp_rate,
    ("aiohttp", "overhead"): aiohttp_overhead,
    ("aiohttp-uvloop", "rate"): aiohttp_rate,
    ("aiohttp-uvloop", "overhead"): aiohttp_overhead,
}


def main(argv: list[str]) -> int:
    tool, mode, cfg = argv[0], argv[1], json.loads(argv[2])
    fn = WORKERS[(tool, mode)]
    if tool == "vramlab-aiohttp":
        cfg["http_client"] = "aiohttp"  # vramlab's client and driver, on aiohttp's ClientSession
    if tool.startswith("vramlab"):
        from vramlab.load.workers import event_loop_runner as _event_loop_runner

        runner = _event_loop_runner()  # uvloop where installed, exactly as `vramlab run`
        loop_name = "uvloop" if runner is not asyncio.run else "asyncio"
    elif tool == "aiohttp-uvloop":
        import uvloop

        runner, loop_name = uvloop.run, "uvloop"
    else:
        runner, loop_name = asyncio.run, "asyncio"
    if cfg.get("profile"):  # benchmarks/loadgen.py --profile: a separate run, never a measured one
        import cProfile
        import pstats

        prof = cProfile.Profile()
        res = prof.runcall(runner, fn(cfg))
        with open(cfg["profile"], "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(30)
    else:
        res = runner(fn(cfg))
    res["loop"] = loop_name
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
