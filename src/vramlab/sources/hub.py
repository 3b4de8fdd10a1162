"""Model facts from a Hugging Face Hub repository: config.json and safetensors headers only.

Weights are sized from the shards' headers, fetched with HTTP range requests (the first 8 bytes
for the header length, then exactly the header), so no tensor data is ever downloaded. Answers
are cached on disk per repository and revision (`~/.cache/vramlab/hub/`, or
`$VRAMLAB_CACHE_DIR/hub/`); offline mode (`offline=True` or `HF_HUB_OFFLINE=1`) reads only the
cache. `HF_ENDPOINT` and `HF_TOKEN` are honoured as huggingface_hub honours them.

The HTTP client is a small `Transport` interface; the default uses urllib (no import cost, and a
streamed body we can stop reading after the bytes we asked for).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
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
_MAX_JSON_BYTES = 50_000_000  # config.json and index files are kilobytes; refuse anything absurd


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


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes


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
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 (http/https only)
                return HttpResponse(resp.status, resp.read(max_bytes))
        except urllib.error.HTTPError as exc:
            with exc:
                return HttpResponse(exc.code, b"")


class HubClient:
    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        offline: bool = False,
        transport: Transport | None = None,
    ):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"HF_ENDPOINT must be an http(s) URL, got {self.endpoint!r}")
        self.token = token if token is not None else (os.environ.get("HF_TOKEN") or None)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.offline = offline or env_offline()
        self.transport: Transport = transport or UrllibTransport()

    # --- paths and cache ---------------------------------------------------------------------
    def _repo_dir(self, repo: str, revision: str) -> Path:
        return self.cache_dir / repo.replace("/", "--") / revision.replace("/", "--")

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
            f"{repo}: {what} is not in the local Hub cache ({self.cache_dir}) and offline mode is on "
            "(--offline or HF_HUB_OFFLINE=1); run once without --offline to fetch it"
        )

    # --- HTTP --------------------------------------------------------------------------------
    def _get(self, repo: str, revision: str, filename: str, max_bytes: int,
             byte_range: tuple[int, int] | None = None) -> HttpResponse:
        headers = {"User-Agent": "vramlab"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if byte_range is not None:
            headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
        url = self._url(repo, revision, filename)
        try:
            resp = self.transport.get(url, headers, max_bytes)
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ConfigError(
                f"cannot reach {self.endpoint} for {repo} ({reason}); "
                "use --offline with a catalog model or one fetched before"
            ) from None
        if resp.status in (401, 403):
            raise ConfigError(
                f"{repo}: access denied to {filename} (HTTP {resp.status}); the repo may be gated or "
                "private: accept its licence on the Hub and set HF_TOKEN"
            )
        return resp

    def _json_file(self, repo: str, revision: str, filename: str, *, required: bool) -> Any:
        """A small JSON file from the repo, cached; None when absent and not required."""
        cached = self._repo_dir(repo, revision) / filename
        missing = cached.with_name(cached.name + ".absent")
        if cached.is_file():
            return _loads(cached.read_bytes(), f"{repo}/{filename} (cached)")
        if missing.is_file() and not required:
            return None
        if self.offline:
            raise self._offline_miss(repo, filename)
        resp = self._get(repo, revision, filename, _MAX_JSON_BYTES)
        if resp.status == 404:
            if required:
                raise NotFoundError(
                    f"{repo}: no {filename} at revision {revision!r} on {self.endpoint} (HTTP 404); "
                    "check the model id and revision"
                )
            self._write(missing, b"")
            return None
        if resp.status != 200:
            raise ConfigError(f"{repo}: fetching {filename} failed with HTTP {resp.status}")
        value = _loads(resp.body, f"{repo}/{filename}")
        self._write(cached, resp.body)
        return value

    def _shard_header(self, repo: str, revision: str, shard: str) -> SafetensorsHeader | None:
        """One shard's header by two range requests; cached as the raw header JSON."""
        cached = self._repo_dir(repo, revision) / (shard + ".header.json")
        where = f"{repo}/{shard}"
        if cached.is_file():
            return parse_header(cached.read_bytes(), where=where + " (cached header)")
        if self.offline:
            raise self._offline_miss(repo, f"the header of {shard}")
        first = self._get(repo, revision, shard, 8, byte_range=(0, 7))
        if first.status == 404:
            return None
        if first.status not in (200, 206):
            raise ConfigError(f"{where}: range request failed with HTTP {first.status}")
        n = parse_header_length(first.body, where=where)
        resp = self._get(repo, revision, shard, n + 8, byte_range=(8, 8 + n - 1))
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
        cfg = self._json_file(repo, revision, "config.json", required=True)
        if not isinstance(cfg, dict):
            raise ConfigError(f"{repo}/config.json is not a JSON object")
        return cfg

    def weights(self, repo: str, revision: str = "main") -> WeightsSummary | None:
        """Exact weights from safetensors headers; None when the repo has no safetensors."""
        _check_ids(repo, revision)
        index = self._json_file(repo, revision, INDEX_NAME, required=False)
        if index is not None:
            shards = shard_names_from_index(index, where=f"{repo}/{INDEX_NAME}")
        else:
            marker = self._repo_dir(repo, revision) / (SINGLE_FILE + ".absent")
            if marker.is_file():
                return None
            shards = [SINGLE_FILE]
        headers: list[tuple[str, SafetensorsHeader]] = []
        for shard in shards:
            h = self._shard_header(repo, revision, shard)
            if h is None:
                if index is not None:
                    raise ConfigError(f"{repo}: {shard} is named in {INDEX_NAME} but absent (HTTP 404)")
                self._write(self._repo_dir(repo, revision) / (SINGLE_FILE + ".absent"), b"")
                return None
            headers.append((shard, h))
        return summarize(headers)

    def spec(self, repo: str, revision: str | None = None) -> ModelSpec:
        from vramlab.sources.hf_config import spec_from_config

        rev = revision or "main"
        cfg = self.config(repo, rev)
        source = f"{self.endpoint}/{repo} config.json @ {rev}"
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


def _loads(data: bytes, where: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ConfigError(f"{where}: not valid JSON") from None
