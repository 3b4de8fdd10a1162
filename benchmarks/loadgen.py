"""How fast one client core drives a trivial OpenAI-style endpoint: vramlab's load generator
against locust FastHttpUser and a plain asyncio + aiohttp loop, in one run, side by side.

    python benchmarks/loadgen.py                    # 3 interleaved repetitions, ~4 minutes
    python benchmarks/loadgen.py --quick            # a few hundred requests, no locust if absent
    python benchmarks/loadgen.py -o benchmarks/results/loadgen.txt

The endpoint is a private nginx (Debian's ``nginx-light``: ``return`` for the immediate answer,
the echo module's ``echo_sleep`` for a held stream) on 127.0.0.1, pinned to the last CPU; every
client is pinned to the first (taskset), so "per core" means one core. Without nginx (or its
echo module) the endpoint is ``vramlab.load.stub`` in its own process, and the output says so.

Two measurements per tool, each in a fresh process, tools interleaved, medians of ``--reps``:
  rate      closed loop, ``--conc`` workers, no think time: completed requests per second, and
            per client CPU-second (the "per core" figure, robust to a neighbour stealing the core).
  overhead  ``--streams`` streams held open against the hold endpoint (each answers after
            ``--hold-s``; the users reopen them at once) while a Poisson open loop of probes at
            ``--probe-rate`` hits the immediate endpoint; the P99 of the probes' latency, timed
            from their *scheduled* send. nginx answers in microseconds, but its round trip under
            the held streams is in that latency: vramlab's bar is judged on its own delay (the
            schedule to the send, its dispatch lag) against the bare-sleep floor, and the latency
            to the answer is printed beside the bare request (the floor's process sending).
            Locust has no schedule: its latency is from the actual send, and rounded to 1 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _nginx import find_nginx, pinned, start_stub, stop, wait_up
from _nginx import start as start_nginx

HERE = Path(__file__).resolve().parent
CHUNK = '{"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}'
USAGE = '{"id":"b","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":1}}'
SSE = f"data: {CHUNK}\\n\\ndata: {USAGE}\\n\\ndata: [DONE]\\n\\n"
NAMES = {
    "vramlab": "vramlab (client + driver)",
    "vramlab-aiohttp": "vramlab on aiohttp",
    "locust": "locust FastHttpUser",
    "aiohttp": "plain asyncio + aiohttp",
    "aiohttp-uvloop": "plain aiohttp on uvloop",
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _cpus() -> tuple[int | None, int | None]:
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[-1]) if len(cpus) >= 2 else (None, None)


def _pinned(cmd: list[str], cpu: int | None) -> list[str]:
    return pinned(cmd, [cpu] if cpu is not None else None)


class Endpoint:
    """nginx when installed (with the echo module), else the stub in its own process."""

    def __init__(self, kind: str, hold_s: float, cpu: int | None, workdir: Path) -> None:
        self.hold_s, self.cpu, self.dir = hold_s, cpu, workdir
        nginx = find_nginx()
        self.kind = "nginx" if kind in ("auto", "nginx") and nginx else "stub"
        if kind == "nginx" and self.kind != "nginx":
            raise SystemExit(
                "loadgen: --server nginx, but nginx or its echo module is missing "
                "(apt-get install -y nginx-light)"
            )
        self._nginx, self.proc, self.url, self.hold_url = nginx, None, "", ""
        self.version = ""

    def __enter__(self) -> Endpoint:
        if self.kind == "nginx":
            self._start_nginx()
        else:
            self._start_stub()
        return self

    def _start_nginx(self) -> None:
        self.proc, self.url, self.version = start_nginx(
            self._nginx or "nginx",
            self.dir,
            f"""\
        location = /v1/chat/completions {{
            default_type text/event-stream;
            return 200 '{SSE}';
        }}
        location = /hold/v1/chat/completions {{
            default_type text/event-stream;
            echo_read_request_body;
            echo_sleep {self.hold_s};
            echo -n '{SSE}';
        }}""",
            connections=4096,
            cpus=[self.cpu] if self.cpu is not None else None,
        )
        self.hold_url = self.url + "/hold"
        self._wait_up()

    def _start_stub(self) -> None:
        code = (
            "import asyncio, json, sys\n"
            "from vramlab.load.stub import StubBehaviour, StubServer\n"
            "class Drop(list):\n    def append(self, x): pass\n"
            "async def main():\n"
            "    fast = StubServer(StubBehaviour(seen=Drop()))\n"
            f"    hold = StubServer(StubBehaviour(ttft_s={self.hold_s}, seen=Drop()))\n"
            "    async with fast, hold:\n"
            "        print(json.dumps([fast.url, hold.url]), flush=True)\n"
            "        await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        self.proc, (self.url, self.hold_url) = start_stub(code, [self.cpu] if self.cpu is not None else None)
        self.version = "vramlab.load.stub (aiohttp server)"

    def _wait_up(self) -> None:
        wait_up(self.url, self.proc, f"loadgen: the {self.kind}")

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def _run_one(
    tool: str,
    mode: str,
    ep: Endpoint,
    a: argparse.Namespace,
    cpu: int | None,
    tmp: Path,
    profile: str | None = None,
) -> dict[str, Any]:
    cfg = {
        "profile": profile,
        "url": ep.url,
        "hold_url": ep.hold_url,
        "warmup_s": a.warmup_s,
        "measure_s": a.measure_s,
        "conc": a.conc,
        "streams": a.streams,
        "hold_s": a.hold_s,
        "probe_rate": a.probe_rate,
        "probe_cap": a.probe_cap,
    }
    bound = a.warmup_s + a.measure_s + 5 * a.hold_s + 30  # every run also stops by itself before this
    if tool == "locust":
        out = tmp / f"locust-{mode}-{time.monotonic_ns()}.json"
        probe_users = max(1, min(100, int(a.probe_rate / 10)))
        env = {
            **os.environ,
            "RESULT_JSON": str(out),
            "WARMUP_S": str(a.warmup_s),
            "MEASURE_S": str(a.measure_s),
            "STREAMS": str(a.streams),
            "PROBE_USERS": str(probe_users),
            "PROBE_RATE": str(a.probe_rate),
            "BASE_URL": ep.url,
            "HOLD_URL": ep.hold_url,
            "HOLD_S": str(a.hold_s),
            "MEASURE_NAME": "rate" if mode == "rate" else "probe",
        }
        users, classes = (
            (a.conc, ["RateUser"]) if mode == "rate" else (a.streams + probe_users, ["HoldUser", "ProbeUser"])
        )
        cmd = [
            str(Path(sys.executable).with_name("locust")),
            "-f",
            str(HERE / "loadgen_locust.py"),
            "--headless",
            "--only-summary",
            "--skip-log-setup",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{int(bound)}s",
            *classes,
        ]
        proc = subprocess.run(_pinned(cmd, cpu), env=env, capture_output=True, text=True, timeout=bound + 15)
        if not out.exists():
            raise RuntimeError(f"locust {mode} wrote no result: {proc.stderr[-800:]}")
        return dict(json.loads(out.read_text()))
    cmd = [sys.executable, str(HERE / "loadgen_workers.py"), tool, mode, json.dumps(cfg)]
    proc = subprocess.run(_pinned(cmd, cpu), capture_output=True, text=True, timeout=bound + 15)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} {mode} failed: {proc.stderr[-800:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _table(results: dict[str, dict[str, list[dict[str, Any]]]], a: argparse.Namespace) -> list[str]:
    def per_core(r: dict[str, Any]) -> float | None:
        return r["ok"] / r["client_cpu_s"] if r.get("client_cpu_s") else None

    summary = {}
    for tool, modes in results.items():
        if tool == "noise":
            continue
        rate = modes.get("rate", [])
        for r in rate:
            r["per_core"] = per_core(r)
        summary[tool] = {
            "rps": _median(rate, "rps"),
            "per_core": _median(rate, "per_core"),
            "cpu": _median(rate, "client_cpu_pct"),
            "p99": _median(modes.get("overhead", []), "p99_ms"),
            "lag99": _median(modes.get("overhead", []), "lag_p99_ms"),
            "p50": _median(modes.get("overhead", []), "p50_ms"),
            "errors": sum(r["errors"] for m in modes.values() for r in m),
            "loop": (rate or modes.get("overhead") or [{}])[0].get("loop", ""),
            "client": (rate or modes.get("overhead") or [{}])[0].get("client", "aiohttp"),
        }
    ref = summary.get("locust", {}).get("per_core")
    base = summary.get("aiohttp-uvloop", {})
    lines = [
        f"{'tool':<28} {'loop':<8} {'http client':<12} {'req/s':>8} {'req/s/core':>11} {'cpu %':>6} "
        f"{'P50 ms':>7} {'P99 ms':>7} {'vs locust':>9} {'vs uvloop':>9} {'P99 vs uvloop':>13} {'errors':>6}"
    ]
    for tool, s in summary.items():

        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        ratio = f"{s['per_core'] / ref:.2f}x" if ref and s["per_core"] else "-"
        vs = f"{s['per_core'] / base['per_core']:.2f}x" if base.get("per_core") and s["per_core"] else "-"
        vs99 = f"{s['p99'] / base['p99']:.2f}x" if base.get("p99") and s["p99"] is not None else "-"
        client = "gevent" if tool == "locust" else ("fasthttp" if s["client"] == "fast" else s["client"])
        lines.append(
            f"{NAMES[tool]:<28} {s['loop']:<8} {client:<12} {f(s['rps'], '.0f'):>8} "
            f"{f(s['per_core'], '.0f'):>11} {f(s['cpu'], '.0f'):>6} {f(s['p50'], '.2f'):>7} "
            f"{f(s['p99'], '.2f'):>7} {ratio:>9} {vs:>9} {vs99:>13} {s['errors']:>6}"
        )
    noise = results.get("noise", {}).get("overhead", [])
    if noise:
        lines.append(
            f"floor: a bare process sleeping to the same probe schedule on the client core wakes late by "
            f"P50 {_median(noise, 'p50_ms'):.2f} ms, P99 {_median(noise, 'p99_ms'):.2f} ms "
            "(neighbours, hypervisor): no client's P99 beats that"
        )
        if _median(noise, "request_p99_ms") is not None:
            lines.append(
                "bare request: the same process sending the same request on one kept-alive socket at those "
                f"times: P50 {_median(noise, 'request_p50_ms'):.2f} ms, P99 {_median(noise, 'request_p99_ms'):.2f} ms "
                "from the schedule (the wake-up plus the endpoint's round trip, no client in between)"
            )
    lines.extend(_verdict(summary, _median(noise, "p99_ms"), _median(noise, "request_p99_ms")))
    return lines


def _verdict(
    summary: dict[str, dict[str, Any]], floor_p99: float | None, request_p99: float | None = None
) -> list[str]:
    """The two bars vramlab's client keeps: its req/s per core over the plain aiohttp loop on uvloop
    (>= 2x) and its own delay's P99 over the bare-sleep floor measured in the same run (<= 2x).

    The client's own delay is from a probe's scheduled time to its send (vramlab's dispatch lag, as
    every run records it): the span the floor measures for a bare process (scheduled time to
    acting). A probe's latency from the schedule to its answer adds the endpoint's round trip, which
    is no client's: the bare request (the floor's process sending on one socket, no client in
    between) shows how much of the floor's multiple that round trip alone takes."""
    me, base = summary.get("vramlab", {}), summary.get("aiohttp-uvloop", {})
    out = []
    if me.get("per_core") and base.get("per_core"):
        lead = me["per_core"] / base["per_core"]
        out.append(
            f"lead: vramlab {lead:.2f}x the plain aiohttp loop on uvloop per core (bar >= 2x: {'met' if lead >= 2 else 'NOT met'})"
        )
    if me.get("lag99") is not None and floor_p99:
        ratio = me["lag99"] / floor_p99
        out.append(
            f"P99 over the floor: vramlab {me['lag99']:.2f} ms / {floor_p99:.2f} ms = {ratio:.2f}x "
            f"(bar <= 2x: {'met' if ratio <= 2 else 'NOT met'}; the client's own delay, from a probe's "
            "scheduled time to its send)"
        )
    if me.get("p99") is not None and floor_p99:
        bare = f"; the bare request alone is {request_p99 / floor_p99:.2f}x" if request_p99 else ""
        out.append(
            f"P99 to the answer over the floor: vramlab {me['p99']:.2f} ms / {floor_p99:.2f} ms = "
            f"{me['p99'] / floor_p99:.2f}x (schedule to answer: the endpoint's round trip included{bare})"
        )
    if me.get("p99") is not None and request_p99:
        out.append(
            f"P99 over the bare request: vramlab {me['p99']:.2f} ms / {request_p99:.2f} ms = "
            f"{me['p99'] / request_p99:.2f}x (what the client adds beyond the endpoint's own round trip)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a tiny bounded run (a few hundred requests), 1 rep")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--measure-s", type=float, default=8.0)
    p.add_argument("--conc", type=int, default=100, help="closed-loop workers in the rate run")
    p.add_argument("--streams", type=int, default=500, help="streams held open in the overhead run")
    p.add_argument("--hold-s", type=float, default=1.0, help="how long the hold endpoint keeps a stream open")
    p.add_argument("--probe-rate", type=float, default=500.0, help="probe requests per second (Poisson)")
    p.add_argument("--probe-cap", type=int, default=100, help="in-flight cap on the probes")
    p.add_argument("--server", choices=["auto", "nginx", "stub"], default="auto")
    p.add_argument("--tools", default="vramlab,vramlab-aiohttp,locust,aiohttp,aiohttp-uvloop")
    p.add_argument("--json", action="store_true", help="print every run's raw result as JSON too")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the measured runs, one more run of each "
        "tool's rate mode under cProfile (not measured): where the CPU goes per request",
    )
    p.add_argument("-o", "--output", help="also write the report to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.reps, a.warmup_s, a.measure_s, a.conc = 1, 0.2, 0.5, 20
        a.streams, a.hold_s, a.probe_rate, a.probe_cap = 50, 0.2, 200.0, 20
    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    notes = []
    for t in tools:
        if t not in NAMES:
            p.error(f"unknown tool {t!r}; choose from {', '.join(NAMES)}")
    if "locust" in tools and not Path(sys.executable).with_name("locust").exists():
        tools.remove("locust")
        notes.append("locust is not installed (pip install -e '.[bench]'): no locust row")
    if "aiohttp-uvloop" in tools:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            tools.remove("aiohttp-uvloop")
            notes.append("uvloop is not installed: no uvloop row")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the endpoint is stopped on the way out
    client_cpu, server_cpu = _cpus()
    load_start = os.getloadavg()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        t: {"rate": [], "overhead": []} for t in tools + ["noise"]
    }
    with (
        tempfile.TemporaryDirectory(prefix="vramlab-loadgen-") as td,
        Endpoint(a.server, a.hold_s, server_cpu, Path(td)) as ep,
    ):
        for rep in range(a.reps):
            for mode in ("rate", "overhead"):
                for tool in tools + (["noise"] if mode == "overhead" else []):  # interleaved: a noisy
                    # neighbour hits every tool alike
                    res = _run_one(tool, mode, ep, a, client_cpu, Path(td))
                    results[tool][mode].append(res)
                    print(
                        f"rep {rep + 1}/{a.reps} {mode:<8} {tool:<15} {json.dumps(res)}",
                        file=sys.stderr,
                        flush=True,
                    )
        profiles = {}
        if a.profile:
            for tool in [t for t in tools if t != "locust"]:
                path = Path(td) / f"profile-{tool}.txt"
                _run_one(tool, "rate", ep, a, client_cpu, Path(td), profile=str(path))
                profiles[tool] = path.read_text() if path.exists() else "(no profile written)"

    head = [
        f"vramlab load-generator benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {platform.node()})",
        f"endpoint: {ep.kind} ({ep.version}) on 127.0.0.1, pinned to CPU {server_cpu}; clients pinned to CPU "
        f"{client_cpu}"
        if client_cpu is not None
        else f"endpoint: {ep.kind} ({ep.version}); NOT pinned (fewer than 2 CPUs)",
        f"machine: {os.cpu_count()} CPUs ({_cpu_model()}); load average {' '.join(f'{x:.2f}' for x in load_start)}"
        f" at the start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end"
        + (
            " (above the CPU count: the machine was shared and busy, and every figure below is noisier for it)"
            if max(load_start[0], os.getloadavg()[0]) > (os.cpu_count() or 1)
            else " (below the CPU count: quiet)"
        ),
        f"python {platform.python_version()}, {os.cpu_count()} CPUs; median of {a.reps} interleaved reps, "
        f"{a.warmup_s:g} s warm-up + {a.measure_s:g} s measured each",
        f"rate: closed loop, {a.conc} workers, 1-token SSE answer; req/s/core = completed / client CPU-s; "
        "vs uvloop: req/s/core over the plain aiohttp loop on uvloop's (the issue's bar: >= 1.0x), P99 vs "
        "uvloop: the overhead P99 over its (bar: <= 1.2x); http client: fasthttp = vramlab's own "
        "(load/fasthttp.py), aiohttp = aiohttp's ClientSession",
        f"P50/P99: probe latency from the scheduled send, {a.probe_rate:g} req/s Poisson, while ~{a.streams} "
        f"streams are held open ({a.hold_s:g} s each; vramlab opens them with its own Poisson open loop, the "
        "others reopen them at once from random offsets); the endpoint answers at once, but its round trip "
        "under the held streams is in every probe's latency (locust: from its actual send, whole ms)",
        "",
    ]
    lines = head + _table(results, a) + [f"note: {n}" for n in notes]
    for tool, text in profiles.items():
        lines += [
            "",
            f"profile: {NAMES[tool]}, rate mode (cProfile, by own time; not a measured run)",
            *text.strip().splitlines()[:40],
        ]
    text = "\n".join(lines)
    print(text)
    if a.json:
        print(json.dumps(results, indent=1))
    if a.output:
        Path(a.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
