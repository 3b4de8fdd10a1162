"""Model facts from a Hugging Face Hub repository: config.json and safetensors headers only.

Weights are sized from the shards' headers, fetched with HTTP range requests (the first 8 bytes
for the header length, then exactly the header), so no tensor data is ever downloaded.

Cache (`~/.cache/vramlab/hub/`, or `$VRAMLAB_CACHE_DIR/hub/`), keyed by commit:
    <owner>--<name>/refs/<revision>           {"commit": ...}: where the revision was last seen
    <owner>--<name>/commits/<commit>/...      config.json, the index, <shard>.header.json,
                                              <file>.absent (a file this commit does not have)
A commit never changes, so what is under it (the absent markers too) is kept for good. A branch
or tag is revalidated on every online lookup with one request for config.json (a few kB), whose
answer names the commit (`X-Repo-Commit`): when the branch moved, the new commit's index and
headers are read; when not, nothing else is requested. A revision that is a full commit id is read
from the cache without any request. Offline mode (`offline=True` or `HF_HUB_OFFLINE=1`) reads
only the cache, following refs/.

`HF_ENDPOINT` and the token are found as huggingface_hub finds them: `HF_TOKEN`, else the token
file `hf auth login` writes (`$HF_TOKEN_PATH`, else `$HF_HOME/token`, else
`$XDG_CACHE_HOME/huggingface/token`, else `~/.cache/huggingface/token`). Network errors, 429 and
5xx answers are retried (3 tries, backoff 0.5 s then 1 s, or the server's Retry-After up to 10 s).

The HTTP client is a small `Transport` interface; the default uses urllib (no import cost, and a
streamed body we can stop reading after the bytes we asked for). huggingface_hub itself is not
used: importing it costs ~0.2 s of CPU, and its safetensors reader fetches 100 kB of every shard
and asks HEAD first (measured and explained in docs/model-sources.md).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vramlab.capacity.spec import ModelSpec
from vramlab.errors import ConfigError, NotFoundError
from vramlab.sources.safetensors import (
    INDEX_NAME,
    SafetensorsHeader,
    WeightsSummary,
    parse_header,
    parse_header_length,
    shard_names_from_index,
    summarize,
    with_weights,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
SINGLE_FILE = "model.safetensors"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9_.\-/]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_MAX_JSON_BYTES = 50_000_000  # config.json and index files are kilobytes; refuse anything absurd
RETRY_STATUSES = (429, 500, 502, 503, 504)
MAX_RETRY_AFTER_S = 10.0


def looks_like_repo_id(text: str) -> bool:
    return bool(_REPO_RE.match(text)) and ".." not in text


def env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def default_cache_dir() -> Path:
    base = os.environ.get("VRAMLAB_CACHE_DIR")
    if base:
        return Path(base) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "vramlab" / "hub"


def token_path() -> Path:
    """Where `hf auth login` keeps the token (huggingface_hub's own lookup order)."""
    explicit = os.environ.get("HF_TOKEN_PATH")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "token"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "token"


def _cached(path: Path) -> bytes:
    """A file of the local cache, read as any input is (a regular file, bounded)."""
    from vramlab.infile import read_bytes

    return read_bytes(path, "cached", _MAX_JSON_BYTES)


def find_token() -> str | None:
    """`HF_TOKEN`, else the token file; None when neither holds one."""
    env = os.environ.get("HF_TOKEN", "").strip()
    if env:
        return env
    from vramlab.infile import read_text

    try:
        text = read_text(token_path(), "token", 1 << 16).strip()
    except ConfigError:  # missing, unreadable, not a file: no token
        return None
    return text or None


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class Transport(Protocol):
    def get(self, url: str, headers: dict[str, str], max_bytes: int) -> HttpResponse:
        """GET *url*; read at most *max_bytes* of the body. Network failures raise OSError."""
        ...


class UrllibTransport:
    def __init__(self, timeout_s: float = 20.0):
        self.timeout_s = timeout_s

    def get(self, url: str, headers: dict[str, str], max_bytes: int) -> HttpResponse:
        req = urllib.request.Request(url, method="GET")
        for k, v in headers.items():
            if k.lower() == "authorization":
                # Not forwarded on redirects: the Hub redirects LFS files to a CDN with signed URLs.
                req.add_unredirected_header(k, v)
            else:
                req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return HttpResponse(resp.status, resp.read(max_bytes), _lower(resp.headers.items()))
        except urllib.error.HTTPError as exc:  # 304 and every 4xx/5xx land here
            with exc:
                return HttpResponse(exc.code, b"", _lower(exc.headers.items() if exc.headers else []))


def _lower(items: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}


@dataclass(frozen=True)
class _Ref:
    """A revision pinned to a commit: the cache folder to use and the revision to put in URLs."""

    commit: str
    url_revision: str  # the commit when the Hub named it, else the revision as given


class HubClient:
    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        offline: bool = False,
        transport: Transport | None = None,
        retries: int = 3,
        backoff_s: float = 0.5,
        online_hint: str = "run once without --offline",
    ):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"HF_ENDPOINT must be an http(s) URL, got {self.endpoint!r}")
        self.token = token if token is not None else find_token()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.offline = offline or env_offline()
        self.online_hint = online_hint  # how the caller's user turns the Hub on (plan vs models)
        self.transport: Transport = transport or UrllibTransport()
        self.retries, self.backoff_s = max(1, retries), backoff_s
        self._refs: dict[tuple[str, str], _Ref] = {}  # resolved in this process: revalidate once

    # --- paths and cache ---------------------------------------------------------------------
    def _repo_root(self, repo: str) -> Path:
        return self.cache_dir / repo.replace("/", "--")

    def _ref_file(self, repo: str, revision: str) -> Path:
        return self._repo_root(repo) / "refs" / revision.replace("/", "--")

    def _commit_dir(self, repo: str, commit: str) -> Path:
        return self._repo_root(repo) / "commits" / commit

    def cached_commit(self, repo: str, revision: str) -> str | None:
        """The commit the cache holds for *revision* (a commit id is its own), or None."""
        if _COMMIT_RE.match(revision):
            return revision if (self._commit_dir(repo, revision) / "config.json").is_file() else None
        ref = self._read_ref(repo, revision)
        if ref is None or not (self._commit_dir(repo, ref["commit"]) / "config.json").is_file():
            return None
        return str(ref["commit"])

    def _read_ref(self, repo: str, revision: str) -> dict[str, Any] | None:
        from vramlab.infile import read_bytes

        try:
            ref = json.loads(read_bytes(self._ref_file(repo, revision), "cached ref"))
        except (ConfigError, ValueError):
            return None
        return ref if isinstance(ref, dict) and isinstance(ref.get("commit"), str) else None

    def _url(self, repo: str, revision: str, filename: str) -> str:
        rev = urllib.parse.quote(revision, safe="")
        return f"{self.endpoint}/{repo}/resolve/{rev}/{urllib.parse.quote(filename)}"

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file

    def _offline_miss(self, repo: str, what: str) -> ConfigError:
        return ConfigError(
            f"{repo}: {what} is not in the local Hub cache ({self.cache_dir}) and offline mode is "
            f"on; {self.online_hint}"
            + (" and unset HF_HUB_OFFLINE" if env_offline() else "")
            + " to fetch it"
        )

    # --- HTTP --------------------------------------------------------------------------------
    def _get(
        self,
        repo: str,
        revision: str,
        filename: str,
        max_bytes: int,
        byte_range: tuple[int, int] | None = None,
    ) -> HttpResponse:
        headers = {"User-Agent": "vramlab"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if byte_range is not None:
            headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
        url = self._url(repo, revision, filename)
        for attempt in range(self.retries):
            last = attempt == self.retries - 1
            try:
                resp = self.transport.get(url, headers, max_bytes)
            except OSError as exc:
                if last:
                    reason = getattr(exc, "reason", None) or exc
                    raise ConfigError(
                        f"cannot reach {self.endpoint} for {repo} ({reason}, {self.retries} tries); "
                        + ("leave out --online" if "--online" in self.online_hint else "use --offline")
                        + " with a catalog model or one fetched before"
                    ) from None
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if resp.status in RETRY_STATUSES and not last:
                time.sleep(self._retry_after(resp) or self.backoff_s * 2**attempt)
                continue
            break
        if resp.status in (401, 403):
            raise ConfigError(
                f"{repo}: access denied to {filename} (HTTP {resp.status}); the repo may be gated or "
                "private: accept its licence on the Hub and set HF_TOKEN (or log in: `hf auth login`)"
            )
        return resp

    @staticmethod
    def _retry_after(resp: HttpResponse) -> float | None:
        try:
            return min(max(float(resp.header("Retry-After") or ""), 0.0), MAX_RETRY_AFTER_S)
        except ValueError:
            return None

    def _resolve(self, repo: str, revision: str) -> _Ref:
        """Pin *revision* to a commit, fetching config.json into that commit's folder if needed."""
        if (repo, revision) in self._refs:
            return self._refs[(repo, revision)]
        if _COMMIT_RE.match(revision) and self.cached_commit(repo, revision):
            ref = _Ref(revision, revision)  # a commit never changes: no request
        elif self.offline:
            commit = self.cached_commit(repo, revision)
            if commit is None:
                raise self._offline_miss(repo, "config.json")
            ref = _Ref(commit, commit)
        else:
            ref = self._revalidate(repo, revision)
        self._refs[(repo, revision)] = ref
        return ref

    def _revalidate(self, repo: str, revision: str) -> _Ref:
        """Ask the Hub which commit *revision* is at now (config.json's answer names it in
        X-Repo-Commit); read config.json into that commit's folder when it is new here."""
        resp = self._get(repo, revision, "config.json", _MAX_JSON_BYTES)
        if resp.status == 404:
            raise NotFoundError(
                f"{repo}: no config.json at revision {revision!r} on {self.endpoint} (HTTP 404); "
                "check the model id and revision"
            )
        if resp.status != 200:
            raise ConfigError(f"{repo}: fetching config.json failed with HTTP {resp.status}")
        _loads(resp.body, f"{repo}/config.json")
        named = (resp.header("X-Repo-Commit") or "").strip().lower()
        # Without the Hub's commit header (a mirror), the content stands in for the commit.
        commit = named if _COMMIT_RE.match(named) else "content-" + _digest(resp.body)
        cached = self._commit_dir(repo, commit) / "config.json"
        if not cached.is_file():
            self._write(cached, resp.body)
        ref = {"commit": commit}
        if self._read_ref(repo, revision) != ref:
            self._write(self._ref_file(repo, revision), json.dumps(ref).encode())
        return _Ref(commit, commit if _COMMIT_RE.match(commit) else revision)

    def _json_file(self, repo: str, ref: _Ref, filename: str, *, required: bool) -> Any:
        """A small JSON file from the commit, cached; None when absent and not required."""
        cached = self._commit_dir(repo, ref.commit) / filename
        missing = cached.with_name(cached.name + ".absent")
        if cached.is_file():
            return _loads(_cached(cached), f"{repo}/{filename} (cached)")
        if missing.is_file() and not required:
            return None
        if self.offline:
            raise self._offline_miss(repo, filename)
        resp = self._get(repo, ref.url_revision, filename, _MAX_JSON_BYTES)
        if resp.status == 404:
            if required:
                raise NotFoundError(
                    f"{repo}: no {filename} at commit {ref.commit} on {self.endpoint} (HTTP 404)"
                )
            self._write(missing, b"")
            return None
        if resp.status != 200:
            raise ConfigError(f"{repo}: fetching {filename} failed with HTTP {resp.status}")
        value = _loads(resp.body, f"{repo}/{filename}")
        self._write(cached, resp.body)
        return value

    def _optional_json(self, repo: str, ref: _Ref, filename: str) -> Any:
        """A JSON file most repositories lack: None offline when it was never fetched."""
        cached = self._commit_dir(repo, ref.commit) / filename
        if self.offline and not cached.is_file():
            return None
        return self._json_file(repo, ref, filename, required=False)

    def _shard_header(self, repo: str, ref: _Ref, shard: str) -> SafetensorsHeader | None:
        """One shard's header by two range requests; cached as the raw header JSON."""
        cached = self._commit_dir(repo, ref.commit) / (shard + ".header.json")
        where = f"{repo}/{shard}"
        if cached.is_file():
            return parse_header(_cached(cached), where=where + " (cached header)")
        if self.offline:
            raise self._offline_miss(repo, f"the header of {shard}")
        first = self._get(repo, ref.url_revision, shard, 8, byte_range=(0, 7))
        if first.status == 404:
            return None
        if first.status not in (200, 206):
            raise ConfigError(f"{where}: range request failed with HTTP {first.status}")
        n = parse_header_length(first.body, where=where)
        resp = self._get(repo, ref.url_revision, shard, n + 8, byte_range=(8, 8 + n - 1))
        if resp.status == 206:
            blob = resp.body[:n]
        elif resp.status == 200:  # server ignored Range: the body starts at byte 0; stop after the header
            blob = resp.body[8 : 8 + n]
        else:
            raise ConfigError(f"{where}: range request failed with HTTP {resp.status}")
        if len(blob) < n:
            raise ConfigError(f"{where}: truncated header ({len(blob)} of {n} bytes)")
        header = parse_header(blob, where=where)
        self._write(cached, blob)
        return header

    # --- public ------------------------------------------------------------------------------
    def config(self, repo: str, revision: str = "main") -> dict[str, Any]:
        _check_ids(repo, revision)
        cfg = self._json_file(repo, self._resolve(repo, revision), "config.json", required=True)
        if not isinstance(cfg, dict):
            raise ConfigError(f"{repo}/config.json is not a JSON object")
        return cfg

    def weights(self, repo: str, revision: str = "main") -> WeightsSummary | None:
        """Exact weights from safetensors headers; None when the repo has no safetensors."""
        _check_ids(repo, revision)
        ref = self._resolve(repo, revision)
        index = self._json_file(repo, ref, INDEX_NAME, required=False)
        if index is not None:
            shards = shard_names_from_index(index, where=f"{repo}/{INDEX_NAME}")
        else:
            marker = self._commit_dir(repo, ref.commit) / (SINGLE_FILE + ".absent")
            if marker.is_file():
                return None
            shards = [SINGLE_FILE]
        headers: list[tuple[str, SafetensorsHeader]] = []
        for shard in shards:
            h = self._shard_header(repo, ref, shard)
            if h is None:
                if index is not None:
                    raise ConfigError(f"{repo}: {shard} is named in {INDEX_NAME} but absent (HTTP 404)")
                self._write(self._commit_dir(repo, ref.commit) / (SINGLE_FILE + ".absent"), b"")
                return None
            headers.append((shard, h))
        return summarize(headers)

    def spec(self, repo: str, revision: str | None = None) -> ModelSpec:
        from vramlab.sources.hf_config import spec_from_config

        rev = revision or "main"
        cfg = self.config(repo, rev)
        commit = self._refs[(repo, rev)].commit
        pinned = f" ({commit[:12]})" if _COMMIT_RE.match(commit) and commit != rev else ""
        source = f"{self.endpoint}/{repo} config.json @ {rev}{pinned}"
        if "quantization_config" not in cfg:  # ModelOpt < 0.31 keeps it beside config.json (resolve.py)
            quant = self._optional_json(repo, self._refs[(repo, rev)], "hf_quant_config.json")
            if isinstance(quant, dict):
                cfg = {**cfg, "quantization_config": quant}
        weights = self.weights(repo, rev)
        spec = spec_from_config(cfg, name=repo, source=source, hf_id=repo)
        if weights is None:
            return spec
        return with_weights(spec, weights, source + " + safetensors headers")


def _check_ids(repo: str, revision: str) -> None:
    if not looks_like_repo_id(repo):
        raise ConfigError(f"{repo!r} is not a Hugging Face repo id (owner/name)")
    if not _REVISION_RE.match(revision) or ".." in revision:
        raise ConfigError(f"{revision!r} is not a valid revision")


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()[:16]


def _loads(data: bytes, where: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ConfigError(f"{where}: not valid JSON") from None
