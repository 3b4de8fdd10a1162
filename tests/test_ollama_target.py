"""`ollama` as a target kind: the /api/ps sampler, its events on the run's and the drill's timelines,
and `vramlab run` against a fake Ollama on loopback (Ollama itself cannot be installed here)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _threaded_app import serve_app
from vramlab.observe import ollama as ollama_sampler
from vramlab.observe.ollama import LoadedModel, OllamaSampler, parse_ps


def changes(*args: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """The model changes as (kind, message, data)."""
    return [(d.kind, d.message, dict(d.data)) for d in ollama_sampler.changes(*args)]


# The example of Ollama's API reference for GET /api/ps (docs.ollama.com/api/ps): gemma3 with
# 5333539264 of its 6591830464 bytes on the GPU, i.e. partly on the host.
DOCS_PS = {
    "models": [
        {
            "name": "gemma3",
            "model": "gemma3",
            "size": 6591830464,
            "digest": "a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "gemma3",
                "families": ["gemma3"],
                "parameter_size": "4.3B",
                "quantization_level": "Q4_K_M",
            },
            "expires_at": "2025-10-17T16:47:07.93355-07:00",
            "size_vram": 5333539264,
            "context_length": 4096,
        }
    ]
}


def test_parse_ps_reads_the_documented_payload_and_says_partly_on_the_host() -> None:
    (m,) = parse_ps(DOCS_PS)
    assert (m.name, m.size, m.size_vram, m.context_length) == ("gemma3", 6591830464, 5333539264, 4096)
    assert m.gpu_share == pytest.approx(5333539264 / 6591830464)
    assert m.placement() == "81% GPU / 19% host: partly offloaded to the host"
    assert "6.14 GiB in memory, 4.97 GiB on the GPU" in m.describe() and "context 4096" in m.describe()
    full = parse_ps({"models": [{**DOCS_PS["models"][0], "size_vram": 6591830464}]})[0]
    cpu = parse_ps({"models": [{**DOCS_PS["models"][0], "size_vram": 0}]})[0]
    assert full.placement() == "100% GPU" and cpu.placement().startswith("all on the host")
    # a near-total split is never rounded to a whole side
    assert LoadedModel("x", 1000, 999).placement().startswith("99% GPU")
    assert parse_ps({"models": []}) == [] and parse_ps({}) == []
    # entries without a name or byte counts are skipped; an answer without a list is refused
    assert parse_ps({"models": [{"name": "a"}, {"size": 1, "size_vram": 1}, "x"]}) == []
    with pytest.raises(ValueError):
        parse_ps({"models": "nope"})


def test_changes_tell_load_expiry_eviction_and_offload() -> None:
    a = LoadedModel("a", 4 << 30, 4 << 30, expires_at="2026-01-01T00:00:10.123456789Z")
    b = LoadedModel("b", 8 << 30, 6 << 30)
    first = changes(None, {"a": a})
    assert [k for k, _, _ in first] == ["model_load"] and first[0][2]["already_loaded"] is True
    assert changes({"a": a}, {"a": a}) == []
    before = dt.datetime(2026, 1, 1, 0, 0, 5, tzinfo=dt.timezone.utc)
    after = dt.datetime(2026, 1, 1, 0, 0, 11, tzinfo=dt.timezone.utc)
    ((kind, msg, data),) = changes({"a": a}, {}, before)
    assert kind == "model_unload" and data["reason"] == "unloaded" and "freeing 4.00 GiB of GPU memory" in msg
    assert changes({"a": a}, {}, after)[0][2]["reason"] == "expired"
    swapped = changes({"a": a}, {"b": b}, before)
    assert [(k, d["model"]) for k, _, d in swapped] == [("model_unload", "a"), ("model_load", "b")]
    assert swapped[0][2]["reason"] == "evicted" and "b loaded in its place" in swapped[0][1]
    assert "75% GPU / 25% host" in swapped[1][1] and swapped[1][2]["gpu_share"] == 0.75
    moved = changes({"b": b}, {"b": LoadedModel("b", 8 << 30, 2 << 30)})
    assert [k for k, _, _ in moved] == ["model_offload"]
    assert moved[0][2]["size_vram_before_bytes"] == 6 << 30 and "6.00 GiB → 2.00 GiB" in moved[0][1]


class FakeOllama:
    """Ollama's API surface for vramlab: `/`, `/api/version`, `/api/ps`, `/v1/models` and streaming
    `/v1/chat/completions` and `/v1/completions`. The model loads at the first request and unloads
    `keep_alive_s` after it loaded (the next request loads it again); a load takes `load_s`, longer
    than a sample interval, so every unloaded gap is seen by a poll."""

    def __init__(
        self, keep_alive_s: float, size: int = 3 << 30, size_vram: int = (9 << 30) // 4, load_s: float = 0.5
    ) -> None:
        self.keep_alive_s, self.size, self.size_vram, self.load_s = keep_alive_s, size, size_vram, load_s
        self._lock = asyncio.Lock()
        self.loaded_until: float | None = None
        self.loads = 0
        self.url = ""

    def _expire(self) -> None:
        if self.loaded_until is not None and time.time() >= self.loaded_until:
            self.loaded_until = None

    async def ps(self, request: Any) -> Any:
        from aiohttp import web

        self._expire()
        models = []
        if self.loaded_until is not None:
            exp = (
                dt.datetime.fromtimestamp(self.loaded_until, dt.timezone.utc)
                .isoformat()
                .replace("+00:00", "Z")
            )
            models.append(
                {
                    "name": "tiny:1b",
                    "model": "tiny:1b",
                    "size": self.size,
                    "size_vram": self.size_vram,
                    "digest": "0" * 64,
                    "details": {"format": "gguf", "family": "llama"},
                    "expires_at": exp,
                    "context_length": 4096,
                }
            )
        return web.json_response({"models": models})

    async def complete(self, request: Any) -> Any:
        from aiohttp import web

        async with self._lock:  # one load at a time; requests wait for it, as Ollama's do
            self._expire()
            if self.loaded_until is None:
                self.loads += 1
                await asyncio.sleep(self.load_s)  # loading: /api/ps lists nothing yet
                self.loaded_until = time.time() + self.keep_alive_s
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for tok in ("Hello", " there", "!"):
            choice = {"index": 0, "delta": {"content": tok}} if chat else {"index": 0, "text": tok}
            await resp.write(
                b"data: " + json.dumps({"model": body.get("model"), "choices": [choice]}).encode() + b"\n\n"
            )
            await asyncio.sleep(0.005)
        fin = (
            {"index": 0, "delta": {}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "length"}
        )
        usage = {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}
        await resp.write(b"data: " + json.dumps({"choices": [fin], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application()

        async def root(request: Any) -> Any:
            return web.Response(text="Ollama is running")

        async def version(request: Any) -> Any:
            return web.json_response({"version": "0.12.3"})

        async def models(request: Any) -> Any:
            return web.json_response({"object": "list", "data": [{"id": "tiny:1b"}]})

        app.router.add_get("/", root)
        app.router.add_get("/api/version", version)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        return app


@pytest.fixture()
def ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama(keep_alive_s=2.0)
    with serve_app(fake.app) as port:
        fake.url = f"http://127.0.0.1:{port}"
        yield fake


def test_sampler_against_the_fake_records_bytes_and_events(ollama: FakeOllama) -> None:
    async def go() -> tuple[list[Any], list[Any]]:
        import aiohttp

        s = OllamaSampler(ollama.url)
        await s.open()
        assert s.version == "0.12.3" and "Ollama 0.12.3" in (s.open_note or "")
        first = await s.sample()
        ollama.keep_alive_s = 0.3
        async with (
            aiohttp.ClientSession() as c,
            c.post(ollama.url + "/v1/completions", json={"model": "tiny:1b"}) as r,
        ):
            await r.read()
        loaded = await s.sample()
        ev = s.take_events()
        await asyncio.sleep(0.4)  # keep_alive runs out
        await s.sample()
        ev += s.take_events()
        await s.close()
        return [first, loaded], ev

    (first, loaded), ev = asyncio.run(go())
    assert {x.name: x.value for x in first} == {"ollama.models_loaded": 0, "ollama.vram_bytes": 0}
    by = {(x.name, x.labels.get("model")): x.value for x in loaded}
    assert by[("ollama.model_size_bytes", "tiny:1b")] == 3 << 30
    assert by[("ollama.model_vram_bytes", "tiny:1b")] == (9 << 30) // 4
    assert [(d.kind, d.data.get("reason")) for d in ev] == [("model_load", None), ("model_unload", "expired")]
    assert "75% GPU / 25% host: partly offloaded" in ev[0].message


def test_sampler_refuses_a_server_that_is_not_ollama() -> None:
    from vramlab.load.stub import StubServer
    from vramlab.observe.base import SourceUnavailable

    async def go(root: str | None) -> str:
        if root is None:
            async with StubServer() as srv:  # an OpenAI-compatible server without /api/version
                return await go(srv.url)
        s = OllamaSampler(root)
        with pytest.raises(SourceUnavailable) as exc:
            await s.open()
        assert s._session is None  # nothing left open
        return str(exc.value)

    assert "did not answer an Ollama version" in asyncio.run(go(None))
    assert "/api/version" in asyncio.run(go("http://127.0.0.1:9"))  # nothing listens on the discard port


def _plan(tmp_path: Path, url: str) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(f"""\
name: ollama-timeline
target:
  kind: ollama
  base_url: {url}/v1
  model: tiny:1b
fixed:
  input:
    synthetic: {{prompt_tokens: 8, output_tokens: 3, seed: 1, count: 4}}
change:
  variable: concurrency
  steps: [1]
phases:
  duration_s: 1.6
  drain_s: 0.5
load:
  mode: open
  request_rate: 4
  max_concurrency: 2
samplers:
  interval_s: 0.2
  sources: [host, health]
""")
    return p


def test_run_with_kind_ollama_stores_and_reports_load_and_eviction(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    from vramlab.experiment.plan import load_plan
    from vramlab.experiment.wiring import samplers_for
    from vramlab.store import open_store

    plan_path = _plan(tmp_path, ollama.url)
    plan = load_plan(plan_path)
    assert plan.target.kind == "ollama"
    assert [s.source for s in samplers_for(plan)] == ["host", "health", "ollama"]
    db = tmp_path / "v.db"
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    p = subprocess.run(
        ["vramlab", "run", str(plan_path), "--db", str(db), "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["run_id"]
    with open_store(str(db)) as store:
        events = [e for e in store.events(run_id) if e.kind.startswith("model_")]
        samples = [s for s in store.samples(run_id) if s.source == "ollama"]
        fixed = store.get_run(run_id).fixed
    assert fixed.get("engine_version") == "0.12.3", fixed  # Ollama's /api/version
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["model_load", "model_unload", "model_load"], kinds
    assert events[1].data["reason"] == "expired" and events[0].data["size_vram_bytes"] == (9 << 30) // 4
    assert ollama.loads >= 2
    vram = [
        s.value for s in samples if s.name == "ollama.model_vram_bytes" and s.labels == {"model": "tiny:1b"}
    ]
    assert vram and set(vram) == {float((9 << 30) // 4)}
    # an unloaded gap is recorded as zero loaded models between two loaded stretches
    loaded = [s.value for s in sorted(samples, key=lambda s: s.t_s) if s.name == "ollama.models_loaded"]
    assert 0.0 in loaded[loaded.index(1.0) :] and loaded.count(1.0) >= 2

    def report(fmt: str) -> str:
        r = subprocess.run(
            ["vramlab", "report", run_id, "--db", str(db), "--format", fmt],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    md = report("md")
    if os.environ.get("VRAMLAB_TEST_SHOW"):
        Path(os.environ["VRAMLAB_TEST_SHOW"]).write_text(md)
    assert "| model_load |" in md and "| model_unload |" in md
    assert "Ollama model expired (its keep_alive ran out): tiny:1b" in md
    assert (
        "tiny:1b: 3.00 GiB in memory, 2.25 GiB on the GPU (75% GPU / 25% host: partly offloaded to the host)"
        in md
    )
    assert "Ollama's loaded models on the GPU over time" in md
    html = report("html")
    assert (
        "Ollama&#x27;s loaded models on the GPU over time" in html
        or "Ollama's loaded models on the GPU" in html
    )
    assert "<svg" in html and "model_unload: Ollama model expired" in html
    js = json.loads(report("json"))
    rows = [e for e in js["events"] if e["kind"].startswith("model_")]
    assert [e["kind"] for e in rows] == kinds
    assert rows[0]["data"]["gpu_share"] == 0.75


def test_drill_target_kind_ollama_defaults_and_its_timeline_rows() -> None:
    from vramlab.drill.target import TargetSpec

    spec = TargetSpec(kind="ollama", environment="test")
    assert (spec.unit, spec.base_url, spec.engine, spec.health_path) == (
        "ollama",
        "http://127.0.0.1:11434",
        "ollama",
        "/",
    )
    assert spec.templates()["logs"].startswith("journalctl -u {unit}")
    moved = TargetSpec(
        kind="ollama",
        environment="test",
        base_url="http://127.0.0.1:9999",
        commands={"restart": "docker restart ollama"},
    )
    assert (
        moved.base_url == "http://127.0.0.1:9999" and moved.templates()["restart"] == "docker restart ollama"
    )


def test_drill_on_kind_ollama_puts_loads_and_unloads_on_the_incident_timeline(
    tmp_path: Path, ollama: FakeOllama
) -> None:
    from vramlab.drill.kind import DrillKind
    from vramlab.drill.plan import parse_plan
    from vramlab.drill.start import run_drill_kind
    from vramlab.report import load_context, render
    from vramlab.store import open_store

    ollama.keep_alive_s = 1.0
    store = open_store(str(tmp_path / "s.db"))
    doc = {
        "name": "ollama-drill",
        "rounds": 1,
        "baseline_s": 0.5,
        "sample_interval_s": 0.2,
        # the unit's systemctl commands cannot run here: the two the drill uses while watching are replaced
        "target": {
            "kind": "ollama",
            "environment": "test",
            "base_url": ollama.url,
            "model": "tiny:1b",
            "commands": {"status": "true", "logs": "true"},
        },
        "load": {"concurrency": 1, "prompt_tokens": 8, "max_tokens": 2},
        "ramp": {"knob": "concurrency", "start": 1, "factor": 2, "ceiling": 2, "step_s": 1.5},
        "stop": {"wall_clock_s": 4.0},
    }

    async def go() -> str:
        r = DrillKind(parse_plan(doc), store, workdir=str(tmp_path / "w"))
        await asyncio.wait_for(run_drill_kind(r, store), 30)
        return r.run_id

    rid = asyncio.run(go())
    events = [e for e in store.events(rid) if e.kind.startswith("model_")]
    assert [e.kind for e in events][:3] == ["model_load", "model_unload", "model_load"], events
    assert any(s.source == "ollama" and s.name == "ollama.model_vram_bytes" for s in store.samples(rid))
    md = render(load_context(store, rid), "md")
    timeline = md.split("## Timeline", 1)[1].split("\n## ", 1)[0]
    assert "| model_load | target | Ollama model loaded: tiny:1b" in timeline
    assert "| model_unload | target | Ollama model expired (its keep_alive ran out): tiny:1b" in timeline
