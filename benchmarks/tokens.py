"""Does the load generator time every token as the server sent it? A token stream with a known
schedule, many streams at once, vramlab beside a plain aiohttp loop and the peers (AIPerf, GuideLLM).

    python benchmarks/tokens.py                          # 100, 500, 1,000, 2,000 streams, every tool found
    python benchmarks/tokens.py --quick                  # tiny, correctness only (a test runs it)
    python benchmarks/tokens.py --profile                # + where vramlab's client spends its CPU (cProfile)
    python benchmarks/tokens.py --peers /tmp/peers       # peers from venvs: /tmp/peers/{aiperf,guidellm}/bin
    python benchmarks/tokens.py -o benchmarks/results/tokens.txt

The peers, each in its own venv (their pins conflict with vramlab's and with each other's):

    python3 -m venv benchmarks/.venvs/aiperf && benchmarks/.venvs/aiperf/bin/pip install aiperf==0.13.0
    python3 -m venv benchmarks/.venvs/guidellm && benchmarks/.venvs/guidellm/bin/pip install guidellm==0.8.1

inference-perf is not run: every release on PyPI needs Python >= 3.12.

The endpoint streams every request the same way: the first SSE chunk ``--ttft-ms`` after the
request, then ``--tokens - 1`` more, one every ``--gap-ms``, then a usage chunk and ``[DONE]``.
It is nginx with the echo module (Debian: ``apt-get install -y nginx-light libnginx-mod-http-echo``;
``echo_sleep`` + ``echo_flush`` per chunk), one worker pinned to the last CPU; without it, the
stub server (``vramlab.load.stub``) in its own process, and the output says so. The endpoint's own
CPU is measured: below ~70 % of its core it keeps its schedule (nginx's timers are 1 ms exact), so
every error in the table is the client's.

Each tool holds N streams (closed loop: a user opens the next stream as soon as one ends) for
``--warmup-s`` + ``--measure-s``; only the measured window counts. ``vramlab-trace`` is the one open
loop: it replays the arrival times of examples/mooncake-sample.jsonl (Mooncake's trace format, read
by vramlab's trace reader), scaled so that the trace's mean rate holds N streams and repeated over
the window, so its streams open in the trace's bursts and lulls:
  streams held   mean open streams over the window (time-weighted), against N
  tokens/s       token chunks received in the window; ideal = N x tokens / (ttft + (tokens-1) x gap)
  CPU-ms/req     the client's CPU time (every process of it) over completed requests
  TTFT err       TTFT as the tool measured it, minus the schedule's ttft-ms (P50 / P99)
  ITL err        every gap between two token chunks as the tool measured it, minus gap-ms (P50 / P99);
                 for tools that report ITL only as a per-request mean, that mean minus gap-ms (said so);
                 against the schedule, so it includes the endpoint's own lateness (see the wire check)
  untimed gaps   gaps where a token came in one read with later bytes: when it arrived is unknown
How each tool defines ITL is printed with the table.

The wire check (``--wire``, on by default as root with tcpdump installed: ``apt-get install -y
tcpdump``): for vramlab in one process, tcpdump records ``--wire-s`` of nginx's data packets on lo
mid-window, stamped by the kernel as they leave nginx, apart from the client's process; every gap
vramlab timed in that span is compared with the gap between the two packets that carried its
tokens (client minus wire: the client's own timing error), and the wire's gaps against the
schedule give the endpoint's lateness, which on a shared core is not zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _nginx import find_nginx, pinned, start_stub, stop, wait_up
from _nginx import start as start_nginx

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent / "examples" / "mooncake-sample.jsonl"  # vramlab-trace's arrival times
TIMEOUT_S = 120.0  # every client's request timeout
CHUNK = (
    '{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    '"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
)
FINAL = (
    '{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1700000000,"model":"bench",'
    '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}'
)
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
ITL_DEFINITIONS = {
    "vramlab": "every gap between two token chunks that could be timed (RequestRecord.itl_ms): each end the "
    "kernel's receive time of a read that ended with it (fasthttp), or the time aiohttp's read "
    "returned (vramlab-aiohttp); gaps into a token read together with later bytes are left out and "
    "counted (untimed gaps); TPOT is the per-request mean",
    "vramlab-trace": "as vramlab, its streams opened by the open loop at the arrival times of "
    "examples/mooncake-sample.jsonl (Mooncake's format), scaled to hold N streams on average and "
    "repeated: bursts and lulls, not N steady users",
    "aiohttp-uvloop": "every gap between two token chunks, as received (the reference loop)",
    "aiperf": "'inter_token_latency' is a per-request mean ((last - first token) / (tokens - 1)); "
    "'inter_chunk_latency' is every gap: the per-gap column uses it",
    "guidellm": "'inter_token_latency' is a per-request mean ((last - first token) / (output tokens - 1)); "
    "it keeps no per-gap times: the per-gap column is that mean",
}


def _usage(tokens: int) -> str:
    return (
        '{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[],'
        f'"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},"total_tokens":{tokens + 8}}}}}'
    )


def _cpus() -> tuple[list[int], int | None]:
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[:-1], cpus[-1]) if len(cpus) >= 2 else (cpus, None)


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and every live descendant (peers run many processes)."""
    total, seen, todo = 0.0, set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _proc_cpu_s(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return total


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# -- the endpoint ------------------------------------------------------------------------------------
class Endpoint:
    """nginx + echo when installed, else the stub in its own process; pinned to ``cpu``."""

    def __init__(self, kind: str, a: argparse.Namespace, cpu: int | None, workdir: Path) -> None:
        self.a, self.cpu, self.dir = a, cpu, workdir
        nginx = find_nginx()
        self.kind = "nginx" if kind in ("auto", "nginx") and nginx else "stub"
        if kind == "nginx" and self.kind != "nginx":
            raise SystemExit(
                "tokens: --server nginx, but nginx or its echo module is missing "
                "(apt-get install -y nginx-light libnginx-mod-http-echo)"
            )
        self._nginx = nginx
        self.proc: subprocess.Popen[Any] | None = None
        self.url, self.version = "", ""

    def __enter__(self) -> Endpoint:
        (self._start_nginx if self.kind == "nginx" else self._start_stub)()
        return self

    def _start_nginx(self) -> None:
        a = self.a
        sse = lambda s: s.replace("\\", "\\\\").replace("'", "\\'")  # noqa: E731
        steps = [f"echo_sleep {a.ttft_ms / 1000:.3f};", f"echo -n 'data: {sse(CHUNK)}\\n\\n';", "echo_flush;"]
        for _ in range(a.tokens - 1):
            steps += [
                f"echo_sleep {a.gap_ms / 1000:.3f};",
                f"echo -n 'data: {sse(CHUNK)}\\n\\n';",
                "echo_flush;",
            ]
        steps += [f"echo -n 'data: {sse(FINAL)}\\n\\ndata: {sse(_usage(a.tokens))}\\n\\ndata: [DONE]\\n\\n';"]
        body = "\n            ".join(steps)
        self.proc, self.url, version = start_nginx(
            self._nginx or "nginx",
            self.dir,
            f"""\
        location ~ ^/v1/(chat/)?completions$ {{
            default_type text/event-stream;
            echo_read_request_body;
            {body}
        }}
        location = /health {{
            return 200 'ok';
        }}
        location = /v1/models {{
            default_type application/json;
            return 200 '{{"object":"list","data":[{{"id":"bench","object":"model"}}]}}';
        }}""",
            connections=16384,
            cpus=[self.cpu] if self.cpu is not None else None,
        )
        self.version = version + " + echo module"
        self._wait_up()

    def _start_stub(self) -> None:
        a = self.a
        code = (
            "import asyncio, json\n"
            "from vramlab.load.stub import StubBehaviour, StubServer\n"
            "class Drop(list):\n    def append(self, x): pass\n"
            "async def main():\n"
            f"    async with StubServer(StubBehaviour(ttft_s={a.ttft_ms / 1000}, token_s={a.gap_ms / 1000}, "
            "seen=Drop())) as s:\n"
            "        print(json.dumps(s.url), flush=True)\n"
            "        await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        self.proc, self.url = start_stub(code, [self.cpu] if self.cpu is not None else None)
        self.version = "vramlab.load.stub (aiohttp; its own timing is not exact under load)"

    def _wait_up(self) -> None:
        wait_up(self.url, self.proc, f"tokens: the {self.kind}")

    def worker_pids(self) -> list[int]:
        if self.proc is None:
            return []
        if self.kind == "stub":
            return [self.proc.pid]
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(c) for c in f.read().split()]
        except OSError:
            return []

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


# -- in-process clients (run in a child process, pinned) --------------------------------------------
Req = tuple[float, float, "float | None", list[float], bool, tuple[int, ...]]


def _summary(
    cfg: dict[str, Any], reqs: list[Req], ws: float, we: float, cpu_s: float, exclude_coalesced: bool
) -> dict[str, Any]:
    """reqs: (sent, end, ttft_ms, token_times, ok, coalesced) per request; coalesced: the indices of
    token times that are only upper bounds (the token came in one read with later bytes). With
    ``exclude_coalesced`` (vramlab: its records leave those gaps out) a gap touching one is not in the
    ITL figures; either way they are counted (``untimed_gaps``). The window is [ws, we]."""
    wlen = we - ws
    held = sum(max(0.0, min(e, we) - max(s, ws)) for s, e, *_ in reqs) / wlen
    done = [r for r in reqs if ws <= r[1] <= we]
    ok = [r for r in done if r[4]]
    tokens = sum(1 for r in reqs for t in r[3] if ws <= t <= we)
    gap = cfg["gap_ms"]
    itl_err: list[float] = []
    untimed = gaps = 0
    for r in ok:
        t, bad = r[3], set(r[5])
        gaps += max(0, len(t) - 1)
        for i in range(1, len(t)):
            if i in bad or i - 1 in bad:
                untimed += 1
                if exclude_coalesced:
                    continue
            itl_err.append((t[i] - t[i - 1]) * 1000 - gap)
    ttft_err = [r[2] - cfg["ttft_ms"] for r in ok if r[2] is not None]
    return {
        "completed": len(done),
        "ok": len(ok),
        "errors": len(done) - len(ok),
        "streams_held": round(held, 1),
        "tokens_per_s": round(tokens / wlen, 1),
        "cpu_s": round(cpu_s, 3),
        "cpu_ms_per_req": round(1000 * cpu_s / len(done), 3) if done else None,
        "ttft_err_p50_ms": _pct(ttft_err, 0.5),
        "ttft_err_p99_ms": _pct(ttft_err, 0.99),
        "itl_err_p50_ms": _pct(itl_err, 0.5),
        "itl_err_p99_ms": _pct(itl_err, 0.99),
        "itl_kind": "per timed gap" if exclude_coalesced else "per gap",
        "window_s": round(wlen, 3),
        "gaps": gaps,
        "untimed_gaps": untimed,
    }


async def _vramlab(cfg: dict[str, Any]) -> dict[str, Any]:
    from vramlab.load.client import OpenAIClient
    from vramlab.load.driver import LoadShape, Window, drive
    from vramlab.load.prompts import Prompt

    pc = time.perf_counter
    n, workers = cfg["streams"], cfg.get("workers", 1)
    reqs: list[Req] = []
    via = cfg.get("http_client", "auto")

    # the wire check (--wire): which connection served each request, keyed by the request's deadline
    # (its send time + the timeout: a float unique to it, and on its record as sent_at + timeout)
    ports: dict[float, int] = {}
    deadlines: dict[int, float] = {}  # id(sink) -> deadline, while the request is in the pool
    dump: list[tuple[int, list[float], tuple[int, ...]]] = []
    clock: list[Any] = []  # the client's wall-clock converter: its record of wall-clock steps

    def on_result(r: Any) -> None:
        if r.error_class != "cancelled":
            reqs.append((r.sent_at, r.end_at, r.ttft_ms, list(r.token_times), r.ok, r.coalesced))
            if cfg.get("dump") and r.ok:
                port = ports.pop(r.sent_at + TIMEOUT_S, None)
                if port is not None:
                    dump.append((port, list(r.token_times), r.coalesced))

    prompts = [Prompt("hello", 8, cfg["tokens"])]
    shape = LoadShape(mode="closed", concurrency=n, max_tokens=cfg["tokens"])
    conns = n + 8
    if cfg.get("trace"):  # vramlab-trace: the open loop replays a trace's own arrival times
        conns = 4 * n + 8  # a burst holds more than n streams: none waits for a connection
        shape = LoadShape(
            mode="open",
            concurrency=4 * n,
            schedule=trace_schedule(cfg["trace"], n, cfg, cfg["warmup_s"] + cfg["measure_s"]),
            max_tokens=cfg["tokens"],
        )
    window = Window(duration_s=cfg["warmup_s"] + cfg["measure_s"], drain_s=0.0)
    t0 = pc()
    ws, we = t0 + cfg["warmup_s"], t0 + cfg["warmup_s"] + cfg["measure_s"]
    cpu: dict[str, float] = {}
    pids: list[int] = [os.getpid()]

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, ws - pc()))
        cpu["a"] = sum(_proc_cpu_s(p) for p in pids)
        await asyncio.sleep(max(0.0, we - pc()))
        cpu["b"] = sum(_proc_cpu_s(p) for p in pids)

    if workers > 1:
        from vramlab.load.workers import ClientConfig, WorkerPool

        async with WorkerPool(
            workers,
            ClientConfig(cfg["url"], "bench", max_connections=conns, timeout_s=TIMEOUT_S, http_client=via),
        ) as pool:
            pids.extend(pool.pids)
            t0 = pc()  # the pool took a while to start: the window starts now
            ws, we = t0 + cfg["warmup_s"], t0 + cfg["warmup_s"] + cfg["measure_s"]
            mon = asyncio.ensure_future(cpu_window())
            await pool.drive(prompts, shape, window, on_result)
            await mon
    else:
        async with OpenAIClient(
            cfg["url"], "bench", max_connections=conns, timeout_s=TIMEOUT_S, http_client=via
        ) as client:
            if cfg.get("dump"):
                from vramlab.load import fasthttp, h1response

                start = h1response.Response.start  # each answer in turn on a connection's one parser
                request = fasthttp.Pool.request

                async def spy_request(self: Any, data: bytes, sink: Any, deadline: float) -> Any:
                    deadlines[id(sink)] = deadline
                    try:
                        return await request(self, data, sink, deadline)
                    finally:
                        deadlines.pop(id(sink), None)

                def spy(self: Any, fut: Any, sink: Any) -> None:
                    start(self, fut, sink)
                    ports[deadlines[id(sink)]] = self.conn.sock.getsockname()[1]

                # (not by task: an open loop's request takes its connection in the loop's own task)
                fasthttp.Pool.request = spy_request
                h1response.Response.start = spy
                clock.append(client._pool.clock)
            mon = asyncio.ensure_future(cpu_window())
            if cfg.get("profile"):
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
            await drive(client, iter(lambda: prompts[0], None), shape, window, on_result)
            if cfg.get("profile"):
                prof.disable()
                with open(cfg["profile"], "w") as f:
                    pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(25)
            await mon
    res = _summary(cfg, reqs, ws, we, cpu["b"] - cpu["a"], exclude_coalesced=True)
    res["workers"] = workers
    if cfg.get("dump"):
        # token times on perf_counter, and the wall-clock steps the client saw (to put the pcap's
        # wall-clock stamps on the same clock)
        steps = [(max(a, -1e18), o) for a, o in clock[0].steps] if clock else []
        Path(cfg["dump"]).write_text(json.dumps({"requests": dump, "steps": steps}))
    from vramlab.load.client import fast_path_refusal

    res["client"] = "aiohttp" if via == "aiohttp" or fast_path_refusal(cfg["url"] + "/v1") else "fasthttp"
    return res


async def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    """The reference: N coroutines on one aiohttp session, a perf_counter stamp per token chunk."""
    import aiohttp

    pc = time.perf_counter
    n = cfg["streams"]
    url = cfg["url"] + "/v1/chat/completions"
    body = json.dumps(
        {
            "model": "bench",
            "max_tokens": cfg["tokens"],
            "stream": True,
            "messages": [{"role": "user", "content": "hello"}],
        }
    ).encode()
    reqs: list[Req] = []
    t0 = pc()
    ws, we = t0 + cfg["warmup_s"], t0 + cfg["warmup_s"] + cfg["measure_s"]
    cpu: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n + 8), read_bufsize=2**20) as s:

        async def user() -> None:
            while pc() < we:
                sent = pc()
                times: list[float] = []
                joined: list[int] = []  # tokens read together with the next one (known here, not excluded)
                ok = False
                try:
                    async with s.post(url, data=body, headers=HEADERS) as r:
                        async for chunk in r.content.iter_any():
                            t = pc()
                            k = chunk.count(b'"content"')
                            if k > 1:
                                joined.extend(range(len(times), len(times) + k - 1))
                            times.extend([t] * k)
                        ok = r.status == 200
                except aiohttp.ClientError:
                    pass
                reqs.append(
                    (sent, pc(), (times[0] - sent) * 1000 if times else None, times, ok, tuple(joined))
                )

        async def cpu_window() -> None:
            await asyncio.sleep(max(0.0, ws - pc()))
            t = os.times()
            cpu["a"] = t.user + t.system
            await asyncio.sleep(max(0.0, we - pc()))
            t = os.times()
            cpu["b"] = t.user + t.system

        tasks = [asyncio.ensure_future(user()) for _ in range(n)]
        await cpu_window()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    res = _summary(cfg, reqs, ws, we, cpu["b"] - cpu["a"], exclude_coalesced=False)
    res["client"] = "aiohttp"
    return res


def trace_schedule(path: str, n: int, cfg: dict[str, Any], span_s: float) -> tuple[float, ...]:
    """A Mooncake trace's arrival times (vramlab's own reader), scaled so that its mean rate keeps
    ``n`` streams of the endpoint's schedule open (Little's law) and repeated until ``span_s``: the
    trace's bursts and lulls at the load the other rows hold."""
    from vramlab.load.trace import read_trace

    times = [r.t_s for r in read_trace(path, "mooncake")]
    span = times[-1] - times[0]
    stream_s = (cfg["ttft_ms"] + (cfg["tokens"] - 1) * cfg["gap_ms"]) / 1000
    scale = (len(times) - 1) / span * stream_s / n  # the trace's rate x scale^-1 = n / stream_s
    period = (span + span / (len(times) - 1)) * scale  # one pass, and the mean gap before the next
    out: list[float] = []
    k = 0
    while True:
        for t in times:
            at = k * period + (t - times[0]) * scale
            if at >= span_s:
                return tuple(out)
            out.append(at)
        k += 1


def client_main(tool: str, cfg: dict[str, Any]) -> None:
    if tool == "vramlab":
        from vramlab.load.workers import event_loop_runner as _event_loop_runner

        runner = _event_loop_runner()
        res = runner(_vramlab(cfg))
        res["loop"] = "uvloop" if runner is not asyncio.run else "asyncio"
    else:
        import uvloop

        res = uvloop.run(_plain(cfg))
        res["loop"] = "uvloop"
    print(json.dumps(res))


# -- peers ---------------------------------------------------------------------------------------
def _peer_bin(peers: Path | None, name: str) -> Path | None:
    for base in ([peers] if peers else []) + [HERE / ".venvs", Path("/tmp/i15-venvs")]:
        p = base / name / "bin" / name
        if p.exists():
            return p
    found = shutil.which(name)
    return Path(found) if found else None


def _run_monitored(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> tuple[subprocess.CompletedProcess[str], list[tuple[float, float]]]:
    """Run a peer; sample its whole process tree's CPU seconds every 0.25 s as (epoch s, cpu s)."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = []
    try:
        while proc.poll() is None:
            samples.append((time.time(), _tree_cpu_s(proc.pid)))
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGTERM)  # the peer's own process group, started above
                break
            time.sleep(0.25)
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:  # we are being stopped (SIGTERM, Ctrl-C): the peer's group goes too
            os.killpg(proc.pid, signal.SIGTERM)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), samples


def _cpu_between(samples: list[tuple[float, float]], a: float, b: float) -> float:
    """CPU seconds spent between epoch times a and b (nearest samples)."""
    if not samples:
        return float("nan")
    at = lambda t: min(samples, key=lambda s: abs(s[0] - t))[1]  # noqa: E731
    return at(b) - at(a)


def _window_stats(reqs: list[tuple[float, float, int]], ws: float, we: float) -> tuple[float, list[int], int]:
    """reqs: (start, end, tokens) in epoch s: (streams held, indexes completed in the window, tokens)."""
    held = sum(max(0.0, min(e, we) - max(s, ws)) for s, e, _ in reqs) / (we - ws)
    done = [i for i, (_, e, _) in enumerate(reqs) if ws <= e <= we]
    return held, done, sum(reqs[i][2] for i in done)


def _tokenizer_dir(python: Path, tmp: Path) -> Path:
    """A tiny local word-level tokenizer (the peers want one; nothing may be downloaded)."""
    out = tmp / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    code = """import json, pathlib, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
words = "tok hello bench the a of to and in is it you that was for on are with as be at one have this from".split()
tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator([" ".join(words)] * 4, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]))
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "[UNK]", "pad_token": "[PAD]", "model_max_length": 1000000}))
"""
    subprocess.run([str(python), "-c", code, str(out)], check=True, capture_output=True, timeout=120)
    return out


def _peer_result(
    cfg: dict[str, Any],
    held: float,
    done: int,
    errors: int,
    tokens: int,
    span: float,
    cpu: float,
    ttft: list[float],
    itl: list[float],
    itl_kind: str,
    wait: list[float],
    tool: str,
) -> dict[str, Any]:
    return {
        "completed": done,
        "ok": done - errors,
        "errors": errors,
        "streams_held": round(held, 1),
        "tokens_per_s": round(tokens / span, 1),
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_req": round(1000 * cpu / done, 3) if done and cpu == cpu else None,
        "ttft_err_p50_ms": _pct(ttft, 0.5),
        "ttft_err_p99_ms": _pct(ttft, 0.99),
        "itl_err_p50_ms": _pct(itl, 0.5),
        "itl_err_p99_ms": _pct(itl, 0.99),
        "itl_kind": itl_kind,
        "send_wait_p50_ms": _pct(wait, 0.5),
        "send_wait_p99_ms": _pct(wait, 0.99),
        "loop": tool,
        "window_s": round(span, 3),
    }


def _aiperf(bin_: Path, cfg: dict[str, Any], cpus: list[int] | None, tmp: Path) -> dict[str, Any]:
    art = tmp / f"aiperf-{cfg['streams']}-{time.monotonic_ns()}"
    n = cfg["streams"]
    tok = _tokenizer_dir(bin_.parent / "python", tmp)
    cmd = pinned(
        [
            str(bin_),
            "profile",
            "--model",
            "bench",
            "--url",
            cfg["url"],
            "--endpoint-type",
            "chat",
            "--streaming",
            "--concurrency",
            str(n),
            "--benchmark-duration",
            str(cfg["warmup_s"] + cfg["measure_s"]),
            "--benchmark-grace-period",
            "5",
            "--osl",
            str(cfg["tokens"]),
            "--isl",
            "8",
            "--tokenizer",
            str(tok),
            "--use-server-token-count",
            "--ui-type",
            "none",
            "--artifact-dir",
            str(art),
        ],
        cpus,
    )
    # (no HF_HUB_OFFLINE here: with it set, AIPerf 0.13 takes the local tokenizer folder for a hub id)
    proc, samples = _run_monitored(cmd, dict(os.environ), tmp, cfg["measure_s"] + 240)
    rec = next(art.rglob("profile_export.jsonl"), None)
    if rec is None:
        return {
            "error": f"aiperf wrote no records (rc {proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}"
        }
    rows = []
    for line in rec.read_text().splitlines():
        d = json.loads(line)
        md, m = d.get("metadata", {}), d.get("metrics", {})

        def val(k: str, m: dict[str, Any] = m) -> Any:
            v = m.get(k)
            return v.get("value") if isinstance(v, dict) else v

        if md.get("request_start_ns") is None:
            continue
        rows.append(
            (
                md["request_start_ns"] / 1e9,
                (md.get("request_end_ns") or md["request_start_ns"]) / 1e9,
                int(val("output_sequence_length") or 0),
                bool(d.get("error")) or not m,
                val("time_to_first_token"),
                val("inter_chunk_latency") or [],
                (md["request_start_ns"] - md.get("credit_issued_ns", md["request_start_ns"])) / 1e6,
            )
        )
    if not rows:
        return {"error": "aiperf recorded no requests"}
    ws = min(r[0] for r in rows) + cfg["warmup_s"]
    we = ws + cfg["measure_s"]
    held, done, tokens = _window_stats([(r[0], r[1], r[2]) for r in rows], ws, we)
    sel = [rows[i] for i in done]
    ok = [r for r in sel if not r[3]]
    return _peer_result(
        cfg,
        held,
        len(sel),
        len(sel) - len(ok),
        tokens,
        we - ws,
        _cpu_between(samples, ws, we),
        [r[4] - cfg["ttft_ms"] for r in ok if r[4] is not None],
        [g - cfg["gap_ms"] for r in ok for g in r[5]],
        "per gap (inter_chunk_latency)",
        [r[6] for r in sel],
        "aiperf",
    )


def _guidellm(bin_: Path, cfg: dict[str, Any], cpus: list[int] | None, tmp: Path) -> dict[str, Any]:
    out = tmp / f"guidellm-{cfg['streams']}-{time.monotonic_ns()}.json"
    n = cfg["streams"]
    data = tmp / "guidellm-prompts.jsonl"
    # GuideLLM sends each row once and stops when the data runs out: enough rows for the whole run
    per_stream = math.ceil(
        (cfg["warmup_s"] + cfg["measure_s"] + 30)
        * 1000
        / (cfg["ttft_ms"] + (cfg["tokens"] - 1) * cfg["gap_ms"])
    )
    data.write_text(
        "".join(
            json.dumps(
                {"prompt": f"hello {i}", "output_tokens_count": cfg["tokens"], "prompt_tokens_count": 8}
            )
            + "\n"
            for i in range(n * per_stream)
        )
    )
    cmd = pinned(
        [
            str(bin_),
            "run",
            "--backend",
            f"kind=openai_http,target={cfg['url']},model=bench",
            "--profile",
            f"kind=concurrent,streams={n}",
            "--data",
            f"kind=json_file,path={data}",
            "--constraint",
            f"kind=max_duration,seconds={cfg['warmup_s'] + cfg['measure_s']}",
            "--output",
            f"kind=json,path={out}",
            "--disable-console-interactive",
        ],
        cpus,
    )
    proc, samples = _run_monitored(cmd, {**os.environ, "HF_HUB_OFFLINE": "1"}, tmp, cfg["measure_s"] + 240)
    if not out.exists():
        return {
            "error": f"guidellm wrote no report (rc {proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}"
        }
    bench = (json.loads(out.read_text()).get("benchmarks") or [{}])[0]
    reqs = bench.get("requests") or {}
    rows = []
    for kind in ("successful", "errored", "incomplete"):
        for r in reqs.get(kind) or ():
            st, en = r.get("request_start_time"), r.get("request_end_time")
            if st is None:
                continue
            rows.append(
                (
                    st,
                    en or st,
                    int(r.get("output_tokens") or 0),
                    kind != "successful",
                    r.get("time_to_first_token_ms"),
                    r.get("inter_token_latency_ms"),
                    1000 * float(r.get("request_dispatch_delay") or 0.0),
                )
            )
    if not rows:
        return {"error": "guidellm recorded no requests"}
    ws = min(r[0] for r in rows) + cfg["warmup_s"]
    we = min(ws + cfg["measure_s"], max(r[1] for r in rows))
    held, done, tokens = _window_stats([(r[0], r[1], r[2]) for r in rows], ws, we)
    sel = [rows[i] for i in done]
    ok = [r for r in sel if not r[3]]
    return _peer_result(
        cfg,
        held,
        len(sel),
        len(sel) - len(ok),
        tokens,
        we - ws,
        _cpu_between(samples, ws, we),
        [r[4] - cfg["ttft_ms"] for r in ok if r[4] is not None],
        [r[5] - cfg["gap_ms"] for r in ok if r[5] is not None],
        "per-request mean",
        [r[6] for r in sel],
        "guidellm",
    )


# -- the run ---------------------------------------------------------------------------------------
def _run_tool(
    tool: str,
    n: int,
    ep: Endpoint,
    a: argparse.Namespace,
    client_cpus: list[int],
    tmp: Path,
    peers: dict[str, Path],
) -> dict[str, Any]:
    cfg = {
        "url": ep.url,
        "streams": n,
        "tokens": a.tokens,
        "gap_ms": a.gap_ms,
        "ttft_ms": a.ttft_ms,
        "warmup_s": a.warmup_s,
        "measure_s": a.measure_s,
    }
    one_core = client_cpus[:1] or None
    ep_cpu0 = sum(_proc_cpu_s(p) for p in ep.worker_pids())
    t0 = time.monotonic()
    if tool.startswith("vramlab"):
        workers = int(tool.split("-w")[1]) if "-w" in tool else 1
        cfg["workers"] = workers
        if tool == "vramlab-aiohttp":
            cfg["http_client"] = "aiohttp"
        if tool == "vramlab-trace":
            cfg["trace"] = str(TRACE)
        if a.profile and workers == 1 and n == a.profile_streams:
            cfg["profile"] = str(tmp / f"profile-{n}.txt")
        cpus = (
            one_core
            if workers == 1
            else (sorted(os.sched_getaffinity(0)) if len(client_cpus) < workers else client_cpus[:workers])
        )
        wire = a.wire and tool in ("vramlab", "vramlab-trace") and ep.kind == "nginx"
        if wire:
            cfg["dump"] = str(tmp / f"dump-{n}.json")
        cmd = pinned([sys.executable, __file__, "--client", "vramlab", json.dumps(cfg)], cpus)
        if wire:
            proc, pcap = _with_capture(cmd, ep, a, tmp / f"wire-{n}.pcap")
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.warmup_s + a.measure_s + 120)
        res = _parse(proc, tool)
        if wire and "error" not in res:
            res.update(_wire_check(Path(cfg["dump"]), pcap, a))
        res["cpus"] = ",".join(map(str, cpus or []))
        if "profile" in cfg and Path(cfg["profile"]).exists():
            res["profile"] = Path(cfg["profile"]).read_text()
    elif tool == "aiohttp-uvloop":
        proc = subprocess.run(
            pinned([sys.executable, __file__, "--client", "plain", json.dumps(cfg)], one_core),
            capture_output=True,
            text=True,
            timeout=a.warmup_s + a.measure_s + 120,
        )
        res = _parse(proc, tool)
    elif tool == "aiperf":
        res = _aiperf(peers["aiperf"], cfg, one_core, tmp)
    else:
        res = _guidellm(peers["guidellm"], cfg, one_core, tmp)
    wall = time.monotonic() - t0
    res["endpoint_cpu_pct"] = round(100 * (sum(_proc_cpu_s(p) for p in ep.worker_pids()) - ep_cpu0) / wall, 1)
    res["ideal_tokens_per_s"] = round(n * a.tokens / ((a.ttft_ms + (a.tokens - 1) * a.gap_ms) / 1000), 1)
    return res


def _with_capture(
    cmd: list[str], ep: Endpoint, a: argparse.Namespace, pcap: Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the client while tcpdump records ``--wire-s`` of the endpoint's data packets on lo, in the
    middle of the measured window (tcpdump on the endpoint's CPU, not the client's)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = ep.url.rsplit(":", 1)[1]
    # data packets from nginx only (a payload: IP length minus both headers), 2 KiB of each, ns stamps
    flt = f"tcp src port {port} and (ip[2:2] - ((ip[0]&0xf)<<2) - ((tcp[12]&0xf0)>>2)) != 0"
    time.sleep(1.0 + a.warmup_s + max(0.0, (a.measure_s - a.wire_s) / 2))  # (the client's start takes ~1 s)
    dump = subprocess.Popen(
        pinned(
            [
                a.tcpdump,
                "-i",
                "lo",
                "-n",
                "-s",
                "2048",
                "-B",
                "65536",
                "-U",
                "--time-stamp-precision=nano",
                "-w",
                str(pcap),
                flt,
            ],
            [ep.cpu] if ep.cpu is not None else None,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(a.wire_s)
    dump.send_signal(signal.SIGINT)  # our own tcpdump: it writes its buffer and exits
    try:
        dump.wait(timeout=10)
    except subprocess.TimeoutExpired:
        dump.kill()
        dump.wait()
    out, err = proc.communicate(timeout=a.warmup_s + a.measure_s + 120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), pcap


def _pcap_packets(path: Path) -> dict[int, list[tuple[float, int]]]:
    """Per client port: (wall time s, token events in the packet) of each data packet nginx sent."""
    import struct

    data = path.read_bytes() if path.exists() else b""
    out: dict[int, list[tuple[float, int]]] = {}
    if len(data) < 24:
        return out
    magic = struct.unpack_from("<I", data)[0]
    if magic not in (0xA1B23C4D, 0xA1B2C3D4):
        return out
    scale = 1e-9 if magic == 0xA1B23C4D else 1e-6
    link = struct.unpack_from("<I", data, 20)[0]
    l2 = 14 if link == 1 else (16 if link == 113 else 0)  # Ethernet (lo), Linux cooked
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack_from("<IIII", data, pos)
        pkt = data[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
        ip = pkt[l2:]
        if len(ip) < 20 or ip[0] >> 4 != 4:
            continue
        tcp = ip[(ip[0] & 0xF) * 4 :]
        if len(tcp) < 20:
            continue
        dport = struct.unpack_from(">H", tcp, 2)[0]
        payload = tcp[(tcp[12] >> 4) * 4 :]
        out.setdefault(dport, []).append((sec + frac * scale, payload.count(b'"content"')))
    return out


def _wire_check(dump: Path, pcap: Path, a: argparse.Namespace) -> dict[str, Any]:
    """vramlab's timed gaps against the same gaps on the wire. tcpdump stamps each packet as it leaves
    nginx on lo, independently of the client's process: for every gap vramlab timed whose two tokens
    are in the capture, the wire's gap between the packets that carried them; the difference is the
    client's timing error. The wire's own gaps minus --gap-ms are the endpoint's lateness."""
    import bisect

    wire = _pcap_packets(pcap)
    try:
        d = json.loads(dump.read_text())
        reqs, steps = d["requests"], d["steps"]
    except (OSError, ValueError, KeyError):
        return {"wire_error": "no client dump"}
    if not steps:
        return {"wire_error": "no clock record from the client"}
    marks = [a for a, _ in steps]

    def mono(w: float) -> float:  # a wall-clock stamp on perf_counter: the offset in force at the time
        i = len(steps) - 1
        while i > 0 and w - steps[i][1] < marks[i]:
            i -= 1
        return w - steps[i][1]

    # packets that carried a token, on the client's clock
    times = {p: [mono(t) for t, k in pk if k] for p, pk in wire.items()}
    if not any(times.values()):
        return {"wire_error": f"tcpdump captured no token packets ({pcap.name})"}
    lo = min(ts[0] for ts in times.values() if ts)
    hi = max(ts[-1] for ts in times.values() if ts)
    err: list[float] = []
    late: list[float] = []
    for port, ts, coalesced in reqs:
        w = times.get(port)
        if not w:
            continue
        bad = set(coalesced)
        for i in range(1, len(ts)):
            if i in bad or i - 1 in bad or ts[i - 1] < lo + 0.05 or ts[i] > hi - 0.001:
                continue
            # the packet that carried each token: the last one on this connection sent before the
            # client's receive stamp (plus 1 ms of slack for a stamp taken before the tap's)
            j1 = bisect.bisect_right(w, ts[i] + 0.001) - 1
            j0 = bisect.bisect_right(w, ts[i - 1] + 0.001) - 1
            if j0 < 0 or j1 <= j0:
                continue
            wire_gap = w[j1] - w[j0]
            err.append((ts[i] - ts[i - 1] - wire_gap) * 1000)
            late.append(wire_gap * 1000 - a.gap_ms)
    return {
        "wire_gaps": len(err),
        "wire_err_p50_ms": _pct(err, 0.5),
        "wire_err_p99_ms": _pct(err, 0.99),
        "wire_abs_err_p99_ms": _pct([abs(x) for x in err], 0.99),
        "server_late_p50_ms": _pct(late, 0.5),
        "server_late_p99_ms": _pct(late, 0.99),
        "wire_packets": sum(len(v) for v in wire.values()),
        "wire_s": round(hi - lo, 3),
        "wall_clock_steps": sum(1 for a, _ in steps if lo <= a <= hi),
    }


def _parse(proc: subprocess.CompletedProcess[str], tool: str) -> dict[str, Any]:
    if proc.returncode != 0:
        return {"error": f"{tool} failed (rc {proc.returncode}): {proc.stderr[-800:]}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _fmt(v: Any, f: str) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, f)


def _table(results: dict[str, dict[int, dict[str, Any]]], a: argparse.Namespace) -> list[str]:
    lines = [
        f"{'tool':<16} {'client':<9} {'streams':>7} {'held':>7} {'tokens/s':>9} {'ideal %':>7} {'CPU-ms/req':>10} "
        f"{'TTFT err P50/P99 ms':>20} {'ITL err P50/P99 ms':>19} {'ITL kind':<18} {'untimed gaps':>14} "
        f"{'ep CPU %':>8} {'err':>5} {'wait P99':>8}"
    ]
    for tool, by_n in results.items():
        for n, r in sorted(by_n.items()):
            if "error" in r:
                lines.append(f"{tool:<16} {n:>7} error: {r['error'][:300]}")
                continue
            ideal = 100 * r["tokens_per_s"] / r["ideal_tokens_per_s"] if r.get("ideal_tokens_per_s") else None
            ttft = f"{_fmt(r.get('ttft_err_p50_ms'), '.2f')} / {_fmt(r.get('ttft_err_p99_ms'), '.2f')}"
            itl = f"{_fmt(r.get('itl_err_p50_ms'), '.2f')} / {_fmt(r.get('itl_err_p99_ms'), '.2f')}"
            untimed = "-"
            if r.get("gaps"):
                untimed = f"{r['untimed_gaps']} ({100 * r['untimed_gaps'] / r['gaps']:.1f}%)"
            client = r.get("client", "-" if tool in ("aiperf", "guidellm") else "")
            lines.append(
                f"{tool:<16} {client:<9} {n:>7} {_fmt(r.get('streams_held'), '.0f'):>7} "
                f"{_fmt(r.get('tokens_per_s'), '.0f'):>9} {_fmt(ideal, '.0f'):>7} "
                f"{_fmt(r.get('cpu_ms_per_req'), '.2f'):>10} {ttft:>20} {itl:>19} "
                f"{r.get('itl_kind', ''):<18.18} {untimed:>14} {_fmt(r.get('endpoint_cpu_pct'), '.0f'):>8} "
                f"{r.get('errors', 0):>5} {_fmt(r.get('send_wait_p99_ms'), '.1f'):>8}"
            )
    return lines


def _machine() -> list[str]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    busy = (
        " (above the CPU count: the machine was shared and busy; every figure below is noisier for it)"
        if load[0] > (os.cpu_count() or 1)
        else ""
    )
    return [
        f"machine: {platform.node()}, {os.cpu_count()} CPUs ({model}), python {platform.python_version()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start{busy}"
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        client_main(argv[1], json.loads(argv[2]))
        return 0
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny and bounded: 20 streams, 1 s, vramlab and the plain loop only (correctness, not speed)",
    )
    p.add_argument("--streams", default="100,500,1000,2000")
    p.add_argument("--tokens", type=int, default=32, help="token chunks per stream")
    p.add_argument("--gap-ms", type=float, default=20.0, help="the schedule's inter-token gap")
    p.add_argument("--ttft-ms", type=float, default=20.0, help="the schedule's time to first token")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--measure-s", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=2, help="also run vramlab over this many worker processes")
    p.add_argument(
        "--tools", default="vramlab,vramlab-w,vramlab-trace,vramlab-aiohttp,aiohttp-uvloop,aiperf,guidellm"
    )
    p.add_argument("--peers", type=Path, help="folder with one venv per peer: PEERS/aiperf, PEERS/guidellm")
    p.add_argument("--server", choices=["auto", "nginx", "stub"], default="auto")
    p.add_argument(
        "--profile", action="store_true", help="cProfile vramlab's client (1 worker) at --profile-streams"
    )
    p.add_argument("--profile-streams", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print every run's raw result as JSON too")
    p.add_argument(
        "--wire",
        choices=["auto", "on", "off"],
        default="auto",
        help="check vramlab's timed gaps against a tcpdump of the endpoint's packets on lo "
        "(auto: when tcpdump is installed and may capture)",
    )
    p.add_argument("--wire-s", type=float, default=2.0, help="seconds of the measured window captured")
    p.add_argument("-o", "--output", help="also write the report to this file")
    a = p.parse_args(argv)
    if a.quick:
        # a second of warm-up: on a loaded two-core machine a tool that starts slowly (worker processes)
        # once had no request end inside a 1 s window that opened 0.5 s after it started
        a.streams, a.tokens, a.gap_ms, a.ttft_ms, a.warmup_s, a.measure_s = "20", 8, 20.0, 20.0, 1.0, 1.0
        a.tools, a.profile_streams = "vramlab,vramlab-w,vramlab-trace,vramlab-aiohttp,aiohttp-uvloop", 20
    streams = [int(s) for s in a.streams.split(",") if s.strip()]
    a.tcpdump = shutil.which("tcpdump") or (
        "/usr/bin/tcpdump" if os.path.exists("/usr/bin/tcpdump") else None
    )
    if a.wire == "on" and not a.tcpdump:
        p.error("--wire on: tcpdump is not installed (apt-get install -y tcpdump)")
    a.wire = (
        a.wire != "off" and a.tcpdump is not None and (a.wire == "on" or os.geteuid() == 0) and not a.quick
    )
    tools = [
        t.strip().replace("vramlab-w", f"vramlab-w{a.workers}") if t.strip() == "vramlab-w" else t.strip()
        for t in a.tools.split(",")
        if t.strip()
    ]
    notes: list[str] = []
    peers: dict[str, Path] = {}
    for peer in ("aiperf", "guidellm"):
        if peer in tools:
            b = _peer_bin(a.peers, peer)
            if b is None:
                tools.remove(peer)
                notes.append(
                    f"{peer} not found (a venv at benchmarks/.venvs/{peer} or --peers): no {peer} rows"
                )
            else:
                peers[peer] = b
    notes.append(
        "inference-perf: not run: every release on PyPI needs Python >= 3.12 (this is "
        f"{platform.python_version()})"
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the endpoint is stopped on the way out
    client_cpus, server_cpu = _cpus()
    head = _machine()
    results: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tools}
    with (
        tempfile.TemporaryDirectory(prefix="vramlab-tokens-") as td,
        Endpoint(a.server, a, server_cpu, Path(td)) as ep,
    ):
        for n in streams:
            for tool in tools:  # interleaved per stream count: a noisy neighbour hits every tool alike
                res = _run_tool(tool, n, ep, a, client_cpus, Path(td), peers)
                results[tool][n] = res
                print(
                    f"{n:>5} streams {tool:<16} {json.dumps({k: v for k, v in res.items() if k != 'profile'})}",
                    file=sys.stderr,
                    flush=True,
                )
    head += [
        f"endpoint: {ep.kind} ({ep.version}) on 127.0.0.1, pinned to CPU {server_cpu}; single-core clients "
        f"pinned to CPU {client_cpus[0] if client_cpus else '-'}; vramlab-w{a.workers}: {a.workers} worker "
        "processes on every CPU (with the endpoint on this machine)",
        f"schedule: first token {a.ttft_ms:g} ms after the request, then {a.tokens - 1} more {a.gap_ms:g} ms "
        f"apart; each tool holds N streams (closed loop), {a.warmup_s:g} s warm-up + {a.measure_s:g} s measured",
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end",
        "",
    ]
    lines = (
        head
        + _table(results, a)
        + [
            "wait P99: how long a request waited between the tool issuing it and sending it (AIPerf: credit issued ->"
            " request start; GuideLLM: request_dispatch_delay), which their TTFT leaves out; vramlab's closed loop "
            "sends at once and counts any wait in its from-scheduled latencies",
            "",
            "how each tool defines ITL:",
        ]
    )
    lines += [f"  {t}: {ITL_DEFINITIONS[t if t in ITL_DEFINITIONS else 'vramlab']}" for t in tools]
    lines += [
        "untimed gaps: gaps between two token chunks where one of them came in the same read as later bytes, "
        "so when it arrived is unknown (of all gaps of the completed requests). vramlab leaves them out of its "
        "ITL (RequestResult.coalesced) and says how many; the plain loop stamps every token in a read with the "
        "read's time and keeps those gaps in its ITL (counted here, not excluded); AIPerf and GuideLLM do not "
        "say (-). client: fasthttp = vramlab's own HTTP/1.1 client (kernel receive stamps, SO_TIMESTAMPNS), "
        "aiohttp = aiohttp's ClientSession (user-space stamps at read time)"
    ]
    wired = [
        (f"{n:>5} streams{' (trace)' if tool == 'vramlab-trace' else ''}", r)
        for tool in ("vramlab", "vramlab-trace")
        for n, r in sorted(results.get(tool, {}).items())
        if "wire_gaps" in r or "wire_error" in r
    ]
    if wired:
        lines += [
            "",
            f"wire check (vramlab, 1 process; and under trace replay): tcpdump on lo stamps every packet nginx sends, apart from the "
            f"client's process, for {a.wire_s:g} s mid-window; for each gap vramlab timed in it, the client's gap "
            "minus the wire's gap between the packets that carried the two tokens (the client's own timing "
            "error), and the wire's gap minus the schedule's (the endpoint's lateness, which the ITL err "
            "column above includes)",
        ]
        for n, r in wired:
            if "wire_error" in r:
                lines.append(f"  {n}: {r['wire_error']}")
                continue
            lines.append(
                f"  {n}: {r['wire_gaps']} gaps compared; client - wire P50 "
                f"{_fmt(r['wire_err_p50_ms'], '.3f')} / P99 {_fmt(r['wire_err_p99_ms'], '.3f')} ms, |error| P99 "
                f"{_fmt(r['wire_abs_err_p99_ms'], '.3f')} ms; endpoint late by P50 "
                f"{_fmt(r['server_late_p50_ms'], '.2f')} / P99 {_fmt(r['server_late_p99_ms'], '.2f')} ms per gap"
            )
    lines += [f"note: {n}" for n in notes]
    for tool, by_n in results.items():
        for n, r in by_n.items():
            if r.get("profile"):
                lines += [
                    "",
                    f"profile: {tool} at {n} streams (cProfile, by own time; cProfile slows it down)",
                    *r["profile"].strip().splitlines()[:45],
                ]
    text = "\n".join(lines)
    print(text)
    if a.json:
        print(
            json.dumps(
                {
                    t: {str(n): {k: v for k, v in r.items() if k != "profile"} for n, r in by_n.items()}
                    for t, by_n in results.items()
                },
                indent=1,
            )
        )
    if a.output:
        Path(a.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
