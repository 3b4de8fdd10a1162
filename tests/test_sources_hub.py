"""The Hub reader against a stand-in Hub on 127.0.0.1: range requests, cache, offline, errors.

The stand-in serves `/{repo}/resolve/{revision}/{file}` like huggingface.co: Range requests
answered with 206, LFS files redirected to a CDN path, gated repos needing a bearer token, and
every request and body byte counted, so the tests can prove that tensor data never travels.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from _sources_files import TINY_LLAMA_CONFIG, safetensors_bytes, tiny_llama_bytes, write_sharded_model
from vramlab.errors import ConfigError, NotFoundError
from vramlab.sources import resolve_model
from vramlab.sources.hub import HubClient


class StandInHub:
    def __init__(self):
        self.files: dict[str, bytes] = {}  # "owner/name/revision/file" -> bytes
        self.gated: dict[str, str] = {}  # repo -> token it needs
        self.honour_range = True
        self.requests: list[tuple[str, str | None]] = []
        self.body_bytes: dict[str, int] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Range")))
                m = re.match(r"^/(?:cdn/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
                if not m:
                    return self._send(404, b"")
                repo, rev, name = m.groups()
                need = hub.gated.get(repo)
                if need and self.headers.get("Authorization") != f"Bearer {need}" and not self.path.startswith("/cdn/"):
                    return self._send(401, b"")
                data = hub.files.get(f"{repo}/{rev}/{name}")
                if data is None:
                    return self._send(404, b"")
                if name.endswith(".safetensors") and not self.path.startswith("/cdn/"):
                    self.send_response(302)  # the Hub sends LFS files to a CDN
                    self.send_header("Location", "/cdn" + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                rng = self.headers.get("Range")
                if rng and hub.honour_range:
                    a, b = (int(x) for x in re.match(r"bytes=(\d+)-(\d+)", rng).groups())
                    part = data[a : b + 1]
                    return self._send(206, part, name, {"Content-Range": f"bytes {a}-{a + len(part) - 1}/{len(data)}"})
                return self._send(200, data, name)

            def _send(self, code, body, name="", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # Counted before writing, so the count is there when the client has its answer.
                hub.body_bytes[name] = hub.body_bytes.get(name, 0) + len(body)
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: fine
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def add_repo(self, repo: str, files: dict[str, bytes], revision: str = "main"):
        for name, data in files.items():
            self.files[f"{repo}/{revision}/{name}"] = data


@pytest.fixture
def hub(tmp_path):
    h = StandInHub()
    h.thread.start()
    yield h
    h.server.shutdown()
    h.server.server_close()


@pytest.fixture
def sharded(tmp_path):
    return write_sharded_model(tmp_path / "src")


def client(hub, tmp_path, **kw):
    return HubClient(endpoint=hub.url, cache_dir=tmp_path / "cache", token=kw.pop("token", ""), **kw)


def test_sharded_repo_by_range_requests_never_downloads_tensor_data(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    spec = client(hub, tmp_path).spec("acme/tiny")
    assert spec.weights_bytes_exact == tiny_llama_bytes() and spec.weights_source == "safetensors headers"
    assert spec.hf_id == "acme/tiny" and hub.url in spec.source
    assert spec.num_layers == 2 and spec.num_kv_heads == 2
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        header_len = int.from_bytes(sharded[shard][:8], "little")
        assert hub.body_bytes[shard] == 8 + header_len < len(sharded[shard])
        ranges = [r for p, r in hub.requests if p.startswith("/cdn/") and p.endswith(shard)]
        assert ranges == ["bytes=0-7", f"bytes=8-{8 + header_len - 1}"]


def test_second_lookup_is_served_from_the_disk_cache(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    first = client(hub, tmp_path).spec("acme/tiny")
    n = len(hub.requests)
    again = client(hub, tmp_path).spec("acme/tiny")  # a new client: only the disk cache is shared
    assert len(hub.requests) == n
    assert again.weights_bytes_exact == first.weights_bytes_exact
    offline = client(hub, tmp_path, offline=True).spec("acme/tiny")
    assert len(hub.requests) == n and offline.weights_bytes_by_dtype == first.weights_bytes_by_dtype


def test_offline_with_a_cold_cache_errors_without_network(hub, tmp_path, monkeypatch):
    hub.add_repo("acme/tiny", {"config.json": json.dumps(TINY_LLAMA_CONFIG).encode()})
    with pytest.raises(ConfigError, match="--offline"):
        client(hub, tmp_path, offline=True).spec("acme/tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        client(hub, tmp_path).spec("acme/tiny")
    assert hub.requests == []


def test_missing_repo_is_a_clear_404(hub, tmp_path):
    with pytest.raises(NotFoundError, match="no config.json at revision 'main'.*HTTP 404"):
        client(hub, tmp_path).spec("acme/nothing")


def test_single_file_repo_and_repo_without_safetensors(hub, tmp_path):
    from _sources_files import tiny_llama_tensors

    cfg = json.dumps(TINY_LLAMA_CONFIG).encode()
    hub.add_repo("acme/single", {"config.json": cfg,
                                 "model.safetensors": safetensors_bytes(tiny_llama_tensors(range(2)))})
    hub.add_repo("acme/bare", {"config.json": cfg})
    assert client(hub, tmp_path).spec("acme/single").weights_bytes_exact == tiny_llama_bytes()
    bare = client(hub, tmp_path).spec("acme/bare")
    assert bare.weights_bytes_exact is None and bare.num_layers == 2
    n = len(hub.requests)
    client(hub, tmp_path).spec("acme/bare")  # the 404s are cached too
    assert len(hub.requests) == n


def test_gated_repo_needs_the_token(hub, tmp_path, sharded):
    hub.add_repo("acme/gated", sharded)
    hub.gated["acme/gated"] = "s3cret"
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        client(hub, tmp_path).spec("acme/gated")
    spec = client(hub, tmp_path, token="s3cret").spec("acme/gated")
    assert spec.weights_bytes_exact == tiny_llama_bytes()


def test_server_that_ignores_range_still_yields_only_the_header(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    hub.honour_range = False
    spec = client(hub, tmp_path).spec("acme/tiny")
    assert spec.weights_bytes_exact == tiny_llama_bytes()


def test_revision_is_part_of_the_url_and_the_cache(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded, revision="v1.0")
    c = client(hub, tmp_path)
    assert c.spec("acme/tiny", "v1.0").weights_bytes_exact == tiny_llama_bytes()
    with pytest.raises(NotFoundError):
        c.spec("acme/tiny", "main")


def test_unreachable_endpoint_and_bad_ids(tmp_path):
    c = HubClient(endpoint="http://127.0.0.1:9", cache_dir=tmp_path, token="")
    with pytest.raises(ConfigError, match="cannot reach"):
        c.spec("acme/tiny")
    with pytest.raises(ConfigError, match="not a Hugging Face repo id"):
        c.spec("../etc/passwd")
    with pytest.raises(ConfigError, match="not a valid revision"):
        c.spec("acme/tiny", "../../x")


def test_resolve_model_uses_hf_endpoint_and_the_cache_dir(hub, tmp_path, sharded, monkeypatch):
    hub.add_repo("acme/tiny", sharded)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("VRAMLAB_CACHE_DIR", str(tmp_path / "vc"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ConfigError, match="--offline"):
        resolve_model("acme/tiny")  # offline by default
    assert hub.requests == []
    spec = resolve_model("acme/tiny", offline=False)
    assert spec.weights_bytes_exact == tiny_llama_bytes()
    assert (tmp_path / "vc" / "hub" / "acme--tiny" / "main" / "config.json").is_file()
    n = len(hub.requests)
    assert resolve_model("acme/tiny").weights_bytes_exact == tiny_llama_bytes()  # offline, from cache
    assert len(hub.requests) == n


def test_catalog_hub_ids_resolve_offline_without_any_request(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct", offline=False)
    assert spec.name == "llama-3.1-8b-instruct" and hub.requests == []
