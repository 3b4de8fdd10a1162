"""Drive one observation window of load: an open loop (arrivals with a concurrency cap) or a
closed loop (N users), bounded by a request count and by time, always.

Open loop is "sleep, then gate": each request has a scheduled send time from the arrival process;
when the cap is full it waits for a slot and is sent late (never skipped; the schedule does not shift), and its
latency still counts from the scheduled time (AIPerf's request-rate-with-max-concurrency). The
wait is the request's dispatch lag. Cancelling the window (a stop condition, Ctrl-C) reports every
in-flight request as ``cancelled`` before the cancellation propagates: nothing sent goes unrecorded.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from vramlab.load.alarm import Alarm
from vramlab.load.arrivals import Arrival, gaps, schedule_gaps
from vramlab.load.client import RequestResult
from vramlab.load.eager import eager_task
from vramlab.load.prompts import Prompt
from vramlab.load.retry import RetryPolicy
from vramlab.records.stats import percentile


class Sender(Protocol):
    async def send(
        self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float, attempt: int = 0
    ) -> RequestResult: ...


@dataclass(frozen=True)
class LoadShape:
    mode: Literal["closed", "open"] = "closed"
    concurrency: int = 1  # closed: users; open: the in-flight cap
    request_rate: float | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_tokens: int | None = None  # overrides each prompt's own output length
    error_backoff: bool = True  # closed loop: a user whose connection failed waits (the plan's back-off)
    think_s: float = (
        0.0  # closed loop: a user pauses this long after a successful request (a drill's think_time_s)
    )
    # closed loop: the longest a refused user waits; a drill's recovery phase caps it at its probe
    # resolution, so "serving again" is timed within that, not within the back-off's 10 s cap
    error_backoff_max_s: float | None = None
    # open loop: the send times themselves (a trace's, load/trace.py), in seconds from the window's
    # start, instead of an arrival process; the loop ends after the last one
    schedule: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Window:
    duration_s: float | None = None
    requests: int | None = None
    max_s: float = 3600.0  # the hard time bound when the window is counted in requests
    drain_s: float = 5.0


@dataclass(frozen=True)
class WindowOutcome:
    sent: int
    elapsed_s: float
    lag_p99_ms: float  # dispatch lag: how late requests went out against the schedule
    lag_max_ms: float
    loop_lag_p99_ms: float = 0.0  # the self-check: how late the event loop woke for a 20 ms timer
    loop_lag_max_ms: float = 0.0
    stopped: bool = False  # the stop flag ended the window


LOOP_TICK_S = 0.02


def _settle_gc() -> None:
    """Collect once, then freeze what survives, before a window starts.

    A full (gen-2) collection walks every tracked object, the imported libraries included: on the
    2-core benchmark machine that was a 15-40 ms stall in the middle of a window, and every request
    scheduled during it was sent late (the benchmark's P99 from the schedule). Frozen objects are
    never walked again, so the collections inside the window see only the window's own objects.
    What is frozen is alive already (the collect first keeps garbage out of it), and it is unfrozen
    when the window ends, so nothing is kept for good.
    """
    global _settled
    _settled += 1
    if _settled > 1:  # another lane of this window (a drill's users) settled it already
        return
    gc.collect()
    gc.freeze()


def _unsettle_gc() -> None:
    """The window's last lane ends: unfreeze, so what dies later is still collected."""
    global _settled
    _settled = max(0, _settled - 1)
    if not _settled:
        gc.unfreeze()


_settled = 0  # lanes running in a settled (frozen) heap; gc.get_freeze_count() walks the heap to say


_TICKING: set[int] = set()  # the event loops (by id) that run a lag timer already


async def _loop_lag(samples: list[float]) -> None:
    """The load generator's self-check: a timer that should fire every LOOP_TICK_S; how late it
    fires is how long a token that arrived meanwhile waited to be timed (the client's own lag).
    One timer per event loop: the lanes of one window (a drill's thousands of users) share the
    first lane's, whose outcome is the window's; thousands of timers were the lag they measured."""
    loop = id(asyncio.get_running_loop())
    if loop in _TICKING:
        await asyncio.Event().wait()  # until the lane ends and cancels it
    _TICKING.add(loop)
    pc, sleep = time.perf_counter, asyncio.sleep
    try:
        while True:
            t = pc()
            await sleep(LOOP_TICK_S)
            samples.append((pc() - t - LOOP_TICK_S) * 1000)
    finally:
        _TICKING.discard(loop)


def shard_share(total: int, shard: tuple[int, int]) -> int:
    """Worker ``shard[0]`` of ``shard[1]``'s part of ``total`` (users, a cap, a request count)."""
    i, n = shard
    return total // n + (1 if i < total % n else 0)


def _cancelled(rid: str, attempt: int, scheduled: float, sent: float, prompt: Prompt) -> RequestResult:
    """A request in flight when its window was cancelled: recorded, never dropped."""
    return RequestResult(
        request_id=rid,
        attempt=attempt,
        scheduled_at=scheduled,
        sent_at=sent,
        end_at=time.perf_counter(),
        error_class="cancelled",
        error="the window was cancelled",
        prompt_tokens=prompt.prompt_tokens,
        prompt_tokens_source=prompt.tokens_source,
        conversation=prompt.conversation,
        turn=prompt.turn,
        tenant=prompt.tenant,
    )


async def drive(
    sender: Sender,
    prompts: Iterator[Prompt],
    shape: LoadShape,
    window: Window,
    on_result: Callable[[RequestResult], None],
    retry: RetryPolicy = RetryPolicy(),
    id_prefix: str = "r",
    stop: asyncio.Event | None = None,
    shard: tuple[int, int] = (0, 1),
    start_at: float | None = None,
    end: asyncio.Event | None = None,
    end_drain_s: float | None = None,
) -> WindowOutcome:
    """Run one window. ``stop``: once set, no loop sends another request and the in-flight ones are
    cancelled (recorded as such) at once. ``shard``: (i, n), this process's part of a load split
    over n worker processes: the one schedule (arrival k goes to worker k mod n, with its global
    scheduled time), users and caps shared out; ``start_at``: the perf_counter time the schedule
    starts (the same in every worker; perf_counter is the system's monotonic clock). ``end``: once
    set, the window is over as at its deadline: nothing new is sent, and the requests in flight
    get ``end_drain_s`` (default the window's drain) to finish or time out, each recorded as what
    it was (a drill moving on from a hung target does not turn them into "cancelled")."""
    _settle_gc()
    pc = time.perf_counter
    if start_at is not None and start_at > pc():
        await asyncio.sleep(start_at - pc())
    start = start_at if start_at is not None else pc()
    run = _Drive(sender, prompts, shape, window, on_result, retry, id_prefix, stop, shard, start, end)
    try:
        await run.window(end_drain_s)
    finally:
        await run.close()
        _unsettle_gc()  # frozen only for the window: what dies later is still collected
    return run.outcome()


@dataclass(frozen=True)
class _Talk:
    """A conversation a closed-loop user walks (load/conversations.py): its opening prompt, the
    turn to send next and everything said before it."""

    first: Prompt
    turn: int
    history: tuple[tuple[str, str], ...]

    def prompt(self) -> Prompt:
        from vramlab.load.conversations import next_turn

        return next_turn(self.first, self.history, self.turn)

    def pause_s(self) -> float:
        """The tool call before this turn."""
        pauses = self.first.pauses_s
        return pauses[self.turn - 2] if self.turn - 2 < len(pauses) else 0.0

    @staticmethod
    def after(talk: _Talk | None, sent: Prompt, answer: list[str], failed: str | None) -> _Talk | None:
        """The next turn after *sent*; None when the conversation is over (its last turn, or a turn
        that failed: the user gives it up) or *sent* was not a conversation's."""
        first = talk.first if talk is not None else sent
        turn = sent.turn or 1
        if failed or not answer or sent.conversation is None or turn > len(first.follow_ups):
            return None
        return _Talk(first, turn + 1, (*sent.history, ("user", sent.text), ("assistant", answer[0])))


class _Drive:
    """One window's load: its schedule (open loop) or users (closed loop), the requests in flight
    and what the window measured of itself."""

    def __init__(
        self,
        sender: Sender,
        prompts: Iterator[Prompt],
        shape: LoadShape,
        window: Window,
        on_result: Callable[[RequestResult], None],
        retry: RetryPolicy,
        id_prefix: str,
        stop: asyncio.Event | None,
        shard: tuple[int, int],
        start: float,
        end: asyncio.Event | None,
    ) -> None:
        self.sender, self.prompts, self.shape, self.on_result = sender, prompts, shape, on_result
        self.retry, self.id_prefix, self.shard, self.start = retry, id_prefix, shard, start
        self.drain_s = window.drain_s
        span = window.duration_s if window.duration_s is not None else window.max_s
        self.deadline = start + min(span, window.max_s)
        self.limit = window.requests if window.requests is not None else 2**62
        self.stop = stop if stop is not None else asyncio.Event()
        self.end = end
        self.lags: list[float] = []
        self.loop_lags: list[float] = []
        self.rng = random.Random(shape.seed * 7919 + shard[0])
        self.inflight: set[asyncio.Future[Any]] = set()
        self.sent = 0
        self.unsent = 0  # open loop: spawned, then the stop came before their turn: never sent, not counted
        self.counter = 0  # closed loop: requests the users took
        self.owed = 0  # closed loop: turns the conversations in progress still have to send
        self.my_limit = shard_share(self.limit, shard) if self.limit < 2**62 else self.limit
        self.body: asyncio.Future[None] | None = None
        self.ticker = asyncio.ensure_future(_loop_lag(self.loop_lags))
        self.stop_wait = asyncio.ensure_future(self.stop.wait())
        self.end_wait = asyncio.ensure_future((end or asyncio.Event()).wait())

    def _ended(self) -> bool:
        return self.end is not None and self.end.is_set()

    async def one(
        self, rid: str, prompt: Prompt, scheduled: float, answer: list[str] | None = None
    ) -> str | None:
        """Send, retrying as the policy says; the last attempt's error class ("" when it succeeded,
        None when the stop came before it was sent: nothing went out, nothing is recorded).
        *answer*: gets a successful answer's text (a conversation's next turn sends it back)."""
        pc, stop, retry = time.perf_counter, self.stop, self.retry
        max_tokens = self.shape.max_tokens or prompt.output_tokens
        attempt = 0
        if stop.is_set():  # (a worker's flag turns set between two requests: see load/workers.py)
            self.unsent += 1
            return None
        while True:
            t_sent = pc()
            try:
                res = await self.sender.send(rid, prompt, max_tokens, scheduled, attempt)
            except asyncio.CancelledError:
                self.on_result(_cancelled(rid, attempt, scheduled, t_sent, prompt))
                raise
            self.on_result(res)
            if res.ok:  # never retried
                if answer is not None:
                    answer.append(res.text or "")
                return ""
            # the window is over: no retry goes out in it
            if (
                stop.is_set()
                or self._ended()
                or not retry.should_retry(attempt, res.status_code, res.error_class)
            ):
                return res.error_class or f"http_{res.status_code}"
            delay = retry.delay_s(attempt, self.rng)
            if delay:
                await asyncio.sleep(delay)
            if stop.is_set() or self._ended():
                return "cancelled"
            attempt += 1

    def spawn(self, coro: Coroutine[Any, Any, Any], eager: bool = False) -> asyncio.Future[Any]:
        task = eager_task(coro) if eager else asyncio.ensure_future(coro)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return task

    async def open_loop(self) -> None:
        """Sleep, then gate: each arrival at its scheduled time (a trace's own times where the shape
        has a schedule), waiting for a slot under the cap."""
        shape = self.shape
        if not shape.request_rate and shape.schedule is None:
            raise ValueError("an open loop needs a request rate or a schedule")
        sem = asyncio.Semaphore(max(1, shape.concurrency))
        if shape.schedule is not None:
            g = schedule_gaps(shape.schedule)
        else:
            g = gaps(shape.request_rate, shape.arrival, shape.burstiness, shape.seed)  # type: ignore[arg-type]
        alarm = Alarm.open()  # wakes at the send time itself; the loop's timers are a millisecond coarse
        try:
            await self._arrivals(g, sem, alarm)
        finally:
            if alarm is not None:
                alarm.close()

    async def _arrivals(self, g: Iterator[float], sem: asyncio.Semaphore, alarm: Alarm | None) -> None:
        stop, pc, deadline = self.stop, time.perf_counter, self.deadline
        next_t, k = self.start, 0
        index, nshards = self.shard

        async def gated(rid: str, prompt: Prompt, scheduled: float) -> None:
            try:
                await self.one(rid, prompt, scheduled)
            finally:
                sem.release()

        while k < self.limit and next_t < deadline and not stop.is_set():
            prompt = next(self.prompts)  # every arrival draws its prompt: the sequence is the one schedule's
            if k % nshards == index:
                delay = next_t - pc()
                if delay > 0:
                    await (alarm.until(next_t) if alarm is not None else asyncio.sleep(delay))
                if stop.is_set():
                    break
                if sem.locked():
                    # The cap is full: wait for a slot, but not past the window's end.
                    try:
                        await asyncio.wait_for(sem.acquire(), timeout=max(0.0, deadline - pc()))
                    except asyncio.TimeoutError:
                        break
                else:
                    await sem.acquire()
                if stop.is_set():
                    sem.release()
                    break
                self.lags.append((pc() - next_t) * 1000)
                # eager: on the wire before this loop gives the event loop back (load/eager.py)
                self.spawn(gated(f"{self.id_prefix}{k}", prompt, next_t), eager=True)
                self.sent += 1
            k += 1
            next_t += next(g)

    async def user(self) -> None:
        """A closed-loop user: one request at a time until the window's count or time is up."""
        shape, stop, pc, deadline = self.shape, self.stop, time.perf_counter, self.deadline
        index, nshards = self.shard
        ready = self.start
        fails = 0
        talk: _Talk | None = None  # the conversation this user is in, and its next turn
        owes = 0  # the turns of this user's conversation not sent yet (counted in self.owed)
        try:
            while self.counter < self.my_limit and pc() < deadline and not stop.is_set():
                if talk is None and self.owed and self.counter + self.owed >= self.my_limit:
                    # What is left of the window's count is owed to the other users' conversations:
                    # starting another would walk one twice (the inputs cycle) and cut one short.
                    break
                c = self.counter
                self.counter += 1
                rid = f"{self.id_prefix}{c * nshards + index}"
                self.lags.append((pc() - ready) * 1000)
                if talk is not None:
                    prompt = talk.prompt()
                    owes, self.owed = owes - 1, self.owed - 1
                else:
                    prompt = next(self.prompts)
                    if prompt.conversation is not None:
                        owes = len(prompt.follow_ups)
                        self.owed += owes
                if prompt.conversation is None:  # (talk is None too: a conversation's turns all carry it)
                    failed = await self.one(rid, prompt, ready)
                else:
                    answer: list[str] = []
                    failed = await self.one(rid, prompt, ready, answer)
                    talk = _Talk.after(talk, prompt, answer, failed)
                    if talk is None:  # over, or given up: its remaining turns are owed no more
                        owes, self.owed = 0, self.owed - owes
                    pause = talk.pause_s() if talk is not None else 0.0
                    if pause > 0 and not stop.is_set():  # a tool call between two turns
                        await asyncio.sleep(min(max(0.0, deadline - pc()), pause))
                if failed == "connect" and shape.error_backoff and not stop.is_set():
                    # Nothing answered (refused, unreachable): the user waits before the next try (the
                    # plan's back-off), as a person would. Resubmitting in microseconds after a refused
                    # connection is a retry storm the client made, not the server. A server's own
                    # answer (429, 5xx, an error event) paces the loop itself and is what a drill measures.
                    fails += 1
                    wait = self.retry.user_backoff_s(fails, self.rng)
                    if shape.error_backoff_max_s is not None:
                        wait = min(wait, shape.error_backoff_max_s)
                    await asyncio.sleep(min(max(0.0, deadline - pc()), wait))
                elif not failed:
                    fails = 0
                    if shape.think_s > 0 and not stop.is_set():
                        await asyncio.sleep(min(max(0.0, deadline - pc()), shape.think_s))
                ready = pc()
        finally:
            self.owed -= owes  # a user that stops mid-conversation owes nothing more

    async def closed_loop(self, users: list[asyncio.Future[Any]]) -> None:
        if users:
            await asyncio.wait(users, timeout=max(0.0, self.deadline - time.perf_counter()))

    async def window(self, end_drain_s: float | None) -> None:
        """The loop until the window's bounds, the stop flag or its end; then the drain."""
        open_ = self.shape.mode == "open"
        if open_:
            body = self.body = asyncio.ensure_future(self.open_loop())
        else:
            users = [self.spawn(self.user()) for _ in range(shard_share(self.shape.concurrency, self.shard))]
            body = self.body = asyncio.ensure_future(self.closed_loop(users))
        await asyncio.wait({body, self.stop_wait, self.end_wait}, return_when=asyncio.FIRST_COMPLETED)
        drain_s = end_drain_s if self.end_wait.done() and end_drain_s is not None else self.drain_s
        if not body.done():
            body.cancel()
            await asyncio.gather(body, return_exceptions=True)
        elif body.exception() is not None:
            raise body.exception()  # type: ignore[misc]
        if not open_:
            self.sent = self.counter
        # The window is over: in-flight requests may finish within drain_s, then they are cancelled.
        # A fired stop does not wait: the load stops at once.
        if self.inflight and not self.stop.is_set():
            self.my_limit = 0  # closed-loop users start nothing new while draining
            drain = asyncio.ensure_future(asyncio.wait(set(self.inflight), timeout=drain_s))
            await asyncio.wait({drain, self.stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)

    async def close(self) -> None:
        """However the window ended (Ctrl-C, a caller's cancel included): the loop that sends goes
        first, so nothing new is sent, then whatever is in flight (recorded as cancelled)."""
        body = self.body
        loops = [body] if body is not None and not body.done() else []
        for lp in loops:
            lp.cancel()
        pending = set(self.inflight)
        waits = (self.ticker, self.stop_wait, self.end_wait)
        for t in (*pending, *waits):
            t.cancel()
        await asyncio.gather(*loops, *pending, *waits, return_exceptions=True)

    def outcome(self) -> WindowOutcome:
        lags, loop_lags = self.lags, self.loop_lags
        return WindowOutcome(
            sent=self.sent - self.unsent,
            elapsed_s=time.perf_counter() - self.start,
            lag_p99_ms=percentile(lags, 99) if lags else 0.0,
            lag_max_ms=max(lags, default=0.0),
            loop_lag_p99_ms=percentile(loop_lags, 99) if loop_lags else 0.0,
            loop_lag_max_ms=max(loop_lags, default=0.0),
            stopped=self.stop.is_set(),
        )
