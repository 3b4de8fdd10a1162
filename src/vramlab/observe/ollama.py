"""Ollama's loaded models, from its own API: `GET /api/ps` each sample interval.

Ollama loads a model at its first request and unloads it when its `keep_alive` runs out (5 minutes
by default), when another model needs the memory, or on `keep_alive: 0`. `/api/ps` lists what is
loaded now, one entry per model: `name`, `model`, `size` (bytes in memory: GPU and host together),
`size_vram` (of those, bytes in GPU memory), `digest`, `details`, `expires_at` (when keep_alive
unloads it) and, in newer releases, `context_length` (the context it was loaded with). A model with
`size_vram` < `size` runs partly on the host (the PROCESSOR column of `ollama ps` says
"48%/52% CPU/GPU"); `size_vram` 0 means all of it on the host.

Samples (source `ollama`), per model (label `model`): `ollama.model_size_bytes`,
`ollama.model_vram_bytes`; and for the server: `ollama.models_loaded`, `ollama.vram_bytes` (sum of
size_vram). Events (timeline rows), from the difference between two polls:

- `model_load`: a model appeared (name, size, size_vram, the share on the GPU); the first poll
  reports what was already loaded when sampling began, saying so.
- `model_unload`: a model is gone: "expired" when its `expires_at` had passed (keep_alive),
  "evicted" when another model appeared in the same poll, else "unloaded".
- `model_offload`: a loaded model's size_vram changed (its GPU/host split changed, e.g. a reload
  with another context).

Bounded like every poller (vramlab.observe.http): `/api/ps` is read up to `MAX_PS_BYTES` and parsed
off the event loop when large, and at most `MAX_MODELS` of its entries are followed (Ollama keeps
3 per GPU loaded by default, OLLAMA_MAX_LOADED_MODELS); a longer list is read in part, said once.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any

from vramlab.observe import http
from vramlab.observe.base import Sample, Sampler, SourceUnavailable
from vramlab.records import emit as E
from vramlab.records.emit import Draft
from vramlab.records.event_payloads import OllamaModelData

MAX_PS_BYTES = (
    256 * http.KIB
)  # ~300 bytes a model: ~800 entries, where Ollama holds a few (parsing more would hold the loop)
MAX_VERSION_BYTES = 64 * http.KIB
MAX_MODELS = 256


@dataclass(frozen=True)
class LoadedModel:
    name: str
    size: int  # bytes in memory, GPU and host together
    size_vram: int  # of those, bytes in GPU memory
    digest: str = ""
    expires_at: str | None = None
    context_length: int | None = None

    @property
    def gpu_share(self) -> float:
        return 1.0 if self.size <= 0 else min(1.0, max(0.0, self.size_vram / self.size))

    def placement(self) -> str:
        """Where it runs, in words: '100% GPU', 'all on the host (CPU), ...', or the split
        ('81% GPU / 19% host: partly offloaded to the host')."""
        share = self.gpu_share
        if self.size_vram >= self.size:
            return "100% GPU"
        if self.size_vram <= 0:
            return "all on the host (CPU), none on the GPU"
        gpu = round(share * 100)
        gpu = min(99, max(1, gpu))  # a partial split is never printed as 0 % or 100 %
        return f"{gpu}% GPU / {100 - gpu}% host: partly offloaded to the host"

    def describe(self) -> str:
        ctx = "" if self.context_length is None else f", context {self.context_length}"
        return f"{self.name}: {_gib(self.size)} in memory, {_gib(self.size_vram)} on the GPU ({self.placement()}){ctx}"

    def data(self) -> OllamaModelData:
        out: OllamaModelData = {
            "model": self.name,
            "size_bytes": self.size,
            "size_vram_bytes": self.size_vram,
            "gpu_share": round(self.gpu_share, 4),
        }
        if self.context_length is not None:
            out["context_length"] = self.context_length
        if self.expires_at:
            out["expires_at"] = self.expires_at
        return out


def parse_ps(payload: Any, max_models: int | None = None) -> list[LoadedModel]:
    """The models of an `/api/ps` answer (the first *max_models* entries). Raises ValueError on an
    answer that is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("models", []), list):
        raise ValueError("/api/ps answered without a 'models' list")
    out = []
    for m in (payload.get("models") or [])[:max_models]:
        if not isinstance(m, dict):
            continue
        name = m.get("name") or m.get("model")
        size, vram = _count(m.get("size")), _count(m.get("size_vram", 0))
        if not isinstance(name, str) or size is None or vram is None:
            continue  # an entry without a name or byte counts tells nothing to record
        out.append(
            LoadedModel(
                name=name,
                size=size,
                size_vram=vram,
                digest=str(m.get("digest") or ""),
                expires_at=m.get("expires_at") if isinstance(m.get("expires_at"), str) else None,
                context_length=_count(m.get("context_length")),
            )
        )
    return out


def changes(
    before: dict[str, LoadedModel] | None, now: dict[str, LoadedModel], wall: dt.datetime | None = None
) -> list[Draft]:
    """Timeline events between two polls. `before` None: the first poll (what was loaded already)."""
    if before is None:
        return [
            E.MODEL_LOAD(
                f"Ollama model already loaded when sampling began: {m.describe()}",
                {**m.data(), "already_loaded": True},
            )
            for m in now.values()
        ]
    wall = wall or dt.datetime.now(dt.timezone.utc)
    out: list[Draft] = []
    appeared = [m for n, m in now.items() if n not in before]
    for n, m in before.items():
        if n in now:
            continue
        expired = _passed(m.expires_at, wall)
        if expired:
            how = "expired (its keep_alive ran out)"
        elif appeared:
            how = "evicted (" + ", ".join(a.name for a in appeared) + " loaded in its place)"
        else:
            how = "unloaded"
        reason = "expired" if expired else ("evicted" if appeared else "unloaded")
        out.append(
            E.MODEL_UNLOAD(
                f"Ollama model {how}: {n}, freeing {_gib(m.size_vram)} of GPU memory "
                f"and {_gib(m.size - m.size_vram)} on the host",
                {**m.data(), "reason": reason},
            )
        )
    for m in appeared:
        out.append(E.MODEL_LOAD(f"Ollama model loaded: {m.describe()}", m.data()))
    for n, m in now.items():
        old = before.get(n)
        if old is not None and old.size_vram != m.size_vram:
            out.append(
                E.MODEL_OFFLOAD(
                    f"Ollama model's GPU share changed: {n}, {_gib(old.size_vram)} → "
                    f"{_gib(m.size_vram)} on the GPU ({old.placement()} → {m.placement()})",
                    {**m.data(), "size_vram_before_bytes": old.size_vram, "size_before_bytes": old.size},
                )
            )
    return out


class OllamaSampler(Sampler):
    source = "ollama"

    def __init__(self, root: str, timeout_s: float = 2.0) -> None:
        self.root = root.rstrip("/")
        self.timeout_s = timeout_s
        self.open_note: str | None = None
        self.version: str | None = None
        self._session: Any = None
        self._seen: dict[str, LoadedModel] | None = None
        self._events: list[Draft] = []
        self._notes: list[str] = []
        self._said_many = False

    async def open(self) -> None:
        import asyncio

        import aiohttp

        self._session = http.session(self.timeout_s)
        try:
            answer = await http.get(self._session, self.root + "/api/version", MAX_VERSION_BYTES)
            body = json.loads(answer.body) if answer.status == 200 else None
        except (aiohttp.ClientError, ValueError, OSError, asyncio.TimeoutError) as exc:
            await self.close()
            raise SourceUnavailable(f"{self.root}/api/version: {type(exc).__name__}: {exc}"[:200]) from None
        if not isinstance(body, dict) or not isinstance(body.get("version"), str):
            await self.close()
            raise SourceUnavailable(
                f"{self.root}/api/version did not answer an Ollama version (is it Ollama?)"
            )
        self.version = body["version"][:40]
        self.open_note = f"sampler ollama: Ollama {self.version} at {self.root}; loaded models from /api/ps"

    async def sample(self) -> list[Sample]:
        answer = await http.get(self._session, self.root + "/api/ps", MAX_PS_BYTES)
        if answer.status != 200:
            raise ValueError(f"/api/ps answered HTTP {answer.status}")
        models, listed = await http.parse_off_loop(_read_ps, answer.body)
        if listed > MAX_MODELS and not self._said_many:
            self._said_many = True
            self._notes.append(
                f"sampler ollama: /api/ps lists {listed:,} loaded models; the first {MAX_MODELS} are followed"
            )
        now = time.perf_counter()
        current = {m.name: m for m in models}
        self._events.extend(changes(self._seen, current))
        self._seen = current
        out = [
            Sample("ollama", "ollama.models_loaded", float(len(models)), now),
            Sample("ollama", "ollama.vram_bytes", float(sum(m.size_vram for m in models)), now),
        ]
        for m in models:
            out += [
                Sample("ollama", "ollama.model_size_bytes", float(m.size), now, {"model": m.name}),
                Sample("ollama", "ollama.model_vram_bytes", float(m.size_vram), now, {"model": m.name}),
            ]
        return out

    def take_events(self) -> list[Draft]:
        out, self._events = self._events, []
        return out

    def take_notes(self) -> list[str]:
        out, self._notes = self._notes, []
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _read_ps(body: bytes) -> tuple[list[LoadedModel], int]:
    """The first MAX_MODELS models of an /api/ps body, and how many it listed."""
    payload = json.loads(body)
    listed = payload.get("models") if isinstance(payload, dict) else None
    return parse_ps(payload, MAX_MODELS), len(listed) if isinstance(listed, list) else 0


def _count(v: Any) -> int | None:
    """A byte or token count as JSON gives it; None for anything else (a bool, a negative, a string)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _passed(expires_at: str | None, wall: dt.datetime) -> bool:
    if not expires_at:
        return False
    text = expires_at.strip().replace("Z", "+00:00")
    if "." in text:  # Go prints up to 9 fractional digits; fromisoformat takes at most 6
        head, _, rest = text.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        text = head + "." + digits[:6].ljust(6, "0") + rest[len(digits) :]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when <= wall + dt.timedelta(seconds=1)  # a poll lands within a second of the expiry


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
