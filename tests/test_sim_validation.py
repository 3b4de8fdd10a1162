"""The sim refuses what vLLM refuses, with vLLM's 400 and error shape, serves n > 1 as vLLM does,
and logs a client that goes away in one line (no traceback)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

import aiohttp
import pytest

from vramlab.sim.server import SimServer
from vramlab.sim.testing import make_estimate

MODEL = "llama-3.1-8b-instruct"


def _server(tmp_path, log: io.StringIO | None = None) -> SimServer:
    from vramlab.sim.config import SimConfig

    cfg = SimConfig(speed=200, estimate=make_estimate(), device=str(tmp_path / "gpu0.ledger"), engine="vllm")
    return SimServer(cfg, log_stream=log if log is not None else io.StringIO())


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


BAD_CHAT: list[tuple[dict[str, Any], str]] = [
    ({"messages": [{"content": "hi"}]}, "messages.0.role"),  # no role
    ({"messages": [{"role": 5, "content": "hi"}]}, "messages.0.role"),  # a role that is not a string
    ({"messages": [{"role": "user", "content": 42}]}, "messages.0.content"),  # a number as content
    ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages.0.content"),  # an object
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": "2"}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 1.5}, "n"),
    ({"messages": "hi"}, "messages"),
    # five fields once read leniently: bool("false") streamed, a string's truth ignored the EOS
    ({"messages": [{"role": "user", "content": "hi"}], "stream": "maybe"}, "stream"),
    ({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": 2}, "ignore_eos"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream_options": "usage"}, "stream_options"),
    (
        {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": []}},
        "include_usage",
    ),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": True}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, "top_p"),
]


def test_bad_requests_get_vllm_400s(tmp_path):
    async def go():
        async with _server(tmp_path) as srv, aiohttp.ClientSession() as http:
            for body, param in BAD_CHAT:
                async with http.post(srv.url + "/v1/chat/completions", json={"model": MODEL, **body}) as r:
                    doc = await r.json()
                    assert r.status == 400, (body, doc)
                    err = doc["error"]  # vLLM >= 0.10 wraps the error object
                    assert (
                        err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] == param
                    ), doc
                    assert err["message"]
            # nested past any parser's depth: a 400 about the body, not a 500 RecursionError
            deep = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
            async with http.post(
                srv.url + "/v1/chat/completions", data=deep, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 400
                assert "JSON" in (await r.json())["error"]["message"]
            async with http.post(
                srv.url + "/v1/completions", data=b"\xff\xfe{", headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 400
            # what vLLM accepts: a custom role (vLLM "enables custom roles"), content parts, null content
            ok = [
                {"role": "narrator", "content": "once"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None},
                {"role": "user", "content": ["plain", "parts"]},
            ]
            async with http.post(
                srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": ok, "max_tokens": 3}
            ) as r:
                assert r.status == 200, await r.text()

    run(go())


def test_n_choices_plain_and_streamed(tmp_path):
    async def go():
        async with _server(tmp_path) as srv, aiohttp.ClientSession() as http:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "tell me"}],
                "max_tokens": 5,
                "ignore_eos": True,
                "n": 3,
            }
            async with http.post(srv.url + "/v1/chat/completions", json=body) as r:
                doc = await r.json()
            assert r.status == 200
            assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
            texts = [c["message"]["content"] for c in doc["choices"]]
            assert len(set(texts)) == 3  # n different samples, not one answer three times
            assert doc["usage"]["completion_tokens"] == 15
            async with http.post(srv.url + "/v1/chat/completions", json={**body, "n": 1}) as r:
                assert (await r.json())["choices"][0]["message"]["content"] == texts[0]
            async with http.post(
                srv.url + "/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": "a b c",
                    "max_tokens": 4,
                    "ignore_eos": True,
                    "n": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ) as r:
                raw = (await r.read()).decode()
            events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            per_index: dict[int, int] = {}
            finished = set()
            for c in chunks:
                for ch in c["choices"]:
                    if ch["text"]:
                        per_index[ch["index"]] = per_index.get(ch["index"], 0) + 1
                    if ch["finish_reason"]:
                        finished.add(ch["index"])
            assert per_index == {0: 4, 1: 4} and finished == {0, 1}
            assert chunks[-1]["usage"]["completion_tokens"] == 8

    run(go())


def test_client_disconnect_is_one_line_not_a_traceback(tmp_path, caplog):
    log = io.StringIO()

    async def go():
        async with _server(tmp_path, log) as srv:
            for _ in range(3):
                reader, writer = await asyncio.open_connection(srv.cfg.host, srv.port)
                body = json.dumps(
                    {"model": MODEL, "prompt": "x y", "max_tokens": 400, "ignore_eos": True, "stream": True}
                ).encode()
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                await reader.readuntil(b"data: ")  # the stream started
                writer.transport.abort()  # the client goes away mid-stream
            await asyncio.sleep(1.0)
            state = await _state(srv)
            assert state["running"] == 0  # the abandoned sequences were freed

    caplog.set_level(logging.DEBUG)
    run(go())
    text = log.getvalue() + caplog.text
    assert "Traceback" not in text
    assert text.count("client disconnected") == 3


async def _state(srv: SimServer) -> dict:
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/sim/state") as r:
        return await r.json()


@pytest.mark.parametrize("engine", ["vllm"])
def test_error_shape_before_0_10_is_top_level(tmp_path, engine):
    from vramlab.sim.api import ApiError, error_body

    body = error_body(ApiError(400, "n must be at least 1, got 0.", param="n"), engine, (0, 8, 5))
    assert body == {
        "object": "error",
        "message": "n must be at least 1, got 0.",
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }


def test_a_boolean_field_reads_as_pydantic_reads_it() -> None:
    from vramlab.sim.api import parse_request

    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert not parse_request({**base, "stream": "false"}, True, MODEL, 4096).stream  # bool("false") was True
    assert parse_request(
        {**base, "stream": "yes", "stream_options": {"include_usage": 1}}, True, MODEL, 4096
    ).include_usage


def test_a_malformed_request_is_one_line_in_the_sims_log(caplog) -> None:
    """aiohttp logs bad framing with a traceback; the sim says it in one line (a handler's own
    exception, a bug, keeps its traceback)."""
    from aiohttp.http_exceptions import BadHttpMessage

    from vramlab.sim.serve import _one_line_protocol_errors

    _one_line_protocol_errors()
    log = logging.getLogger("aiohttp.server")
    with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
        try:
            raise BadHttpMessage("Too many headers received")
        except BadHttpMessage:
            log.exception("Error handling request from %s", "127.0.0.1")
        try:
            raise KeyError("a bug")
        except KeyError:
            log.exception("Error handling request from %s", "127.0.0.1")
    first, second = caplog.records[-2:]
    assert first.exc_info is None and "Too many headers" in first.getMessage()
    assert second.exc_info is not None  # a handler's bug keeps its traceback
