"""Failure signatures (drill-anchors 4.10): each engine's wording, classified with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramlab.logs import signatures as sig
from vramlab.logs.signatures import classify_line, scan

LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize(
    "line,kind,engine,name",
    [
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine.",
            sig.STARTUP_REFUSAL,
            "vllm",
            "vllm.no_kv_memory",
        ),
        (
            "ValueError: Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 19.84 GiB). Decrease GPU memory utilization",
            sig.STARTUP_REFUSAL,
            "vllm",
            "vllm.free_memory_below_utilization",
        ),
        (
            "ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (1.20 GiB).",
            sig.STARTUP_REFUSAL,
            "vllm",
            "vllm.max_len_exceeds_kv",
        ),
        (
            "Sequence group 147 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
            "space.",
            sig.PREEMPTION,
            "vllm",
            "vllm.preempted",
        ),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            sig.ENGINE_DEATH,
            "vllm",
            "vllm.engine_dead",
        ),
        (
            "ERROR [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
            sig.ENGINE_DEATH,
            "vllm",
            "vllm.engine_core_died",
        ),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            sig.STARTUP_REFUSAL,
            "sglang",
            "sglang.not_enough_memory",
        ),
        (
            "[2025-01-01 10:00:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.8024 -> "
            "0.9085",
            sig.PREEMPTION,
            "sglang",
            "sglang.retract",
        ),
        (
            "Not enough memory to handle 4096 prefill tokens. You need to decrease `--max-batch-prefill-tokens`",
            sig.STARTUP_REFUSAL,
            "tgi",
            "tgi.prefill_oom",
        ),
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: cudaMalloc failed: out of "
            "memory",
            sig.OOM,
            "llama.cpp",
            "llamacpp.cuda_malloc",
        ),
        (
            "llama_init_from_model: failed to allocate compute buffers",
            sig.OOM,
            "llama.cpp",
            "llamacpp.failed_to_allocate",
        ),
        (
            "update_slots: failed to find free space in the KV cache, retrying with smaller batch size",
            sig.KV_PRESSURE,
            "llama.cpp",
            "llamacpp.kv_full",
        ),
        (
            'msg="error loading model" error="llama runner process has terminated: CUDA error: out of memory"',
            sig.OOM,
            "ollama",
            "ollama.runner_oom",
        ),
        ("RuntimeError: CUDA error: out of memory", sig.OOM, None, "cuda.error_oom"),
        (
            "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            sig.GPU_XID,
            None,
            "nvidia.xid",
        ),
    ],
)
def test_each_signature(line, kind, engine, name):
    s = classify_line(line)
    assert s is not None and (s.kind, s.engine, s.name) == (kind, engine, name)
    assert s.line == line


def test_torch_oom_carries_the_figures():
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of "
        "23.56 GiB of which 56.88 MiB is free"
    )
    s = classify_line(line, engine="vllm")
    assert s is not None
    assert s.kind == sig.OOM and s.severity == "fatal" and s.engine == "vllm"
    assert s.details == {"requested": "50.00 MiB", "gpu": "0", "total": "23.56 GiB", "free": "56.88 MiB"}


def test_engine_filter_skips_other_engines_wording():
    line = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert classify_line(line, engine="vllm") is None
    s = classify_line(line, engine="sglang")
    assert s is not None and s.name == "sglang.not_enough_memory"


def test_xid_severity_depends_on_code():
    s13 = classify_line("NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception")
    s79 = classify_line("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus")
    assert s13 is not None and s13.severity == "error"
    assert s79 is not None and s79.severity == "fatal"


def test_scan_a_whole_log_in_order():
    found = scan((LOGS / "failures.log").read_text().splitlines())
    kinds = [s.kind for s in found]
    assert kinds.count(sig.STARTUP_REFUSAL) == 5
    assert sig.PREEMPTION in kinds and sig.ENGINE_DEATH in kinds and sig.GPU_XID in kinds
    numbers = [s.line_number for s in found]
    assert None not in numbers
    assert numbers == sorted(n for n in numbers if n is not None)
    # the throughput line at the end is not a failure
    last = found[-1].line_number
    assert last is not None and last < len((LOGS / "failures.log").read_text().splitlines())
    oom = sig.first(found, sig.OOM)
    assert oom is not None and oom.name == "torch.cuda_oom"


def test_ordinary_lines_are_not_failures():
    for line in (LOGS / "vllm-v1-0.19-debug.log").read_text().splitlines():
        assert classify_line(line) is None
