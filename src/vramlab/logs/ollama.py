"""Ollama server logs (docs/research/capacity-anchors.md section 3).

Old estimator (until late 2025): one `msg="offload to cuda"` / `msg=offload library=cuda` line
of `memory.*` key=value figures. These are Ollama's *estimates*, so the observation's basis is
"engine-estimate". Newer releases log real allocations per device (`msg="model weights"`,
`"kv cache"`, `"compute graph"`, `"total memory"`); since 2026 Ollama runs llama-server, whose
own lines appear in the same log and are read with the llama.cpp rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from vramlab.logs import llamacpp
from vramlab.logs.base import Rule, assemble, parse_lines, rule, sized

ENGINE = "ollama"
_KV = re.compile(r"([\w.]+)=(\"(?:[^\"\\]|\\.)*\"|\S+)")
_SIZE = re.compile(r"(-?[\d.]+) ?([KMGT]i?B|B)\b")


def _kv(text: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in _KV.findall(text)}


def _size(text: str | None) -> int | None:
    if not text:
        return None
    m = _SIZE.search(text)
    return sized(m.group(1), m.group(2)) if m else None


def _offload(m: re.Match[str]) -> dict[str, Any]:
    kv = _kv(m.group(0))
    full = kv.get("layers.offload") == kv.get("layers.model")
    out: dict[str, Any] = {
        "basis": "engine-estimate",
        "weights_bytes": _size(kv.get("memory.weights.total")),
        "kv_cache_bytes": _size(kv.get("memory.required.kv")),
        "activation_peak_bytes": _size(kv.get("memory.graph.full" if full else "memory.graph.partial")),
        "free_gpu_memory_bytes": _size(kv.get("memory.available")),
        "extra.required_bytes": _size(kv.get("memory.required.full" if full else "memory.required.partial")),
        "extra.layers_offloaded": int(kv["layers.offload"])
        if kv.get("layers.offload", "").isdigit()
        else None,
        "extra.layers_requested": int(kv["layers.requested"])
        if re.fullmatch(r"-?\d+", kv.get("layers.requested", ""))
        else None,
        "extra.graph_full_bytes": _size(kv.get("memory.graph.full")),
    }
    return out


def _device(field: str) -> Callable[[re.Match[str]], dict[str, Any] | None]:
    def extract(m: re.Match[str]) -> dict[str, Any] | None:
        kv = _kv(m.group(0))
        dev = kv.get("device") or kv.get("buffer") or kv.get("backend") or ""
        if not re.match(r"(CUDA|ROCm|Vulkan|Metal)", dev):
            return None  # host memory is not GPU memory
        num = re.search(r"(\d+)$", dev)
        return {field: _size(kv.get("size")), "_rank": f"rank={num.group(1) if num else 0}"}

    return extract


def _server_cmd(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, name in (
        ("--ctx-size", "settings.ctx_size"),
        ("--parallel", "settings.parallel"),
        ("--ubatch-size", "settings.n_ubatch"),
    ):
        f = re.search(rf"{flag}[ =](\d+)", m.group(0))
        if f:
            out[name] = int(f.group(1))
    if "--flash-attn" in m.group(0):
        out["settings.flash_attn"] = True
    return out


OWN_RULES: list[Rule] = [
    rule(
        "version",
        r"Listening on \S+ \(version ([^)]+)\)",
        lambda m: {"engine_version": m.group(1)},
        starts=True,
        shared=True,
    ),
    rule("offload", r"msg=(?:\"offload to \w+\"|offload\b).*memory\..*", _offload, once=True),
    rule("weights", r"msg=\"model weights\".*", _device("weights_bytes"), once=True),
    rule("kv", r"msg=\"kv cache\".*", _device("kv_cache_bytes")),
    rule("graph", r"msg=\"compute graph\".*", _device("activation_peak_bytes")),
    rule("server_cmd", r"msg=\"starting llama server\".*", _server_cmd, shared=True),
]
RULES = OWN_RULES + llamacpp.RULES


def parse(lines: Iterable[str]) -> list[Any]:
    startups, _ = parse_lines(lines, RULES)
    return llamacpp.post_process(assemble(ENGINE, startups, llamacpp.finish))
