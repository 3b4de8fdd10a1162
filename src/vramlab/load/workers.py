"""Load over several worker processes: one schedule, one writer, merged results.

A single Python event loop times tokens right only while it has CPU to spare: past about one core's
worth of streams, a token that arrived waits for the loop, and that wait would be reported as the
server's inter-token latency. ``WorkerPool`` runs the same driver (``drive``) in N processes, each
with its own event loop and connection pool, and merges what they measure in the parent:

- **one schedule**: every worker computes the window's one arrival sequence from the same seed and
  takes arrivals k with k mod N == its index (closed loop: users u with u mod N == index), each with
  its scheduled time from that one sequence; the schedule starts at one ``start_at`` instant, sent
  by the parent, on ``time.perf_counter`` (the system's monotonic clock, the same in every process
  on Linux), so dispatch lag and latency-from-schedule mean the same in every worker;
- **one writer**: workers send their results to the parent in batches (a sender thread, so a busy
  parent never blocks a worker's loop); the parent hands them to ``on_result``, where the runner
  builds the records and the one store writer stores them;
- **the self-check**: each worker reports its own dispatch lag and event-loop lag per window, so a
  saturated worker is named instead of its lag being read as the server's latency;
- **stop**: the parent's stop reaches every worker at once, twice over: a byte in memory shared
  with all of them, which every send loop reads before each request (a worker whose event loop is
  busy sending sees it at its next request, not after its loop gets round to a message), and a
  message that wakes each worker's loop to cancel what is in flight (recorded as cancelled).
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
import queue
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vramlab.load.client import Api, HttpClient, RequestResult
from vramlab.load.driver import LoadShape, Window, WindowOutcome, drive, shard_share
from vramlab.load.prompts import Prompt, cycle, input_set_key
from vramlab.load.retry import RetryPolicy

# Where one client core stops timing tokens right, roughly, for streams of 50 tokens/s each (32
# tokens 20 ms apart): benchmarks/loadgen.py measured vramlab's per-gap ITL P99 error at +48-67 ms with 500
# such streams and its core saturated at 1,000; benchmarks/tokens.py measures it again
# (benchmarks/results/tokens.txt). A plan past either bound gets one worker per core.
STREAMS_PER_CORE = 1000
REQUESTS_PER_S_PER_CORE = 3000.0
BATCH_S = 0.1  # how often a worker ships its results to the parent
START_LEAD_S = 0.25  # the schedule starts this long after the parent sends the window (each worker
# collects garbage and freezes what survives first, tens of ms on a busy machine: see drive())


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    model: str
    api: Api = "openai-chat"
    api_key: str | None = None
    max_connections: int = 256
    timeout_s: float = 60.0
    ignore_eos: bool = False
    http_client: HttpClient = "auto"


@dataclass(frozen=True)
class WorkerReport:
    """One worker's view of one window: who it is and how far it fell behind."""

    worker: int
    pid: int
    outcome: WindowOutcome


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def workers_needed(peak_streams: int, peak_rate: float | None) -> int:
    """One per core when the plan needs more than a core, else 1 (in-process)."""
    need = max(peak_streams / STREAMS_PER_CORE, (peak_rate or 0.0) / REQUESTS_PER_S_PER_CORE)
    if need <= 1.0:
        return 1
    return max(1, min(usable_cores(), math.ceil(need)))


def event_loop_runner() -> Any:
    """uvloop where it is installed (about 1.4x the request rate per core), else asyncio."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        import asyncio

        return asyncio.run


# -- the pipes -------------------------------------------------------------------------------------
# One pipe each way per worker. The end an event loop reads is watched with add_reader and read
# with os.read into a buffer, whole frames (8-byte length + pickle) taken off as they complete: an
# event loop may set its fds non-blocking, and a batch larger than the pipe's buffer arrives in
# parts, so Connection.recv_bytes (which expects to block) is not used on it. The writing ends are
# plain blocking writes (the parent's commands are small; a worker writes from its sender thread).
_HEAD = struct.Struct("!Q")


def _frame(msg: Any) -> bytes:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]


class _Reader:
    """Frames off a pipe, as they complete."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, bytearray()

    def read(self) -> list[Any] | None:
        """The messages complete so far; None when the other end is gone."""
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not chunk:
            return None
        self.buf += chunk
        out = []
        while len(self.buf) >= _HEAD.size:
            (n,) = _HEAD.unpack_from(self.buf)
            if len(self.buf) < _HEAD.size + n:
                break
            out.append(pickle.loads(bytes(self.buf[_HEAD.size : _HEAD.size + n])))
            del self.buf[: _HEAD.size + n]
        return out


# -- the worker process ---------------------------------------------------------------------------
class _SharedStop(asyncio.Event):
    """A worker's stop flag for one window: set by the parent's message, or seen first in the byte
    the parent shares with every worker (``drive`` asks ``is_set()`` before every request)."""

    def __init__(self, shared: Any) -> None:
        super().__init__()
        self._shared = shared

    def is_set(self) -> bool:
        if super().is_set():
            return True
        if self._shared.value:
            self.set()  # wakes drive's waiter: what is in flight is cancelled now
            return True
        return False


def _worker_main(index: int, count: int, conn: Any, cfg: ClientConfig, shared_stop: Any = None) -> None:
    # Ctrl-C and SIGTERM reach the whole process group; the parent decides (it stops the window,
    # and the worker records its in-flight requests as cancelled). A parent that is gone closes
    # the command pipe, and the worker exits on that.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    event_loop_runner()(_serve(index, count, conn, cfg, shared_stop))


async def _serve(index: int, count: int, conn: Any, cfg: ClientConfig, shared_stop: Any = None) -> None:
    from vramlab.load.client import OpenAIClient

    cmd_r, res_w = conn  # (read end of the parent's commands, write end of the results)
    loop = asyncio.get_running_loop()
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def sender() -> None:  # blocking pipe writes off the event loop
        while True:
            data = outbox.get()
            if data is None:
                return
            try:
                _write_all(res_w.fileno(), data)
            except OSError:
                return

    thread = threading.Thread(target=sender, name="vramlab-worker-sender", daemon=True)
    thread.start()

    def post(msg: tuple[Any, ...]) -> None:
        outbox.put(_frame(msg))

    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    stop = _SharedStop(shared_stop) if shared_stop is not None else asyncio.Event()

    reader = _Reader(cmd_r.fileno())

    def on_readable() -> None:
        msgs = reader.read()
        if msgs is None:  # the parent is gone
            stop.set()
            inbox.put_nowait(("exit",))
            loop.remove_reader(cmd_r.fileno())
            return
        for msg in msgs:
            if msg[0] == "stop":
                stop.set()  # obeyed by the running window before its next request
            else:
                inbox.put_nowait(msg)

    loop.add_reader(cmd_r.fileno(), on_readable)
    prompts: dict[Any, list[Prompt]] = {}
    async with OpenAIClient(
        cfg.base_url,
        cfg.model,
        cfg.api,
        cfg.api_key,
        max_connections=cfg.max_connections,
        timeout_s=cfg.timeout_s,
        ignore_eos=cfg.ignore_eos,
        http_client=cfg.http_client,
    ) as client:
        post(("ready", index, os.getpid()))
        while True:
            msg = await inbox.get()
            if msg[0] == "exit":
                break
            _, key, plist, shape, window, retry, id_prefix, start_at = msg
            if plist is not None:
                prompts[key] = plist
            stop.clear()
            batch: list[RequestResult] = []
            flush_at = [time.perf_counter() + BATCH_S]

            def on_result(
                res: RequestResult, batch: list[RequestResult] = batch, flush_at: list[float] = flush_at
            ) -> None:
                batch.append(res)
                if res.end_at >= flush_at[0]:
                    post(("results", batch[:]))
                    batch.clear()
                    flush_at[0] = res.end_at + BATCH_S

            try:
                outcome = await drive(
                    client,
                    cycle(prompts[key]),
                    shape,
                    window,
                    on_result,
                    retry,
                    id_prefix=id_prefix,
                    stop=stop,
                    shard=(index, count),
                    start_at=start_at,
                )
                err = None
            except Exception as exc:  # a bug: the parent fails the run with it
                outcome, err = None, f"{type(exc).__name__}: {exc}"
            if batch:
                post(("results", batch[:]))
                batch.clear()
            post(("done", index, os.getpid(), outcome, err))
    try:
        loop.remove_reader(cmd_r.fileno())
    except (OSError, ValueError):
        pass
    outbox.put(None)
    thread.join(timeout=5)


# -- the parent -----------------------------------------------------------------------------------
class WorkerPool:
    """``async with WorkerPool(n, cfg) as pool: await pool.drive(...)``: the same contract as
    ``drive`` (results through ``on_result``, one merged WindowOutcome), over n processes."""

    def __init__(self, count: int, cfg: ClientConfig, start_timeout_s: float = 60.0) -> None:
        if count < 2:
            raise ValueError("a worker pool needs at least 2 workers (1 runs in-process)")
        self.count, self.cfg, self.start_timeout_s = count, cfg, start_timeout_s
        self.pids: list[int] = []
        self.reports: list[WorkerReport] = []  # the last window's, one per worker
        self._procs: list[Any] = []
        self._conns: list[Any] = []  # per worker: (command write end, result read end)
        self._readers: list[_Reader] = []
        self._sent_keys: set[Any] = set()
        self._handler: Callable[[tuple[Any, ...]], None] = lambda msg: None
        self._dead: str | None = None
        self._stop_flag: Any = None  # one byte shared with every worker: 1 = the window is stopped

    async def __aenter__(self) -> WorkerPool:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a clean interpreter: no inherited event loop, threads or sockets
        per_worker = ClientConfig(
            **{
                **self.cfg.__dict__,
                "max_connections": max(1, math.ceil(self.cfg.max_connections / self.count)),
            }
        )
        loop = asyncio.get_running_loop()
        ready: dict[int, int] = {}
        all_ready = loop.create_future()
        self._stop_flag = ctx.RawValue("b", 0)  # no lock: one writer (here), readers poll a byte

        def on_start(msg: tuple[Any, ...]) -> None:
            if msg[0] == "ready":
                ready[msg[1]] = msg[2]
                if len(ready) == self.count and not all_ready.done():
                    all_ready.set_result(None)

        self._handler = on_start
        try:
            for i in range(self.count):
                cmd_r, cmd_w = ctx.Pipe(duplex=False)
                res_r, res_w = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_worker_main,
                    args=(i, self.count, (cmd_r, res_w), per_worker, self._stop_flag),
                    name=f"vramlab-load-{i}",
                    daemon=True,
                )
                p.start()
                cmd_r.close()
                res_w.close()
                self._procs.append(p)
                self._conns.append((cmd_w, res_r))
                self._readers.append(_Reader(res_r.fileno()))
                loop.add_reader(res_r.fileno(), self._readable, i)
            await asyncio.wait_for(all_ready, timeout=self.start_timeout_s)
        except BaseException:
            await self.__aexit__()
            raise
        self.pids = [ready[i] for i in range(self.count)]
        return self

    def _readable(self, i: int) -> None:
        msgs = self._readers[i].read()
        if msgs is None:
            asyncio.get_running_loop().remove_reader(self._readers[i].fd)
            self._procs[i].join(timeout=0.5)
            self._dead = f"load worker {i} (pid {self._procs[i].pid}) exited (code {self._procs[i].exitcode})"
            self._handler(("dead", i))
            return
        for msg in msgs:
            self._handler(msg)

    def _send(self, msg: tuple[Any, ...]) -> None:
        data = _frame(msg)
        for cmd_w, _ in self._conns:
            try:
                _write_all(cmd_w.fileno(), data)
            except OSError:
                pass

    def stop(self) -> None:
        """Every worker sends nothing more and cancels its in-flight requests, now: the shared byte
        stops their send loops at their next request, the message wakes their loops to cancel."""
        if self._stop_flag is not None:
            self._stop_flag.value = 1
        self._send(("stop",))

    async def drive(
        self,
        prompts: list[Prompt],
        shape: LoadShape,
        window: Window,
        on_result: Callable[[RequestResult], None],
        retry: RetryPolicy = RetryPolicy(),
        id_prefix: str = "r",
        stop: asyncio.Event | None = None,
    ) -> WindowOutcome:
        if self._dead is not None:
            raise RuntimeError(self._dead)
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        reports: dict[int, WorkerReport] = {}
        errors: list[str] = []

        def handle(msg: tuple[Any, ...]) -> None:
            kind = msg[0]
            if kind == "results":
                for res in msg[1]:
                    on_result(res)
            elif kind == "done":
                _, idx, pid, outcome, err = msg
                if err is not None:
                    errors.append(f"load worker {idx} (pid {pid}): {err}")
                else:
                    reports[idx] = WorkerReport(idx, pid, outcome)
                if len(reports) + len(errors) == self.count and not finished.done():
                    finished.set_result(None)
            elif kind == "dead" and not finished.done():
                finished.set_exception(RuntimeError(self._dead or "a load worker exited"))

        self._handler = handle
        key = input_set_key(prompts)  # by content: a list's id() is reused once it is freed
        plist = None if key in self._sent_keys else prompts
        self._sent_keys.add(key)
        start_at = time.perf_counter() + START_LEAD_S
        if self._stop_flag is not None:
            self._stop_flag.value = 0  # the last window's stop is over (every worker reported done)
        for i, (cmd_w, _) in enumerate(self._conns):
            # Open loop: each worker's in-flight cap is its share of the plan's (they sum to it).
            # Closed loop: drive shares the users out itself.
            job_shape = (
                shape
                if shape.mode == "closed"
                else replace(shape, concurrency=max(1, shard_share(shape.concurrency, (i, self.count))))
            )
            _write_all(
                cmd_w.fileno(), _frame(("window", key, plist, job_shape, window, retry, id_prefix, start_at))
            )
        stop_wait = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waiters: set[asyncio.Future[Any]] = {finished} | ({stop_wait} if stop_wait else set())
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not finished.done():
                self.stop()
                await asyncio.wait_for(asyncio.shield(finished), timeout=window.drain_s + 10)
            finished.result()
        except asyncio.CancelledError:
            # Ctrl-C: the workers record their in-flight requests as cancelled; wait for them briefly.
            self.stop()
            try:
                await asyncio.wait_for(asyncio.shield(finished), timeout=5)
            except BaseException:
                pass
            raise
        finally:
            if stop_wait is not None:
                stop_wait.cancel()
        if errors:
            raise RuntimeError("; ".join(errors))
        self.reports = [reports[i] for i in sorted(reports)]
        outs = [r.outcome for r in self.reports]
        return WindowOutcome(
            sent=sum(o.sent for o in outs),
            elapsed_s=max(o.elapsed_s for o in outs),
            lag_p99_ms=max(o.lag_p99_ms for o in outs),
            lag_max_ms=max(o.lag_max_ms for o in outs),
            loop_lag_p99_ms=max(o.loop_lag_p99_ms for o in outs),
            loop_lag_max_ms=max(o.loop_lag_max_ms for o in outs),
            stopped=any(o.stopped for o in outs),
        )

    async def __aexit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        self._send(("exit",))
        for r in self._readers:
            try:
                loop.remove_reader(r.fd)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5
        for p in self._procs:
            while p.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if p.is_alive():
                p.kill()  # our own child, by its handle (it ignores SIGTERM: see _worker_main)
                p.join(timeout=2)
        for cmd_w, res_r in self._conns:
            cmd_w.close()
            res_r.close()
        self._procs, self._conns, self._readers = [], [], []
