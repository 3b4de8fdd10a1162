"""Capture what a run held fixed without being told: engine and version, model, GPU and driver,
vramlab version, host. Every probe is short and optional; what cannot be read is left out and
said in a note, never guessed."""

from __future__ import annotations

import asyncio
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
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as s:
        for path in _VERSION_PATHS:
            try:
                async with s.get(root + path) as r:
                    if r.status == 200:
                        doc = await r.json(content_type=None)
                        v = doc.get("version") or doc.get("build_info") if isinstance(doc, dict) else None
                        if v:
                            facts["engine_version"] = str(v)
                            break
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                continue
        try:
            async with s.get(root + "/v1/models") as r:
                if r.status in (401, 403):
                    notes.append(f"target refused the API key: GET /v1/models answered HTTP {r.status}")
                elif r.status == 200:
                    doc = await r.json(content_type=None)
                    ids = [m.get("id") for m in (doc.get("data") or [])] if isinstance(doc, dict) else []
                    facts["served_models"] = ids
                    if ids and model not in ids:
                        notes.append(f"model {model!r} is not among the served models {ids}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            notes.append(f"target not reachable at {root}: {type(exc).__name__}: {exc}"[:200])
        except ValueError:
            notes.append(f"target answered /v1/models with something that is not JSON at {root}")
    if "engine_version" not in facts:
        notes.append("engine version: not reported by the target")
    return facts, notes


def python_facts() -> dict[str, Any]:
    return {"python_executable": sys.executable}
