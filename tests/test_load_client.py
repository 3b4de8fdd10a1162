"""The streaming client and the load driver against a real aiohttp SSE server on loopback."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

import pytest

from vramlab.load.client import OpenAIClient, RequestResult
from vramlab.load.driver import LoadShape, Window, drive
from vramlab.load.prompts import Prompt, cycle
from vramlab.load.retry import RetryPolicy
from vramlab.load.stub import StubBehaviour, StubServer

P = Prompt("hello there", 2, 8)


@pytest.fixture(autouse=True, params=["fast", "aiohttp"])
def http_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both HTTP clients: vramlab's own (fasthttp.py) and aiohttp."""
    init = OpenAIClient.__init__

    def init_with(self: OpenAIClient, *a: object, **k: object) -> None:
        k.setdefault("http_client", request.param)
        init(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(OpenAIClient, "__init__", init_with)
    return str(request.param)


async def _one(
    b: StubBehaviour,
    api: str = "openai-chat",
    key: str | None = None,
    timeout_s: float = 5.0,
    max_tokens: int = 8,
) -> tuple[RequestResult, StubServer]:
    async with StubServer(b) as srv, OpenAIClient(srv.url, "stub-model", api, key, timeout_s=timeout_s) as c:  # type: ignore[arg-type]
        t = time.perf_counter()
        return await c.send("x", P, max_tokens, t), srv


def test_ttft_itl_tpot_and_usage() -> None:
    """Order, counts and the bounds the stub's own sleeps guarantee (50 ms before the first token, 20 ms between
    tokens): a busy machine can only make a request slower, so no upper bound on a latency is asserted here
    (latency figures belong in benchmarks/loadgen.py)."""
    res, srv = asyncio.run(_one(StubBehaviour(ttft_s=0.05, token_s=0.02), max_tokens=6))
    assert res.ok and res.status_code == 200
    assert res.ttft_ms is not None and res.e2e_ms is not None and res.tpot_ms is not None
    assert res.ttft_ms >= 45  # the stub sleeps 50 ms before its first token (timer granularity aside)
    # 5 gaps; a token that comes in one read with the next (the finish and usage chunks, or a late read on a busy
    # machine) leaves its gap untimed (coalesced), never guessed
    assert len(res.itl_ms) + res.untimed_gaps == 5
    assert all(x >= 0 for x in res.itl_ms)
    assert res.output_tokens == 6 and res.prompt_tokens == 5  # from the usage chunk
    if res.untimed_gaps == 0:  # TPOT spans every gap, the untimed ones too
        assert res.tpot_ms == pytest.approx(statistics.fmean(res.itl_ms), rel=0.01)
    assert res.tpot_ms > 0
    # the stub slept at least 50 + 5 x 20 ms; the timed parts never add up to more than the whole
    assert res.e2e_ms >= 0.9 * (50 + 5 * 20)
    assert res.e2e_ms + 1 >= res.ttft_ms + sum(res.itl_ms)
    body = srv.b.seen[0]
    assert (
        body["stream"] is True and body["messages"][0]["content"] == "hello there" and body["max_tokens"] == 6
    )


def test_completions_api_and_counted_tokens_without_usage() -> None:
    res, srv = asyncio.run(_one(StubBehaviour(usage=False), api="openai-completions", max_tokens=4))
    assert (
        res.ok and res.output_tokens == 4 and res.prompt_tokens == 2
    )  # counted chunks; the prompt's own count
    assert srv.b.seen[0]["prompt"] == "hello there"


@pytest.mark.parametrize(
    "behaviour,cls,status",
    [
        (StubBehaviour(fail_status=500), "http_5xx", 500),
        (StubBehaviour(fail_status=429), "http_4xx", 429),
        (
            StubBehaviour(fail_status=500, fail_body='{"error":"CUDA out of memory. Tried to allocate"}'),
            "oom",
            500,
        ),
        (StubBehaviour(midstream_error="EngineDeadError: EngineCore encountered an issue"), "oom", 200),
        (StubBehaviour(midstream_error="something else"), "stream_broken", 200),
        (StubBehaviour(garbage=True), "stream_broken", 200),
        (StubBehaviour(api_key="right"), "http_4xx", 401),
    ],
)
def test_errors_are_classified(behaviour: StubBehaviour, cls: str, status: int) -> None:
    res, _ = asyncio.run(_one(behaviour, key="wrong"))
    assert not res.ok and res.error_class == cls and res.status_code == status
    assert res.error and "wrong" not in res.error  # the key never reaches a stored error


def test_api_key_is_sent_as_bearer_and_never_echoed_into_errors() -> None:
    res, _ = asyncio.run(_one(StubBehaviour(api_key="right"), key="right"))
    assert res.ok
    res, _ = asyncio.run(
        _one(StubBehaviour(fail_status=401, fail_body="bad key sk-live-123"), key="sk-live-123")
    )
    assert res.error == "HTTP 401: bad key ***"


def test_timeout_and_refused_connection() -> None:
    res, _ = asyncio.run(_one(StubBehaviour(ttft_s=2.0), timeout_s=0.3))
    # classed a timeout, not ended before its time; the upper bound only says it did not wait for the answer's
    # end by much (a busy machine delays the timer: 3.3 s was seen under a load average of 10)
    assert res.error_class == "timeout" and 250 <= res.e2e_ms <= 10_000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing answers

    async def go() -> RequestResult:
        async with OpenAIClient(f"http://127.0.0.1:{port}", "m") as c:
            return await c.send("x", P, 4, time.perf_counter())

    assert asyncio.run(go()).error_class == "connect"


def _drive(
    b: StubBehaviour,
    shape: LoadShape,
    window: Window,
    retry: RetryPolicy = RetryPolicy(),
    during: float | None = None,
) -> tuple[list[RequestResult], object]:
    out: list[RequestResult] = []

    async def go() -> object:
        async with StubServer(b) as srv, OpenAIClient(srv.url, "m", max_connections=64) as c:
            task = asyncio.ensure_future(drive(c, cycle([P]), shape, window, out.append, retry))
            if during is not None:
                await asyncio.sleep(during)
                task.cancel()
                return await asyncio.gather(task, return_exceptions=True)
            return await task

    return out, asyncio.run(go())


def test_open_loop_rate_is_bounded_by_count_and_time() -> None:
    out, outcome = _drive(
        StubBehaviour(), LoadShape("open", 16, 200.0, "constant"), Window(duration_s=5, requests=40)
    )
    assert len(out) == 40 and outcome.sent == 40  # type: ignore[attr-defined]
    span = max(r.scheduled_at for r in out) - min(r.scheduled_at for r in out)
    assert span == pytest.approx(39 / 200, rel=0.01)  # the schedule, not the send times
    out, outcome = _drive(StubBehaviour(), LoadShape("open", 16, 50.0, "poisson"), Window(duration_s=0.6))
    assert 10 <= len(out) <= 60 and outcome.elapsed_s < 1.5  # type: ignore[attr-defined]


def test_closed_loop_keeps_n_in_flight() -> None:
    out, _ = _drive(StubBehaviour(ttft_s=0.05), LoadShape("closed", 4), Window(requests=12))
    assert len(out) == 12
    starts = sorted(r.sent_at for r in out)
    assert starts[3] - starts[0] < 0.03  # four users start together


def test_coordinated_omission_stall_shows_from_the_schedule() -> None:
    """The server stalls 0.8 s; with one slot the requests scheduled meanwhile wait in the client.
    Measured from the actual send they look fast; from the schedule they carry the stall."""
    # The stall starts with the first request, so a slow set-up on a loaded machine cannot shorten it.
    b = StubBehaviour(stall_first_s=0.8)
    out, _ = _drive(b, LoadShape("open", 1, 40.0, "constant"), Window(duration_s=1.2, drain_s=2))
    ok = [r for r in out if r.ok]
    assert len(ok) >= 30
    late = [r for r in ok[1:] if r.scheduled_at - ok[0].scheduled_at < 0.5]  # scheduled during the stall
    assert late, "requests scheduled during the stall"
    assert max(r.e2e_ms for r in late) < 100  # each one is quick once sent ...
    assert min(r.e2e_from_scheduled_ms for r in late) > 200  # ... but waited behind the stall
    assert max(r.dispatch_lag_ms for r in late) > 300


def test_retries_are_separate_attempts_from_one_schedule() -> None:
    out, _ = _drive(
        StubBehaviour(fail_status=503),
        LoadShape("closed", 1),
        Window(requests=2),
        RetryPolicy("immediate", max_attempts=3),
    )
    assert [(r.request_id, r.attempt) for r in out] == [
        ("r0", 0),
        ("r0", 1),
        ("r0", 2),
        ("r1", 0),
        ("r1", 1),
        ("r1", 2),
    ]
    assert len({r.scheduled_at for r in out if r.request_id == "r0"}) == 1


def test_cancelling_a_window_records_in_flight_requests() -> None:
    out, _ = _drive(StubBehaviour(ttft_s=5.0), LoadShape("closed", 3), Window(duration_s=10), during=0.3)
    assert len(out) == 3 and all(r.error_class == "cancelled" for r in out)


def test_a_full_cap_does_not_stretch_the_window() -> None:
    out, outcome = _drive(
        StubBehaviour(ttft_s=3.0), LoadShape("open", 2, 20.0, "constant"), Window(duration_s=0.5, drain_s=0.2)
    )
    assert outcome.sent == 2 and outcome.elapsed_s < 1.2  # type: ignore[attr-defined]
    assert [r.error_class for r in out] == ["cancelled", "cancelled"]


# -- accounting -------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_a_reasoning_model_gets_its_ttft_from_the_first_reasoning_token(key: str) -> None:
    """vLLM/SGLang with a reasoning parser stream the thinking as reasoning_content (or, newer,
    reasoning) before any content: the first token is the first reasoning token, not the first
    content one, and the stream is not broken."""
    b = StubBehaviour(ttft_s=0.05, token_s=0.1, reasoning_tokens=3, reasoning_key=key)
    res, _ = asyncio.run(_one(b, max_tokens=5))
    assert res.ok and res.ttft_ms is not None
    assert 45 <= res.ttft_ms < 140  # content only starts ~3 x 100 ms later
    assert len(res.token_times) == 5 and res.output_tokens == 5 and res.output_tokens_source == "usage"
    assert res.reasoning_tokens == 3  # the server's usage.completion_tokens_details
    only, _ = asyncio.run(
        _one(StubBehaviour(reasoning_tokens=4, reasoning_key=key, usage=False), max_tokens=4)
    )
    assert only.ok and only.output_tokens == 4 and only.reasoning_tokens == 4  # reasoning-only: not broken
    assert only.output_tokens_source == "chunks"


def test_an_empty_completion_is_a_success_with_zero_tokens() -> None:
    res, _ = asyncio.run(_one(StubBehaviour(empty_completion=True)))
    assert (
        res.ok and res.error_class is None and res.output_tokens == 0 and res.output_tokens_source == "usage"
    )
    assert res.ttft_ms is None and res.itl_ms == [] and res.tpot_ms is None
    # without usage and without [DONE]: the finish_reason alone says it ended on purpose
    res, _ = asyncio.run(_one(StubBehaviour(empty_completion=True, usage=False, send_done=False)))
    assert res.ok and res.output_tokens == 0 and res.output_tokens_source == "chunks"


def test_a_stream_that_just_ends_is_still_broken() -> None:
    res, _ = asyncio.run(_one(StubBehaviour(usage=False, send_done=False), max_tokens=0))
    assert res.error_class == "stream_broken" and "finish_reason" in (res.error or "")


def test_output_tokens_come_from_usage_else_counted_chunks_labelled_an_estimate() -> None:
    res, _ = asyncio.run(_one(StubBehaviour(), max_tokens=3))
    assert (res.output_tokens, res.output_tokens_source) == (3, "usage")
    res, _ = asyncio.run(_one(StubBehaviour(usage=False), max_tokens=3))
    assert (res.output_tokens, res.output_tokens_source) == (3, "chunks")


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # bound, not listening: every connect is refused at once


def test_closed_loop_users_back_off_after_an_immediate_error() -> None:
    """Against a refused port the closed loop used to resubmit in microseconds (19,010 requests
    in 1 s, #11). Each user now waits the plan's back-off after a failure."""
    out: list[RequestResult] = []

    async def go() -> None:
        async with OpenAIClient(f"http://127.0.0.1:{_refused_port()}", "m") as c:
            await drive(
                c,
                cycle([P]),
                LoadShape("closed", 4),
                Window(duration_s=1.0, drain_s=0.5),
                out.append,
                RetryPolicy(base_s=0.2, max_s=1.0),
            )

    asyncio.run(go())
    assert out and all(r.error_class == "connect" for r in out)
    # 4 users, waits of 0.1-0.2 s, then 0.2-0.4 s, ...: at most a handful each in 1 s
    assert len(out) <= 4 * 6, len(out)


@pytest.mark.parametrize("shape", [LoadShape("closed", 8), LoadShape("open", 64, 400.0, "constant")])
def test_a_stop_flag_stops_every_loop_within_one_request(shape: LoadShape) -> None:
    """Against a refused port, with no back-off at all (the worst case): once the flag is set, no
    loop sends another request, and the window ends at once, whatever is in flight."""
    out: list[RequestResult] = []
    shape = LoadShape(shape.mode, shape.concurrency, shape.request_rate, shape.arrival, error_backoff=False)

    async def go() -> tuple[float, object]:
        stop = asyncio.Event()

        def on_result(r: RequestResult) -> None:
            out.append(r)
            if len(out) == 20:
                stop.set()  # as the runner's fire_stop does, from inside a result callback

        async with OpenAIClient(f"http://127.0.0.1:{_refused_port()}", "m") as c:
            t = time.perf_counter()
            outcome = await drive(
                c, cycle([P]), shape, Window(duration_s=5.0, drain_s=3.0), on_result, stop=stop
            )
            return time.perf_counter() - t, outcome

    elapsed, outcome = asyncio.run(go())
    assert outcome.stopped  # type: ignore[attr-defined]
    # the loops already past their check when the flag went up may finish the request they hold
    assert len(out) <= 20 + shape.concurrency, len(out)
    assert elapsed < 3.0  # neither the 5 s window nor the 3 s drain


def test_cancelling_an_open_loop_window_stops_its_sending_loop_too() -> None:
    """Cancelling drive() from outside must also end the loop that sends: nothing reaches the
    server after the cancel, and nothing but successes and cancellations is recorded."""
    out: list[RequestResult] = []
    b = StubBehaviour(ttft_s=0.2)

    async def go() -> tuple[int, int]:
        async with StubServer(b) as srv, OpenAIClient(srv.url, "m", max_connections=64) as c:
            task = asyncio.ensure_future(
                drive(
                    c,
                    cycle([P]),
                    LoadShape("open", 64, 100.0, "constant"),
                    Window(duration_s=5, drain_s=0),
                    out.append,
                )
            )
            # cancel once the loop is sending (a busy two-core box may take longer than 0.5 s to start it)
            deadline = asyncio.get_running_loop().time() + 4.0
            while not srv.b.seen and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            seen = len(srv.b.seen)
            await asyncio.sleep(0.5)  # a loop still running would send ~50 more meanwhile
            return seen, len(srv.b.seen)

    before, after = asyncio.run(go())
    assert before > 0 and after == before
    assert all(r.ok or r.error_class == "cancelled" for r in out), {r.error_class for r in out}


def test_an_endless_sse_line_ends_the_stream_instead_of_growing_the_buffer() -> None:
    """A server that streams bytes and never the blank line that ends an event: the client stops
    at MAX_EVENT_BYTES with a broken-stream error, holding at most that much."""
    import asyncio

    from vramlab.load.client import OpenAIClient
    from vramlab.load.sse import MAX_EVENT_BYTES, Stream

    sent = [0]

    class Endless:
        async def readany(self) -> bytes:
            sent[0] += 1
            if sent[0] > 4 * MAX_EVENT_BYTES // 65536:
                raise AssertionError("the client kept reading past the cap")
            return b"data: " + b"x" * 65530 if sent[0] == 1 else b"x" * 65536

    class Resp:
        content = Endless()

    st = Stream()
    client = OpenAIClient("http://127.0.0.1:1", "m", "openai-chat")
    asyncio.run(client._read_stream(Resp(), st))
    assert st.done and st.error is not None and "blank line" in st.error
    assert sent[0] <= MAX_EVENT_BYTES // 65536 + 2


def test_each_request_carries_its_own_prompt_when_prompts_come_and_go() -> None:
    # A drill builds each step's prompts anew and frees the last step's: CPython hands a freed
    # object's address to the next one, so a body cache keyed by id() sent an earlier step's text.
    async def go() -> tuple[list[str], list[str]]:
        sent: list[str] = []
        async with StubServer(StubBehaviour()) as srv, OpenAIClient(srv.url, "m", "openai-completions") as c:
            for step in range(40):
                prompts = [Prompt(f"step {step} prompt {i} " + "word " * step, None, 2) for i in range(3)]
                for p in prompts:
                    await c.send(f"s{step}", p, 2, time.perf_counter())
                    sent.append(p.text)
                del prompts
            return sent, [str(b["prompt"]) for b in srv.b.seen]

    sent, seen = asyncio.run(go())
    assert seen == sent
