"""The Hub reader against a stand-in Hub on 127.0.0.1: range requests, cache, offline, errors.

The stand-in serves `/{repo}/resolve/{revision}/{file}` like huggingface.co: Range requests
answered with 206, LFS files redirected to a CDN path, gated repos needing a bearer token, and
every request and body byte counted, so the tests can prove that tensor data never travels.
"""

from __future__ import annotations

import hashlib
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
        self.fail_next = 0  # answer this many requests with 503 (Retry-After: 0) first
        self.names_commits = True  # False: a mirror that sends no X-Repo-Commit
        self.requests: list[tuple[str, str | None]] = []
        self.body_bytes: dict[str, int] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Range")))
                if hub.fail_next:
                    hub.fail_next -= 1
                    return self._send(503, b"", headers={"Retry-After": "0"})
                m = re.match(r"^/(?:cdn/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
                if not m:
                    return self._send(404, b"")
                repo, rev, name = m.groups()
                rev = hub.revision_of(repo, rev)
                need = hub.gated.get(repo)
                if (
                    need
                    and self.headers.get("Authorization") != f"Bearer {need}"
                    and not self.path.startswith("/cdn/")
                ):
                    return self._send(401, b"")
                commit = {"X-Repo-Commit": hub.commit(repo, rev)} if hub.names_commits else {}
                data = hub.files.get(f"{repo}/{rev}/{name}")
                if data is None:
                    return self._send(404, b"", headers=commit)
                if name.endswith(".safetensors") and not self.path.startswith("/cdn/"):
                    self.send_response(302)  # the Hub sends LFS files to a CDN
                    self.send_header("Location", "/cdn" + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                rng = self.headers.get("Range")
                if rng and hub.honour_range:
                    m = re.match(r"bytes=(\d+)-(\d+)", rng)
                    assert m is not None, rng
                    a, b = (int(x) for x in m.groups())
                    part = data[a : b + 1]
                    return self._send(
                        206,
                        part,
                        name,
                        {"Content-Range": f"bytes {a}-{a + len(part) - 1}/{len(data)}", **commit},
                    )
                return self._send(200, data, name, commit)

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
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def add_repo(self, repo: str, files: dict[str, bytes], revision: str = "main"):
        """Set the files of *revision* (a push: a new commit when they differ)."""
        for key in [k for k in self.files if k.startswith(f"{repo}/{revision}/")]:
            del self.files[key]
        for name, data in files.items():
            self.files[f"{repo}/{revision}/{name}"] = data

    def commit(self, repo: str, revision: str) -> str:
        """The commit a revision points at: a hash of its files, as a git tree would be."""
        h = hashlib.sha1(f"{repo}@{revision}".encode())
        for key in sorted(k for k in self.files if k.startswith(f"{repo}/{revision}/")):
            h.update(key.encode() + self.files[key])
        return h.hexdigest()

    def revision_of(self, repo: str, rev: str) -> str:
        """A commit id in a URL stands for the revision it is the head of."""
        revs = {k.split("/")[2] for k in self.files if k.startswith(f"{repo}/")}
        return next((r for r in revs if self.commit(repo, r) == rev), rev)


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


def test_second_lookup_revalidates_with_one_small_request(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    first = client(hub, tmp_path).spec("acme/tiny")
    n = len(hub.requests)
    hub.body_bytes.clear()
    again = client(hub, tmp_path).spec("acme/tiny")  # a new client: only the disk cache is shared
    assert [p for p, _ in hub.requests[n:]] == ["/acme/tiny/resolve/main/config.json"]
    assert hub.body_bytes == {"config.json": len(sharded["config.json"])}  # same commit: nothing else
    assert again.weights_bytes_exact == first.weights_bytes_exact
    offline = client(hub, tmp_path, offline=True).spec("acme/tiny")
    assert len(hub.requests) == n + 1 and offline.weights_bytes_by_dtype == first.weights_bytes_by_dtype


def test_a_branch_that_moved_is_read_again_and_a_commit_never_is(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    old_commit = hub.commit("acme/tiny", "main")
    assert client(hub, tmp_path).spec("acme/tiny").num_layers == 2
    cfg = {**TINY_LLAMA_CONFIG, "num_hidden_layers": 3}
    hub.add_repo("acme/tiny", {"config.json": json.dumps(cfg).encode()})  # main moves: no safetensors now
    moved = client(hub, tmp_path).spec("acme/tiny")
    assert moved.num_layers == 3 and moved.weights_bytes_exact is None
    assert hub.commit("acme/tiny", "main")[:12] in moved.source
    assert client(hub, tmp_path, offline=True).spec("acme/tiny").num_layers == 3  # offline follows the ref
    n = len(hub.requests)
    pinned = client(hub, tmp_path).spec("acme/tiny", old_commit)  # the old commit, from the cache alone
    assert (
        len(hub.requests) == n and pinned.num_layers == 2 and pinned.weights_bytes_exact == tiny_llama_bytes()
    )


def test_absent_files_are_cached_per_commit_not_for_good(hub, tmp_path, sharded):
    cfg = json.dumps(TINY_LLAMA_CONFIG).encode()
    hub.add_repo("acme/late", {"config.json": cfg})
    assert client(hub, tmp_path).spec("acme/late").weights_bytes_exact is None
    hub.add_repo("acme/late", sharded)  # the weights are pushed later: a new commit
    assert client(hub, tmp_path).spec("acme/late").weights_bytes_exact == tiny_llama_bytes()


def test_busy_hub_and_dropped_connections_are_retried(hub, tmp_path, sharded):
    hub.add_repo("acme/tiny", sharded)
    hub.fail_next = 2
    spec = client(hub, tmp_path, backoff_s=0.01).spec("acme/tiny")
    assert spec.weights_bytes_exact == tiny_llama_bytes()
    assert [p for p, _ in hub.requests[:3]] == ["/acme/tiny/resolve/main/config.json"] * 3
    hub.fail_next = 3
    with pytest.raises(ConfigError, match="HTTP 503"):
        client(hub, tmp_path / "other", backoff_s=0.01).spec("acme/tiny")


def test_the_token_comes_from_hf_token_or_the_login_file(hub, tmp_path, sharded, monkeypatch):
    hub.add_repo("acme/gated", sharded)
    hub.gated["acme/gated"] = "s3cret"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("s3cret\n")  # what `hf auth login` writes
    fresh = lambda name: HubClient(endpoint=hub.url, cache_dir=tmp_path / name)  # noqa: E731
    assert fresh("a").spec("acme/gated").weights_bytes_exact == tiny_llama_bytes()
    other = tmp_path / "elsewhere-token"
    other.write_text("wrong")
    monkeypatch.setenv("HF_TOKEN_PATH", str(other))
    with pytest.raises(ConfigError, match="hf auth login") as exc:
        fresh("b").spec("acme/gated")
    assert "wrong" not in str(exc.value)
    monkeypatch.setenv("HF_TOKEN", "s3cret")  # the variable wins over any file
    assert fresh("c").spec("acme/gated").num_layers == 2


def test_offline_with_a_cold_cache_errors_without_network(hub, tmp_path, monkeypatch):
    hub.add_repo("acme/tiny", {"config.json": json.dumps(TINY_LLAMA_CONFIG).encode()})
    with pytest.raises(ConfigError, match="--offline"):
        client(hub, tmp_path, offline=True).spec("acme/tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        client(hub, tmp_path).spec("acme/tiny")
    assert hub.requests == []


def test_the_hint_names_the_callers_own_switch(hub, tmp_path, monkeypatch):
    """`vramlab models` and `calibrate` turn the Hub on with --online; plan turns it off with --offline."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("VRAMLAB_CACHE_DIR", str(tmp_path / "vc"))
    hub.add_repo("acme/tiny", {"config.json": json.dumps(TINY_LLAMA_CONFIG).encode()})
    quiet = HubClient(
        endpoint=hub.url, cache_dir=tmp_path, token="", offline=True, online_hint="pass --online"
    )
    with pytest.raises(ConfigError, match="pass --online to fetch it") as exc:
        quiet.spec("acme/tiny")
    assert "--offline" not in str(exc.value)
    down = HubClient(
        endpoint="http://127.0.0.1:9",
        cache_dir=tmp_path,
        token="",
        backoff_s=0.01,
        online_hint="pass --online",
    )
    with pytest.raises(ConfigError, match="leave out --online with a catalog model") as exc:
        down.spec("acme/tiny")
    assert "--offline" not in str(exc.value)
    with pytest.raises(ConfigError, match="pass --online to read its config") as exc:
        resolve_model("acme/tiny", online_hint="pass --online")
    assert "--offline" not in str(exc.value)


def test_missing_repo_is_a_clear_404(hub, tmp_path):
    with pytest.raises(NotFoundError, match="no config.json at revision 'main'.*HTTP 404"):
        client(hub, tmp_path).spec("acme/nothing")


def test_single_file_repo_and_repo_without_safetensors(hub, tmp_path):
    from _sources_files import tiny_llama_tensors

    cfg = json.dumps(TINY_LLAMA_CONFIG).encode()
    hub.add_repo(
        "acme/single",
        {"config.json": cfg, "model.safetensors": safetensors_bytes(tiny_llama_tensors(range(2)))},
    )
    hub.add_repo("acme/bare", {"config.json": cfg})
    assert client(hub, tmp_path).spec("acme/single").weights_bytes_exact == tiny_llama_bytes()
    bare = client(hub, tmp_path).spec("acme/bare")
    assert bare.weights_bytes_exact is None and bare.num_layers == 2
    n = len(hub.requests)
    client(hub, tmp_path).spec("acme/bare")  # the 404s are cached too (for this commit)
    assert [p for p, _ in hub.requests[n:]] == ["/acme/bare/resolve/main/config.json"]


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
    c = HubClient(endpoint="http://127.0.0.1:9", cache_dir=tmp_path, token="", backoff_s=0.01)
    with pytest.raises(ConfigError, match="cannot reach .*3 tries"):
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
    commit = hub.commit("acme/tiny", "main")
    assert (tmp_path / "vc" / "hub" / "acme--tiny" / "commits" / commit / "config.json").is_file()
    assert (
        json.loads((tmp_path / "vc" / "hub" / "acme--tiny" / "refs" / "main").read_text())["commit"] == commit
    )
    n = len(hub.requests)
    assert resolve_model("acme/tiny").weights_bytes_exact == tiny_llama_bytes()  # offline, from cache
    assert len(hub.requests) == n


def test_catalog_hub_ids_resolve_offline_without_any_request(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct", offline=False)
    assert spec.name == "llama-3.1-8b-instruct" and hub.requests == []


def test_a_mirror_without_commit_ids_is_keyed_by_content(hub, tmp_path, sharded):
    hub.names_commits = False
    hub.add_repo("acme/tiny", sharded)
    assert client(hub, tmp_path).spec("acme/tiny").num_layers == 2
    cfg = {**TINY_LLAMA_CONFIG, "num_hidden_layers": 5}
    hub.add_repo("acme/tiny", {**sharded, "config.json": json.dumps(cfg).encode()})
    assert client(hub, tmp_path).spec("acme/tiny").num_layers == 5
    assert client(hub, tmp_path, offline=True).spec("acme/tiny").num_layers == 5
