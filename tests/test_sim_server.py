"""The sim's API on a real loopback port, through the real `openai` client and raw aiohttp."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vramlab.sim.config import SimConfig
from vramlab.sim.server import SimServer
from vramlab.sim.testing import make_estimate
from vramlab.sim.tokenizer import count_tokens

openai = pytest.importorskip("openai")
MODEL = "llama-3.1-8b-instruct"


def _cfg(tmp_path, **kw) -> SimConfig:
    est_kw = {k: kw.pop(k) for k in ("kv_cache_gib", "max_model_len", "max_num_seqs", "engine") if k in kw}
    est = make_estimate(**est_kw)
    return SimConfig(
        speed=kw.pop("speed", 200),
        estimate=est,
        device=str(tmp_path / "gpu0.ledger"),
        engine=est_kw.get("engine", "vllm"),
        **kw,
    )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def _metrics(text: str) -> dict[str, float]:
    """name{sorted labels} -> value, plus bare name -> value summed over labels."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            if s.labels:
                out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def test_openai_client_chat_and_completions_streaming_and_not(tmp_path):
    async def go():
        async with SimServer(_cfg(tmp_path), log_stream=open("/dev/null", "w")) as srv:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="sk-none", max_retries=0)
            models = await client.models.list()
            assert [m.id for m in models.data] == [MODEL]

            chat = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "How big is a KV cache page?"}],
                max_tokens=12,
                temperature=0.7,
                extra_body={"ignore_eos": True},
            )
            assert chat.choices[0].finish_reason == "length"
            assert chat.usage.completion_tokens == 12
            assert count_tokens(chat.choices[0].message.content) == 12

            comp = await client.completions.create(
                model=MODEL, prompt="one two six ten four", max_tokens=7, extra_body={"ignore_eos": True}
            )
            assert comp.usage.prompt_tokens == 5 and comp.usage.completion_tokens == 7
            assert comp.choices[0].finish_reason == "length"

            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "stream please"}],
                max_tokens=9,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            text, usage, reasons = "", None, []
            async for ch in stream:
                if ch.usage:
                    usage = ch.usage
                for c in ch.choices:
                    text += c.delta.content or ""
                    if c.finish_reason:
                        reasons.append(c.finish_reason)
            assert (
                reasons == ["length"]
                and usage is not None
                and usage.completion_tokens == 9 == count_tokens(text)
            )

            cstream = await client.completions.create(
                model=MODEL, prompt="abc", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
            )
            pieces = [c.choices[0].text async for c in cstream if c.choices]
            assert count_tokens("".join(pieces)) == 4
            await client.close()

    run(go())


def test_raw_sse_ends_with_done_and_metrics_parse(tmp_path):
    async def go():
        cfg = _cfg(tmp_path, log_stats_interval_s=0.1)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:
                r = await s.post(
                    srv.url + "/v1/completions",
                    json={
                        "model": MODEL,
                        "prompt": "hi you",
                        "max_tokens": 5,
                        "stream": True,
                        "ignore_eos": True,
                        "stream_options": {"include_usage": True},
                    },
                )
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                events = [ln[6:] for ln in (await r.text()).split("\n") if ln.startswith("data: ")]
                assert events[-1] == "[DONE]"
                body = [json.loads(e) for e in events[:-1]]
                assert body[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
                assert body[-2]["choices"][0]["finish_reason"] == "length"
                m = _metrics(await (await s.get(srv.url + "/metrics")).text())
                assert (await s.get(srv.url + "/health")).status == 200
                assert (await (await s.get(srv.url + "/version")).json())["version"]
                await asyncio.sleep(0.25)
                assert any(
                    "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%" in ln for ln in srv.log.lines
                )
        assert m["vllm:generation_tokens_total"] == 5 and m["vllm:prompt_tokens_total"] == 2
        labels = json.dumps({"engine": "0", "finished_reason": "length", "model_name": MODEL}, sort_keys=True)
        assert m["vllm:request_success_total" + labels] == 1
        assert m["vllm:time_to_first_token_seconds_count"] == 1
        assert m["vllm:inter_token_latency_seconds_count"] == 4
        assert m["vllm:e2e_request_latency_seconds_count"] == 1
        assert "vllm:kv_cache_usage_perc" in m and "vllm:num_requests_running" in m
        assert m["vllm:cache_config_info"] == 1

    run(go())


@pytest.mark.parametrize(
    "engine,version,names",
    [
        (
            "vllm",
            "0.9.2",
            [
                "vllm:gpu_cache_usage_perc",
                "vllm:time_per_output_token_seconds_count",
                "vllm:num_preemptions_total",
            ],
        ),
        (
            "sglang",
            None,
            [
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
                "sglang:time_to_first_token_seconds_count",
                "sglang:generation_tokens_total",
            ],
        ),
        (
            "tgi",
            None,
            [
                "tgi_queue_size",
                "tgi_batch_current_size",
                "tgi_request_count",
                "tgi_request_success",
                "tgi_request_duration_count",
            ],
        ),
        (
            "llama.cpp",
            None,
            [
                "llamacpp:prompt_tokens_total",
                "llamacpp:tokens_predicted_total",
                "llamacpp:kv_cache_usage_ratio",
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
            ],
        ),
    ],
)
def test_metric_names_follow_the_engine(tmp_path, engine, version, names):
    async def go():
        cfg = _cfg(tmp_path, engine=engine, engine_version=version)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:
                r = await s.post(
                    srv.url + "/v1/completions", json={"prompt": "x y", "max_tokens": 3, "ignore_eos": True}
                )
                assert r.status == 200
                return _metrics(await (await s.get(srv.url + "/metrics")).text())

    m = run(go())
    for name in names:
        assert name in m, (name, sorted(m)[:40])
    if engine == "vllm":
        assert "vllm:kv_cache_usage_perc" not in m  # 0.9 still used the old name
    if engine == "tgi":
        assert m["tgi_request_success"] == 1


def test_bad_input_gets_vllm_status_and_error_shape(tmp_path):
    async def go():
        async with SimServer(_cfg(tmp_path, max_model_len=256), log_stream=open("/dev/null", "w")) as srv:
            url = srv.url + "/v1/completions"
            async with aiohttp.ClientSession() as s:
                out = []
                for body in (
                    b"{not json",
                    json.dumps({"model": "nope", "prompt": "x"}).encode(),
                    json.dumps({"prompt": "x", "max_tokens": -1}).encode(),
                    json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(),
                    json.dumps({"prompt": "word " * 400, "max_tokens": 1}).encode(),
                    json.dumps({"prompt": 42}).encode(),
                ):
                    r = await s.post(url, data=body, headers={"Content-Type": "application/json"})
                    out.append((r.status, await r.json()))
                alive = (await s.get(srv.url + "/health")).status
                return out, alive

    out, alive = run(go())
    assert [st for st, _ in out] == [400, 404, 400, 400, 400, 400]
    for _, body in out:
        assert set(body["error"]) >= {"message", "type", "code"}
    assert "max_tokens must be at least 1, got -1" in out[2][1]["error"]["message"]
    assert "maximum context length is 256 tokens" in out[3][1]["error"]["message"]
    assert "However, your request has 400 input tokens" in out[4][1]["error"]["message"]
    assert alive == 200


def test_small_pool_preempts_under_load_and_requests_still_succeed(tmp_path):
    async def go():
        # 0.05 GiB of KV at 128 KiB/token = 409 tokens = 25 blocks; 24 requests of ~70 tokens need far more.
        cfg = _cfg(tmp_path, kv_cache_gib=0.05, max_model_len=256, speed=500)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:

                async def one(i):
                    r = await s.post(
                        srv.url + "/v1/completions",
                        json={"prompt": f"request {i} " + "tok " * 30, "max_tokens": 40, "ignore_eos": True},
                    )
                    return r.status, (await r.json())["usage"]["completion_tokens"]

                results = await asyncio.gather(*(one(i) for i in range(24)))
                m = _metrics(await (await s.get(srv.url + "/metrics")).text())
        return results, m

    results, m = run(go())
    assert results == [(200, 40)] * 24
    assert m["vllm:num_preemptions_total"] > 0


def test_same_seed_same_text_other_seed_other_text(tmp_path):
    async def texts(seed):
        cfg = _cfg(tmp_path, seed=seed)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:
                outs = []
                for p in ("alpha", "beta gamma"):
                    r = await s.post(srv.url + "/v1/completions", json={"prompt": p, "max_tokens": 30})
                    j = await r.json()
                    outs.append((j["choices"][0]["text"], j["choices"][0]["finish_reason"], j["usage"]))
                return outs

    a, b, c = run(texts(7)), run(texts(7)), run(texts(8))
    assert a == b and a != c
    assert all(u["completion_tokens"] <= 30 for _, _, u in a)


def test_hundreds_of_concurrent_streams(tmp_path):
    async def go():
        cfg = _cfg(tmp_path, speed=1000, max_num_seqs=512)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            conn = aiohttp.TCPConnector(limit=400)
            async with aiohttp.ClientSession(connector=conn) as s:

                async def one(i):
                    r = await s.post(
                        srv.url + "/v1/chat/completions",
                        json={
                            "messages": [{"role": "user", "content": f"hi {i}"}],
                            "max_tokens": 8,
                            "stream": True,
                            "ignore_eos": True,
                        },
                    )
                    n = 0
                    async for line in r.content:
                        if line.startswith(b"data: {") and b'"content": " ' in line:
                            n += 1
                    return n

                counts = await asyncio.gather(*(one(i) for i in range(300)))
                peak = srv.engine.stats.requests
        return counts, peak

    counts, total = run(go())
    assert counts == [8] * 300 and total == 300


def test_tgi_answers_429_when_over_max_concurrent_requests(tmp_path):
    async def go():
        cfg = _cfg(tmp_path, engine="tgi", max_concurrent_requests=4, speed=20)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:

                async def one():
                    r = await s.post(
                        srv.url + "/v1/completions",
                        json={"prompt": "x", "max_tokens": 20, "ignore_eos": True},
                    )
                    return r.status, await r.json()

                res = await asyncio.gather(*(one() for _ in range(10)))
                m = _metrics(await (await s.get(srv.url + "/metrics")).text())
        return res, m

    res, m = run(go())
    statuses = sorted(st for st, _ in res)
    assert statuses.count(200) == 4 and statuses.count(429) == 6
    assert next(b for st, b in res if st == 429) == {
        "error": "Model is overloaded",
        "error_type": "overloaded",
    }
    assert m['tgi_request_failure{"err": "overloaded"}'] == 6


def test_hang_fault_stops_tokens_but_health_stays_200(tmp_path):
    async def go():
        cfg = _cfg(tmp_path, allow_fault_injection=True, speed=50)
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:
                assert (await s.post(srv.url + "/sim/fault", json={"kind": "hang"})).status == 200
                req = asyncio.create_task(
                    s.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
                )
                await asyncio.sleep(0.3)
                assert not req.done()
                assert (await s.get(srv.url + "/health")).status == 200
                await s.post(srv.url + "/sim/fault", json={"kind": "clear"})
                r = await asyncio.wait_for(req, 5)
                assert r.status == 200

    run(go())


def test_fault_endpoint_is_off_unless_allowed(tmp_path):
    async def go():
        async with SimServer(_cfg(tmp_path), log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:
                return (await s.post(srv.url + "/sim/fault", json={"kind": "crash"})).status, srv.engine.dead

    assert run(go()) == (404, False)


@pytest.mark.parametrize(
    "engine,version,line",
    [
        ("sglang", None, "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio:"),
        (
            "llama.cpp",
            None,
            "update_slots: failed to find free space in the KV cache, retrying with smaller batch size",
        ),
        (
            "vllm",
            "0.6.3",
            "is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.",
        ),
    ],
)
def test_kv_pressure_log_lines_per_engine(tmp_path, engine, version, line):
    async def go():
        cfg = _cfg(
            tmp_path, engine=engine, engine_version=version, kv_cache_gib=0.05, max_model_len=256, speed=500
        )
        async with SimServer(cfg, log_stream=open("/dev/null", "w")) as srv:
            async with aiohttp.ClientSession() as s:

                async def one(i):
                    r = await s.post(
                        srv.url + "/v1/completions",
                        json={"prompt": f"request {i} " + "tok " * 30, "max_tokens": 40, "ignore_eos": True},
                    )
                    return r.status

                statuses = await asyncio.gather(*(one(i) for i in range(16)))
            return statuses, "\n".join(srv.log.lines), srv.engine.stats.preemptions

    statuses, log, preemptions = run(go())
    assert statuses == [200] * 16 and preemptions > 0
    assert line in log
