"""Runtime failure signatures of serving engines (docs/research/drill-anchors.md section 4.10).

`classify_line(line)` says whether one log line is an out-of-memory, a start-up refusal, a
preemption / retraction, an overload rejection, an engine death or a GPU Xid error, and of
which engine. `scan(lines)` does a whole log. The drill reads these to tell *how* a target
failed. Patterns match the engines' own wording, quoted from their sources and issues.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# Kinds, from the operator's point of view.
STARTUP_REFUSAL = "startup_refusal"  # the engine will not start with this memory
OOM = "oom"  # an allocation failed at run time
PREEMPTION = "preemption"  # KV cache full: requests evicted and recomputed (vLLM) or retracted (SGLang)
KV_PRESSURE = "kv_pressure"  # KV cache full without eviction (llama.cpp retries a smaller batch)
OVERLOAD = "overload"  # requests rejected because a queue or semaphore is full
ENGINE_DEATH = "engine_death"  # the engine process is gone; every request fails until restart
GPU_XID = "gpu_xid"  # the NVIDIA driver reported a GPU error (kernel log)
KINDS = (STARTUP_REFUSAL, OOM, PREEMPTION, KV_PRESSURE, OVERLOAD, ENGINE_DEATH, GPU_XID)

# Severity: "fatal" = the process cannot serve; "error" = requests fail; "warning" = degraded.
_FATAL, _ERROR, _WARN = "fatal", "error", "warning"


@dataclass(frozen=True)
class Signature:
    kind: str
    engine: str | None  # None when the wording is not engine-specific (PyTorch, CUDA, kernel)
    severity: str
    name: str  # short stable id of the pattern, e.g. "vllm.no_kv_memory"
    line: str  # the matched line, as given
    line_number: int | None = None
    details: dict[str, str] | None = None  # named figures the line carried (sizes, counts)


@dataclass(frozen=True)
class _Pattern:
    name: str
    engine: str | None
    kind: str
    severity: str
    regex: re.Pattern[str]


def _p(name: str, engine: str | None, kind: str, severity: str, regex: str) -> _Pattern:
    return _Pattern(name, engine, kind, severity, re.compile(regex))


# Order matters: the first match wins, so specific wording comes before generic wording.
PATTERNS: tuple[_Pattern, ...] = (
    # vLLM start-up refusals (kv_cache_utils.check_enough_kv_cache_memory, gpu_worker.init_device).
    _p("vllm.no_kv_memory", "vllm", STARTUP_REFUSAL, _FATAL, r"No available memory for the cache blocks"),
    _p(
        "vllm.free_memory_below_utilization",
        "vllm",
        STARTUP_REFUSAL,
        _FATAL,
        r"Free memory on device.*on startup is less than desired GPU memory utilization",
    ),
    _p(
        "vllm.max_len_exceeds_kv",
        "vllm",
        STARTUP_REFUSAL,
        _FATAL,
        r"To serve at least one request with the models?'s max seq len \((?P<max_model_len>\d+)\)",
    ),
    _p(
        "vllm.max_len_exceeds_kv_tokens",
        "vllm",
        STARTUP_REFUSAL,
        _FATAL,
        r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be stored "
        r"in KV cache \((?P<kv_cache_tokens>\d+)\)",
    ),
    _p("vllm.engine_init_failed", "vllm", STARTUP_REFUSAL, _FATAL, r"Engine core initialization failed"),
    # vLLM preemption (V0 per-request line) and engine death.
    _p(
        "vllm.preempted",
        "vllm",
        PREEMPTION,
        _WARN,
        r"Sequence group \S+ is preempted by PreemptionMode\.(?P<mode>\w+)",
    ),
    _p("vllm.engine_dead", "vllm", ENGINE_DEATH, _FATAL, r"\b(?:Async)?EngineDeadError\b"),
    _p("vllm.engine_core_died", "vllm", ENGINE_DEATH, _FATAL, r"Engine core proc \S+ died unexpectedly"),
    _p("vllm.engine_process_died", "vllm", ENGINE_DEATH, _FATAL, r"Engine process \(pid \d+\) died"),
    _p("vllm.mq_engine_dead", "vllm", ENGINE_DEATH, _FATAL, r"MQLLMEngine is already dead"),
    _p(
        "vllm.request_failed_engine_dead", "vllm", ENGINE_DEATH, _ERROR, r"Request \S+ failed \(engine dead\)"
    ),
    _p("vllm.background_loop_errored", "vllm", ENGINE_DEATH, _FATAL, r"Background loop has errored already"),
    # SGLang.
    _p(
        "sglang.not_enough_memory",
        "sglang",
        STARTUP_REFUSAL,
        _FATAL,
        r"Not enough memory\. Please try to increase --mem-fraction-static",
    ),
    _p(
        "sglang.retract",
        "sglang",
        PREEMPTION,
        _WARN,
        r"Decode out of memory happened\. #retracted_reqs: (?P<retracted>\d+)",
    ),
    _p("sglang.no_space_for_one", "sglang", ENGINE_DEATH, _FATAL, r"No space left for only one request"),
    _p(
        "sglang.input_too_long",
        "sglang",
        STARTUP_REFUSAL,
        _ERROR,
        r"Input length \((?P<input_tokens>\d+) tokens\) exceeds the maximum allowed length \((?P<max_tokens>\d+) tokens\)",
    ),
    # TGI.
    _p(
        "tgi.prefill_oom",
        "tgi",
        STARTUP_REFUSAL,
        _FATAL,
        r"Not enough memory to handle (?P<prefill_tokens>\d+) prefill tokens",
    ),
    _p(
        "tgi.max_total_tokens_oom",
        "tgi",
        STARTUP_REFUSAL,
        _FATAL,
        r"Not enough memory to handle `max_total_tokens",
    ),
    _p("tgi.overloaded", "tgi", OVERLOAD, _ERROR, r"Model is overloaded"),
    _p("tgi.shard_crashed", "tgi", ENGINE_DEATH, _FATAL, r"Shard (?P<rank>\d+) crashed"),
    # Ollama.
    _p(
        "ollama.system_memory",
        "ollama",
        STARTUP_REFUSAL,
        _FATAL,
        r"model requires more system memory \((?P<required>[\d.]+ \w+)\) than is available \((?P<available>[\d.]+ \w+)\)",
    ),
    _p("ollama.runner_oom", "ollama", OOM, _FATAL, r"llama runner process has terminated: .*out of memory"),
    _p("ollama.server_busy", "ollama", OVERLOAD, _ERROR, r"server busy, please try again"),
    _p("ollama.no_kv_slot", "ollama", KV_PRESSURE, _FATAL, r"could not find a kv cache slot"),
    # llama.cpp.
    _p(
        "llamacpp.v_cache_needs_flash_attn",
        "llama.cpp",
        STARTUP_REFUSAL,
        _FATAL,
        r"V cache quantization requires flash_attn|quantized V cache was requested, but this requires Flash Attention",
    ),
    _p(
        "llamacpp.context_failed",
        "llama.cpp",
        STARTUP_REFUSAL,
        _FATAL,
        r"failed to create context with model|unable to create llama context|failed to initialize the context",
    ),
    _p("llamacpp.kv_full", "llama.cpp", KV_PRESSURE, _WARN, r"failed to find free space in the KV cache"),
    _p("llamacpp.decode_failed", "llama.cpp", KV_PRESSURE, _ERROR, r"failed to decode the batch"),
    _p("llamacpp.context_exceeded", "llama.cpp", OVERLOAD, _ERROR, r"Context size has been exceeded"),
    _p(
        "llamacpp.cuda_malloc",
        "llama.cpp",
        OOM,
        _FATAL,
        r"cudaMalloc failed: out of memory|ggml_backend_cuda_buffer_type_alloc_buffer: allocating [\d.]+ MiB on "
        r"device \d+: cudaMalloc failed",
    ),
    _p(
        "llamacpp.failed_to_allocate",
        "llama.cpp",
        OOM,
        _FATAL,
        r"failed to allocate (?:\w+ )*buffer|unable to allocate \w+ buffer|failed to allocate compute",
    ),
    # Generic PyTorch / CUDA wording (any Python engine).
    _p(
        "torch.cuda_oom",
        None,
        OOM,
        _FATAL,
        r"(?:torch\.(?:cuda\.)?OutOfMemoryError: )?CUDA out of memory\. Tried to allocate (?P<requested>[\d.]+ ?[KMG]i?B)"
        r"(?:.*?GPU (?P<gpu>\d+) has a total capacity of (?P<total>[\d.]+ ?[KMG]i?B) of which (?P<free>[\d.]+ ?[KMG]i?B) is free)?",
    ),
    _p("torch.oom", None, OOM, _FATAL, r"torch\.(?:cuda\.)?OutOfMemoryError"),
    # PyTorch's host allocator refusing one allocation (a CPU-served model; transformers serve answers that
    # request 500 and keeps serving): "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"
    _p(
        "torch.cpu_alloc",
        None,
        OOM,
        _ERROR,
        r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (?P<requested>\d+ bytes)",
    ),
    _p("cuda.error_oom", None, OOM, _FATAL, r"CUDA error: out of memory|cudaErrorMemoryAllocation"),
    _p("nccl.oom", None, OOM, _FATAL, r"NCCL (?:WARN|error).*(?:out of memory|Cuda failure 'out of memory')"),
    # Kernel log: NVIDIA Xid (NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.)
    _p("nvidia.xid", None, GPU_XID, _FATAL, r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)"),
)


def _keys() -> dict[str, str | None]:
    from vramlab.logs.base import required_literal

    return {p.name: required_literal(p.regex.pattern) for p in PATTERNS}


_KEYS = _keys()

# Xid codes that do not kill the GPU context for everyone (application faults, ECC page
# retirement notices); the rest call for a reset or a drain.
_XID_ERROR_ONLY = {13, 31, 43, 63, 94}


def classify_line(line: str, engine: str | None = None, line_number: int | None = None) -> Signature | None:
    """The failure signature of one log line, or None. With `engine`, other engines' patterns
    are skipped (generic PyTorch/CUDA/kernel wording always applies)."""
    if len(line) > 20000:
        return None
    for p in PATTERNS:
        if engine is not None and p.engine is not None and p.engine != engine:
            continue
        key = _KEYS.get(p.name)
        if key is not None and key not in line:
            continue
        m = p.regex.search(line)
        if not m:
            continue
        details = {k: v for k, v in m.groupdict().items() if v is not None} or None
        severity = p.severity
        if p.kind == GPU_XID and details and int(details["xid"]) in _XID_ERROR_ONLY:
            severity = _ERROR
        return Signature(
            p.kind, p.engine or engine, severity, p.name, line.rstrip("\r\n"), line_number, details
        )
    return None


def scan(lines: Iterable[str], engine: str | None = None) -> list[Signature]:
    """Every failure signature in a log, in order, with 1-based line numbers."""
    out = []
    for i, line in enumerate(lines, start=1):
        if not line:
            continue
        sig = classify_line(line, engine, i)
        if sig is not None:
            out.append(sig)
    return out


def first(signatures: Iterable[Signature], kind: str) -> Signature | None:
    return next((s for s in signatures if s.kind == kind), None)
