"""The redaction layer (vramlab.redact) and the promise behind it: no secret from a URL or a header
reaches the store, a report, stdout/stderr or an event, even when the server echoes it back."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _threaded_app import serve_app
from vramlab import redact as r

VRAMLAB = [sys.executable, "-m", "vramlab"]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    r.forget_all()
    yield
    r.forget_all()


@pytest.mark.parametrize(
    "text, secret",
    [
        ("http://alice:S3cretUrlPw@host:8000/v1", "S3cretUrlPw"),
        ("POST https://TOKENasUSER123@api.example.com/v1", "TOKENasUSER123"),
        ("postgresql://vramlab:pgPassw0rd@db/vramlab", "pgPassw0rd"),
        ("Authorization: Bearer abcdEFGH12345678", "abcdEFGH12345678"),
        ('{"headers": {"Authorization": "Bearer zzTopSecret99"}}', "zzTopSecret99"),
        ("{'authorization': 'Basic YWxpY2U6czNjcmV0'}", "YWxpY2U6czNjcmV0"),
        ("Cookie: session=abcdef123456; other=1", "abcdef123456"),
        ('{"x-api-key": "plainkeyvalue"}', "plainkeyvalue"),
        ("error: invalid key sk-proj-AbCdEfGhIjKlMnOpQrSt1234", "AbCdEfGhIjKlMnOpQrSt1234"),
        ("token hf_AbCdEfGhIjKlMnOpQrStUv was refused", "hf_AbCdEfGhIjKlMnOpQrStUv"),
        ("GET /metrics?api_key=qwerty12345&x=1", "qwerty12345"),
        ('"password": "hunter2hunter2"', "hunter2hunter2"),
        ("ghp_0123456789abcdefghijABCDEFGHIJ", "0123456789abcdefghijABCDEFGHIJ"),
    ],
)
def test_patterns_mask_the_secret(text: str, secret: str) -> None:
    out = r.redact(text)
    assert secret not in out, out
    assert r.MASK in out
    assert r.redact(out) == out  # idempotent


@pytest.mark.parametrize(
    "text",
    [
        "Engine 000: Avg prompt throughput: 12.0 tokens/s, GPU KV cache usage: 3.1%",
        "http://127.0.0.1:8000/v1/chat/completions",
        "a basic experiment with token usage 0.42",
        "round 1/3 baseline: 40 requests, 0 errors, P95 120 ms",
        "api_key_env: OPENAI_API_KEY",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert r.redact(text) == text


def test_registered_values_and_url_forms() -> None:
    r.register_urls_in({"target": {"base_url": "http://bob:pa%24%24word99@h:1"}, "x": ["http://tok3nUser@h"]})
    r.register("K3yValuePlain77")
    basic = base64.b64encode(b"bob:pa$$word99").decode()
    text = f"echo: pa$$word99 pa%24%24word99 {basic} tok3nUser K3yValuePlain77"
    out = r.redact(text)
    for s in ("pa$$word99", "pa%24%24word99", basic, "tok3nUser", "K3yValuePlain77"):
        assert s not in out, out


def test_redact_obj_masks_secret_keys_and_nested_strings() -> None:
    doc = {"headers": {"Cookie": "a=b", "Accept": "json"}, "urls": ["http://u:pw12345@h"], "n": 3}
    out = r.redact_obj(doc)
    assert out["headers"] == {"Cookie": "***", "Accept": "json"}
    assert "pw12345" not in json.dumps(out) and out["n"] == 3


def test_cli_streams_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from vramlab.cli.main import main

    code = main(["report", "nothex!", "--db", "postgresql://u:LeakyPw999@127.0.0.1:1/x"])
    cap = capsys.readouterr()
    assert code == 2
    assert "LeakyPw999" not in cap.out + cap.err


# -- end to end: a server that echoes every header, secrets in every URL field ----------------

SECRETS = {
    "url_password": "S3cretUrlPw",
    "metrics_password": "M3tricsPw42",
    "health_password": "H3althPw42",
    "api_key": "K3yValuePlain77",
    "query_token": "QryT0ken555",
}


@pytest.fixture()
def echo_server() -> Iterator[str]:
    """Answers completions with a 401 whose body echoes the request's headers and URL (as some
    proxies do), /health and /metrics with the headers in the body too."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"message": f"unauthorized: {dict(request.headers)} at {request.url}"}}, status=401
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text=f"ok {dict(request.headers)}")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=f"# headers {dict(request.headers)}\nvllm:num_requests_waiting 0\n")

    def app() -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", echo)
        app.router.add_get("/v1/models", echo)
        app.router.add_get("/version", echo)
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        return app

    with serve_app(app) as port:
        yield f"127.0.0.1:{port}"


def _leak_plan(path: Path, host: str, base_url: str, key_env: str | None) -> Path:
    s = SECRETS
    path.write_text(f"""\
name: leak-check
target:
  base_url: {base_url}
  model: m
{"  api_key_env: " + key_env if key_env else ""}
  metrics_url: http://mon:{s["metrics_password"]}@{host}/metrics?token={s["query_token"]}
  health_url: http://hc:{s["health_password"]}@{host}/health
fixed:
  input:
    synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}
change:
  variable: concurrency
  steps: [1]
load:
  retry: {{base_s: 0.01, max_s: 0.02}}  # users back off after each 401: keep the windows short
phases:
  requests: 12
  drain_s: 0.2
rounds: 1
stop_conditions:
  error_rate: 1.0
  min_requests: 1000
samplers:
  interval_s: 0.1
  sources: [engine, health, host]
rollback:
  - echo rolled back from {base_url}
""")
    return path


def test_both_url_credentials_and_a_key_are_refused(tmp_path: Path) -> None:
    from vramlab.errors import ConfigError
    from vramlab.experiment.plan import load_plan

    plan = _leak_plan(tmp_path / "p.yaml", "h:1", "http://alice:pw12345@h:1", "SOME_KEY")
    with pytest.raises(ConfigError, match="user-info"):
        load_plan(plan)


def test_no_secret_leaves_the_process(tmp_path: Path, echo_server: str) -> None:
    s, host = SECRETS, echo_server
    # One run with credentials in every URL, one with the API key (HTTP carries one of the two).
    with_userinfo = _leak_plan(tmp_path / "a.yaml", host, f"http://alice:{s['url_password']}@{host}", None)
    with_key = _leak_plan(tmp_path / "b.yaml", host, f"http://{host}", "LEAK_TEST_KEY")
    db = tmp_path / "v.db"
    env = {**os.environ, "LEAK_TEST_KEY": s["api_key"], "VRAMLAB_DB": str(db)}
    outputs: list[str] = []

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*VRAMLAB, *args], capture_output=True, text=True, timeout=120, env=env)
        outputs.extend([p.stdout, p.stderr])
        return p

    ids = []
    for plan in (with_userinfo, with_key):
        run = cli("run", str(plan), "--json")
        assert run.returncode in (0, 1, 3), run.stderr
        summary = json.loads(run.stdout)
        assert summary["requests"] > 0, run.stdout + run.stderr
        assert summary["errors"] == summary["requests"]  # every request hit the echo
        assert "Traceback" not in run.stderr
        ids.append(summary["run_id"])
        cli("run", str(plan))  # the plain progress lines too
    for rid in ids:
        for fmt in ("md", "html", "json"):
            rep = cli("report", rid, "--format", fmt)
            assert rep.returncode == 0, rep.stderr
            out = tmp_path / f"r-{rid}.{fmt}"
            assert cli("report", rid, "-o", str(out)).returncode == 0
            outputs.append(out.read_text())
    cli("runs")
    cli("runs", "--json")
    from vramlab.store import open_store

    with open_store(str(db)) as store:
        errors = [q.error or "" for rid in ids for q in store.requests(rid)]
        events = [e.message for rid in ids for e in store.events(rid)]
    assert sum("unauthorized" in e for e in errors) == len(errors)  # the echo reached the column, masked
    assert any("rolled back from http://***@" in m for m in events)
    blobs = [p.read_bytes() for p in tmp_path.glob("v.db*")]  # the database, its WAL and shm
    basic = base64.b64encode(f"alice:{s['url_password']}".encode()).decode()
    leaked = [
        (name, secret)
        for name, secret in [*s.items(), ("basic", basic)]
        if any(secret in o for o in outputs) or any(secret.encode() in b for b in blobs)
    ]
    assert leaked == []


def test_the_store_masks_drill_targets_and_every_text_column(tmp_path: Path) -> None:
    """A drill's run row (target, neighbours, prometheus_url) and free-text rows, straight into the store."""
    import time

    from vramlab.records import EventRecord, RequestRecord, RunRecord, SampleRecord
    from vramlab.store import open_store

    secret = "Dr1llSecretPw"
    plan: dict[str, Any] = {
        "target": {"base_url": f"http://op:{secret}@10.0.0.5:8000"},
        "prometheus_url": f"https://p:{secret}@prom",
        "neighbours": [{"name": "n", "url": f"http://n:{secret}@10.0.0.6/health"}],
    }
    db = tmp_path / "d.db"
    with open_store(str(db)) as store:
        store.create_run(
            RunRecord(
                run_id="d0d0d0d0",
                kind="drill",
                name="x",
                plan=plan,
                started_at=time.time(),
                target={"kind": "process", "base_url": plan["target"]["base_url"]},
            )
        )
        store.add_requests(
            "d0d0d0d0",
            [
                RequestRecord(
                    run_id="d0d0d0d0",
                    round=1,
                    phase="ramp",
                    request_id="1",
                    status_code=401,
                    error=f"echo: Authorization: Basic {secret}9=",
                )
            ],
        )
        store.add_events(
            "d0d0d0d0",
            [
                EventRecord(
                    run_id="d0d0d0d0",
                    t_s=1,
                    kind="mitigation",
                    message=f"restart via http://op:{secret}@10.0.0.5",
                    data={"cmd": f"curl -H 'Cookie: s={secret}'"},
                )
            ],
        )
        store.add_samples(
            "d0d0d0d0",
            [
                SampleRecord(
                    run_id="d0d0d0d0",
                    t_s=1,
                    source="prometheus",
                    name="up",
                    value=1,
                    labels={"instance": f"http://x:{secret}@h"},
                )
            ],
        )
        store.update_run("d0d0d0d0", notes=[f"neighbour http://n:{secret}@10.0.0.6 down"], status="completed")
        assert store.get_run("d0d0d0d0").target["base_url"] == "http://***@10.0.0.5:8000"
    assert not any(secret.encode() in p.read_bytes() for p in tmp_path.glob("d.db*"))


# --- every encoding of a registered secret; a message that names a field stays readable ---------
HARD_SECRET = 'k3y"w/th\\esc+=é'


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


@pytest.mark.parametrize(
    "shape",
    [
        lambda s: json.dumps({"error": {"message": f"invalid api key {s}"}}),  # echoed inside a 500 body
        lambda s: json.dumps({"error": f"bad {s}"}, ensure_ascii=False),
        lambda s: json.dumps({"detail": f"bad {s}"}).replace("/", "\\/"),  # servers that escape slashes
        lambda s: "GET /v1/models?key=" + __import__("urllib.parse").parse.quote(s, safe=""),
        lambda s: "POST /login body=" + __import__("urllib.parse").parse.quote_plus(s),
        lambda s: "Authorization: Basic " + base64.b64encode(f"someone:{s}".encode()).decode(),
        lambda s: "echoed header " + base64.b64encode(f"ab:{s}".encode()).decode(),  # any offset, no keyword
        lambda s: "echoed header " + base64.urlsafe_b64encode(f"a:{s}".encode()).decode(),
        lambda s: f"key (hex) {s.encode().hex()}",
        lambda s: f"KEY (HEX) {s.encode().hex().upper()}",
        lambda s: f"lower-cased by a proxy: {s.lower()}",
        lambda s: f"upper-cased: {s.upper()}",
        lambda s: "twice: " + _quote(_quote(s)),
        lambda s: "three times: " + _quote(_quote(_quote(s))),
        lambda s: "json in json: " + json.dumps(json.dumps({"k": s})),
        lambda s: "escaped slashes, then JSON again: " + json.dumps(json.dumps(s).replace("/", "\\/")),
        lambda s: "<p>" + __import__("html").escape(f"echo {s}") + "</p>",
        lambda s: "every byte: " + "".join(f"%{b:02X}" for b in s.encode()),
        lambda s: "every char: " + "".join(f"\\u{ord(c):04x}" for c in s),
        lambda s: "mixed: " + _quote(s.lower()).replace("%2f", "\\/"),
    ],
)
def test_every_encoding_of_a_registered_secret_is_masked(shape) -> None:
    r.register(HARD_SECRET)
    text = shape(HARD_SECRET)
    out = r.redact(text)
    assert r.MASK in out, out
    # no readable piece of the secret is left in any of its forms
    for form in r.encodings(HARD_SECRET):
        if len(form) >= 8:
            assert form not in out, (form, out)
    assert HARD_SECRET not in out


def test_a_json_escaped_token_value_is_masked_whole() -> None:
    body = json.dumps({"token": 'ab"cd\\ef/gh', "ok": 1})
    out = r.redact(body)
    assert json.loads(out) == {"token": r.MASK, "ok": 1}


@pytest.mark.parametrize(
    "text",
    [
        "plan.yaml:3: target.api_key: field required",
        "target.api_key: unknown field",
        "password: required field is missing",
        "client_secret: Input should be a valid string",
    ],
)
def test_a_message_that_names_a_secret_field_is_not_garbled(text: str) -> None:
    assert r.redact(text) == text


def test_a_value_after_a_secret_field_is_still_masked() -> None:
    assert r.redact("password: hunter2x") == "password: ***"
    assert r.redact("api_key=field") == "api_key=***"  # an assignment is always a value


def test_basic_blob_of_letters_only_is_masked_when_it_decodes_to_a_pair() -> None:
    blob = base64.b64encode(b"erin:letmein").decode()
    assert "=" not in blob and not any(c.isdigit() for c in blob)
    assert r.redact(f"Authorization: Basic {blob}") == "Authorization: ***"
    assert r.redact("a Basic experiment") == "a Basic experiment"


@pytest.fixture()
def escaping_server() -> Iterator[str]:
    """Answers every completion with a 500 whose JSON body carries the request's Authorization
    value JSON-escaped (a quote, a backslash and a slash in the key become \\", \\\\ and \\/)."""
    from aiohttp import web

    async def fail(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        body = json.dumps({"error": {"message": f"upstream rejected {auth}", "token": auth.split()[-1]}})
        return web.Response(text=body.replace("/", "\\/"), status=500, content_type="application/json")

    def app() -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", fail)
        return app

    with serve_app(app) as port:
        yield f"127.0.0.1:{port}"


def test_a_key_echoed_json_escaped_in_a_500_body_is_not_stored(tmp_path: Path, escaping_server: str) -> None:
    key = 'Esc"aped\\Key/42+xyz'
    plan = tmp_path / "p.yaml"
    plan.write_text(f"""\
name: escaped-echo
target: {{base_url: "http://{escaping_server}", model: m, api_key_env: ESCAPED_KEY}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [1]}}
load: {{retry: {{base_s: 0.01, max_s: 0.02}}}}
phases: {{requests: 6, drain_s: 0.2}}
rounds: 1
stop_conditions: {{error_rate: 1.0, min_requests: 1000}}
samplers: {{interval_s: 0.1, sources: [host]}}
""")
    db = tmp_path / "v.db"
    env = {**os.environ, "ESCAPED_KEY": key, "VRAMLAB_DB": str(db)}
    run = subprocess.run(
        [*VRAMLAB, "run", str(plan), "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode in (0, 1, 3) and "Traceback" not in run.stderr, run.stderr
    summary = json.loads(run.stdout)
    assert summary["requests"] > 0 and summary["errors"] == summary["requests"]
    rep = subprocess.run(
        [*VRAMLAB, "report", summary["run_id"], "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    from vramlab.store import open_store

    with open_store(str(db)) as store:
        errors = [q.error or "" for q in store.requests(summary["run_id"])]
    assert errors and all("upstream rejected" in e for e in errors), errors[:2]  # the body reached the column
    forms = {key, json.dumps(key)[1:-1], json.dumps(key)[1:-1].replace("/", "\\/"), "Aped", "Key\\/42"}
    blobs = b"".join(p.read_bytes() for p in tmp_path.glob("v.db*")).decode("latin-1")
    texts = [run.stdout, run.stderr, rep.stdout, rep.stderr, blobs]
    assert [f for f in forms if any(f in t for t in texts)] == []


def test_a_secret_in_an_encoding_is_masked_whatever_else_is_in_the_text() -> None:
    """The anchors that keep redaction cheap never skip a text that holds the secret."""
    r.register("Ab/Cd+EfGh/IjKl42")
    for text in ("x " * 10_000 + "Ab%252FCd%252BEfGh%252FIjKl42", "Ab\\\\/cd+efgh\\\\/ijkl42 at the start"):
        assert "EfGh" not in r.redact(text) and "efgh" not in r.redact(text)
    assert r.redact("ordinary words: abcd efgh ijkl 42") == "ordinary words: abcd efgh ijkl 42"


def test_urls_inside_plan_text_and_query_tokens_are_registered() -> None:
    r.register_urls_in(
        {
            "name": "ramp against http://ops:N4meLeak%40pw@10.0.0.5:8000 (prod)",
            "target": {
                "metrics_url": "http://h/metrics?api_key=QueryKey987&x=1",
                "base_url": "http://u:p@ss99@h",
            },
        }
    )
    out = r.redact("echoed: N4meLeak@pw / N4meLeak%40pw, QueryKey987, p@ss99, p%40ss99")
    for leak in ("N4meLeak", "QueryKey987", "ss99"):
        assert leak not in out, out
    assert r.redact("http://u:p@ss99@h/x") == "http://***@h/x"  # the user-info runs to the last '@'


def test_run_json_stdout_masks_a_key_echoed_with_escaped_slashes(tmp_path: Path) -> None:
    """The echo ends up in the run's stop_reason, which `run --json` prints JSON-escaped once more."""
    from aiohttp import web

    async def fail(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "").split()[-1]
        return web.Response(
            text='{"error": {"message": "bad key ' + json.dumps(auth).replace("/", "\\/") + '"}}',
            status=401,
            content_type="application/json",
        )

    def app() -> web.Application:
        a = web.Application()
        a.router.add_post("/v1/chat/completions", fail)
        return a

    key = "Ab/Cd+EfGh/IjKl42"
    with serve_app(app) as port:
        plan = tmp_path / "p.yaml"
        plan.write_text(f"""\
name: escaped-stop-reason
target: {{base_url: "http://127.0.0.1:{port}", model: m, api_key_env: SLASHED_KEY}}
fixed: {{input: {{synthetic: {{prompt_tokens: 8, output_tokens: 2, seed: 1, count: 4}}}}}}
change: {{variable: concurrency, steps: [1]}}
load: {{retry: {{base_s: 0.01, max_s: 0.02}}}}
phases: {{requests: 6, drain_s: 0.2}}
rounds: 1
samplers: {{interval_s: 0.1, sources: [host]}}
""")
        env = {**os.environ, "SLASHED_KEY": key, "VRAMLAB_DB": str(tmp_path / "v.db")}
        run = subprocess.run(
            [*VRAMLAB, "run", str(plan), "--json"], capture_output=True, text=True, timeout=120, env=env
        )
    assert run.returncode == 3, run.stderr  # the baseline broke on the 401s: its words are in stop_reason
    assert "the server said" in json.loads(run.stdout)["stop_reason"]
    blobs = b"".join(p.read_bytes() for p in tmp_path.glob("v.db*")).decode("latin-1")
    for text in (run.stdout, run.stderr, blobs):
        assert "EfGh" not in text and "IjKl" not in text, text[-600:]
