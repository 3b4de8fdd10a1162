"""Capture what a run held fixed without being told: engine and version, model, GPU and driver,
vramlab version, host. Every probe is short and optional; what cannot be read is left out and
said in a note, never guessed."""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import sys
from typing import Any

from vramlab import __version__

_VERSION_PATHS = ("/version", "/info", "/props", "/api/version")  # vLLM/SGLang/sim, TGI, llama.cpp, Ollama


def host_facts() -> dict[str, Any]:
    out: dict[str, Any] = {
        "vramlab_version": __version__,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
    try:
        import psutil

        out["cpu_count"] = psutil.cpu_count()
        out["ram_total_bytes"] = int(psutil.virtual_memory().total)
    except Exception:  # psutil is a dependency, but a sandbox may deny /proc
        pass
    return out


def gpu_facts(nvml: Any = None) -> dict[str, Any]:
    from vramlab.observe.base import SourceUnavailable
    from vramlab.observe.nvml import NvmlDevices

    try:
        d = NvmlDevices(nvml)
    except SourceUnavailable:
        return {}
    try:
        n = d.device_count()
        out: dict[str, Any] = {"gpu_count": n, "driver": d.driver_version()}
        if n:
            out["gpu_name"] = d.name(0)
            out["gpu_memory_bytes"] = d.memory_info(0)[0]
        return out
    except Exception:
        return {}
    finally:
        d.close()


async def engine_facts(
    base_url: str, headers: dict[str, str], model: str
) -> tuple[dict[str, Any], list[str]]:
    """Engine version and whether the model is served; (facts, notes)."""
    import aiohttp

    root = base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    facts: dict[str, Any] = {}
    notes: list[str] = []
    from vramlab.observe import http

    async with http.session(2.0, headers) as s:  # bounded like the pollers: a huge answer is not read
        for path in _VERSION_PATHS:
            try:
                answer = await http.get(s, root + path, 64 * http.KIB)
                if answer.status == 200:
                    doc = json.loads(answer.body)
                    v = doc.get("version") or doc.get("build_info") if isinstance(doc, dict) else None
                    if v:
                        facts["engine_version"] = str(v)[:80]
                        break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                continue
        try:
            answer = await http.get(s, root + "/v1/models", 4 * http.MIB)
            if answer.status in (401, 403):
                notes.append(f"target refused the API key: GET /v1/models answered HTTP {answer.status}")
            elif answer.status == 200:
                doc = await http.parse_off_loop(json.loads, answer.body)
                data = doc.get("data") if isinstance(doc, dict) else None
                ids = (
                    [m.get("id") for m in data[:100] if isinstance(m, dict)] if isinstance(data, list) else []
                )
                facts["served_models"] = ids
                if ids and model not in ids:
                    notes.append(f"model {model!r} is not among the served models {ids[:10]}"[:300])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            notes.append(f"target not reachable at {root}: {type(exc).__name__}: {exc}"[:200])
        except ValueError as exc:  # not JSON, or over the bound (vramlab.observe.http)
            notes.append(f"target's /v1/models at {root} could not be read: {exc}"[:300])
    if "engine_version" not in facts:
        notes.append("engine version: not reported by the target")
    return facts, notes


def python_facts() -> dict[str, Any]:
    return {"python_executable": sys.executable}
