"""Which era of an engine wrote a start-up, from its printed version or, failing that, its wording.

Each engine changed what it prints as it changed how it sizes memory, so the wording of the
lines a start-up printed dates it. `era_of(observation)` returns an `Era`: a label for tables,
the vLLM engine generation (V0/V1) when the wording tells it, and whether it was inferred.
Sources of the wordings: docs/research/capacity-anchors.md section 1.6 and the excerpts under
tests/fixtures/logs/real/ (sources.json).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vramlab.engines import label as engine_label


@dataclass(frozen=True)
class Era:
    engine: str
    label: str  # "vLLM V0 0.6.4-0.6.5", "llama.cpp b5912", ...
    inferred: bool  # True when no version was printed and the wording dated the log
    evidence: str  # the wording (or version line) the label rests on
    vllm_engine: str | None = None  # "v0" | "v1" for vLLM
    version_hint: str | None = None  # the first release with this wording (vLLM, when inferred)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "inferred": self.inferred, "evidence": self.evidence}
        if self.vllm_engine:
            out["vllm_engine"] = self.vllm_engine
        return out

    def sentence(self) -> str:
        if not self.inferred:
            return f"{self.label} ({self.evidence})"
        return f"{self.label}, inferred from the wording ({self.evidence}); the log prints no version"


# (pattern over the start-up's lines, label, vllm engine) in order: the first that matches wins.
_VLLM: tuple[tuple[str, str, str | None], ...] = (
    (r"Memory profiling results: total_gpu_memory=", "vLLM V0 0.6.2-0.6.3", "v0"),
    (r"Memory profiling results:\s*$|available_kv_cache_memory\s", "vLLM V0 0.6.4-0.6.5", "v0"),
    (
        r"non_torch_memory takes|the current vLLM instance can use total_gpu_memory \(",
        "vLLM V0 0.6.6-0.10",
        "v0",
    ),
    (r"# CPU blocks:", "vLLM V0 (0.3-0.10)", "v0"),
    (r"CUDA graph memory profiling is enabled|CUDA graph pool memory: .*\(actual\)", "vLLM V1 0.21+", "v1"),
    (r"Estimated CUDA graph memory|kv-cache-memory=", "vLLM V1 0.11+", "v1"),
    (r"kv_cache_utils\.py:\d+\] # GPU blocks: \d+\s*$|# GPU blocks: \d+\s*$", "vLLM V1 0.7", "v1"),
    (
        r"Available KV cache memory|GPU KV cache size|Model loading took [\d.]+ GiB|EngineCore|Worker_TP",
        "vLLM V1 0.8+",
        "v1",
    ),
    (r"Loading model weights took [\d.]+ (?:GB|MB)", "vLLM V0 0.3-0.6", "v0"),
)
_OTHER: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang": (
        (r"\[gpu_id=\d+\]", "SGLang 0.1-0.3 ([gpu_id=N] prefix)"),
        (r"KV Cache is allocated\. #tokens:", "SGLang 0.4+"),
        (r"KV Cache is allocated", "SGLang 0.3-0.4"),
    ),
    "tgi": (
        (r"router::server|Using scheduler V3", "TGI 2.2+ (scheduler V3)"),
        (r"KV-cache blocks:", "TGI 3.x"),
        (r"Setting max batch total tokens|Inferred max batch total tokens", "TGI 1.x-2.1"),
    ),
    "llama.cpp": (
        (r"sched_reserve:", "llama.cpp 2026 (sched_reserve)"),
        (r"llama_context:|llama_kv_cache:", "llama.cpp mid-2025+ (llama_context)"),
        (r"llama_init_from_model:|load_tensors:", "llama.cpp early 2025 (llama_init_from_model)"),
        (r"llama_new_context_with_model:|llm_load_tensors:", "llama.cpp 2024 (llama_new_context_with_model)"),
    ),
    "ollama": (
        (
            r"msg=\"model weights\"|msg=\"kv cache\"|msg=\"compute graph\"",
            "Ollama 0.10+ (allocations per device)",
        ),
        (r"msg=(?:\"offload to \w+\"|offload\b)", "Ollama estimator (until 0.11)"),
        (r"llama_context:|load_tensors:", "Ollama (llama.cpp runner lines)"),
        (r"llama_new_context_with_model:|llm_load_tensors:", "Ollama 2024 (llama.cpp runner lines)"),
    ),
}


def era_of(obs: Any) -> Era:
    """The era of one observation (a start-up on one rank)."""
    engine = obs.engine
    texts = [s.text for s in obs.source_lines]
    version = obs.engine_version or obs.settings.get("engine_version")
    vllm_engine = obs.settings.get("vllm_engine")
    if version:
        name = engine_label(engine)
        # Releases of one minor series share their wording and sizing: one table per series.
        series = m.group(1) if (m := re.match(r"v?(\d+\.\d+)", str(version))) else str(version)
        if engine == "vllm":
            gen = vllm_engine or _vllm_wording(texts)[1]
            label = f"vLLM {'V0' if gen == 'v0' else 'V1' if gen == 'v1' else ''} {series}".replace("  ", " ")
            return Era(engine, label, False, f"version {version} printed", gen)
        return Era(engine, f"{name} {series}", False, f"version {version} printed")
    if engine == "vllm":
        (label, gen, evidence) = _vllm_wording(texts)
        first = re.search(r"(\d+\.\d+(?:\.\d+)?)[-+ ]", label + " ")
        hint = first.group(1) if first and gen == "v0" else None
        return Era(engine, label, True, evidence, vllm_engine or gen, hint)
    for pattern, label in _OTHER.get(engine, ()):
        hit = next((t for t in texts if re.search(pattern, t)), None)
        if hit is not None:
            return Era(engine, label, True, _quote(pattern, hit))
    return Era(engine, f"{engine_label(engine)} (era unknown)", True, "no dated wording in the excerpt")


def _vllm_wording(texts: list[str]) -> tuple[str, str | None, str]:
    for pattern, label, gen in _VLLM:
        hit = next((t for t in texts if re.search(pattern, t)), None)
        if hit is not None:
            return label, gen, _quote(pattern, hit)
    return "vLLM (era unknown)", None, "no dated wording in the excerpt"


def _quote(pattern: str, line: str) -> str:
    m = re.search(pattern, line)
    return f"'{m.group(0).strip()}'" if m and m.group(0).strip() else "its wording"
