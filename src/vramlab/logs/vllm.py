"""vLLM start-up logs, every era of wording (docs/research/capacity-anchors.md section 1.6).

V0 (0.6.4-0.10) prints a three-line profiling summary whose figures can be negative, and
`# GPU blocks` / `# cuda blocks`. V1 prints `Model loading took`, `Available KV cache memory`,
`GPU KV cache size: N tokens` (comma-grouped), `Maximum concurrency for L tokens per request`,
CUDA graph lines, and at DEBUG the profiling result and the worker's memory snapshot. vLLM
prints "GB" on some lines but divides by 2^30 everywhere, so every figure here is GiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from vramlab.logs import devices, vllm_cpu
from vramlab.logs.base import Rule, assemble, gib, integer, mib, parse_lines, rule
from vramlab.logs.vllm_args import SETTINGS_RULES

ENGINE = "vllm"
N = r"-?\d+(?:\.\d+)?"  # vLLM prints negative figures when another process freed memory


def _encoder_profile(m: re.Match[str]) -> dict[str, Any]:
    return {
        "extra.encoder_budget_tokens": int(m.group(1)),
        "extra.encoder_items": int(m.group(2)),
        "extra.encoder_modality": m.group(3),
    }


def _mm_limits(m: re.Match[str]) -> dict[str, Any] | None:
    """`'limit_mm_per_prompt': {'image': 2, 'video': 0}` (non-default args) as the plan's setting."""
    pairs = re.findall(r"['\"]?(image|video|audio)['\"]?\s*:\s*(\d+)", m.group(1))
    return {"settings.limit_mm_per_prompt": tuple(sorted((k, int(v)) for k, v in pairs))} if pairs else None


def _v0_budget(m: re.Match[str]) -> dict[str, Any]:
    return {
        "total_gpu_memory_bytes": gib(m.group(1)),
        "settings.gpu_memory_utilization": float(m.group(2)),
        "budget_bytes": gib(m.group(3)) if m.group(3) else None,
        "settings.vllm_engine": "v0",
    }


def _v0_split(m: re.Match[str]) -> dict[str, Any]:
    return {
        "weights_bytes": gib(m.group(1)),
        "non_torch_bytes": gib(m.group(2)),
        "activation_peak_bytes": gib(m.group(3)),
        "kv_cache_bytes": gib(m.group(4)),
        "settings.vllm_engine": "v0",
    }


def _v1_profile(m: re.Match[str]) -> dict[str, Any]:
    out = {
        "non_kv_cache_bytes": gib(m.group("non_kv")),
        "activation_peak_bytes": gib(m.group("peak")),
        "weights_bytes": gib(m.group("weights")),
    }
    if m.group("non_torch") is not None:
        out["non_torch_bytes"] = gib(m.group("non_torch"))
    if m.group("consumed") is not None:
        out["extra.total_consumed_bytes"] = gib(m.group("consumed"))
    return out


def _blocks(m: re.Match[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu_blocks": int(m.group(1))}
    if m.group(2) is not None:
        out["extra.cpu_blocks"] = int(m.group(2))
        out["settings.vllm_engine"] = "v0"
    else:
        out["settings.vllm_engine"] = "v1"
    return out


def _snapshot(m: re.Match[str]) -> dict[str, Any]:
    text = m.group(0)
    out: dict[str, Any] = {}
    for key, field in (
        ("free_memory", "free_gpu_memory_bytes"),
        ("total_memory", "total_gpu_memory_bytes"),
        ("non_torch_memory", "init_non_torch_bytes"),
    ):
        f = re.search(rf"\b{key}=({N})GiB", text)
        if f:
            out[field] = gib(f.group(1))
    return out


def _suggestion(m: re.Match[str]) -> dict[str, Any]:
    out = {
        "free_gpu_memory_bytes": gib(m.group("free")),
        "total_gpu_memory_bytes": gib(m.group("total")),
        "settings.gpu_memory_utilization": float(m.group("util")),
    }
    if m.group("budget"):
        out["budget_bytes"] = gib(m.group("budget"))
    return out


def _actual_usage(m: re.Match[str]) -> dict[str, Any]:
    return {
        "weights_bytes": gib(m.group(1)),
        "activation_peak_bytes": gib(m.group(2)),
        "non_torch_bytes": gib(m.group(3)),
        "cuda_graph_bytes": gib(m.group(4)),
    }


def _weights(m: re.Match[str]) -> dict[str, Any]:
    # 0.3-0.5 print "Loading model weights took 244.61 MB" (MB = MiB: they divide by 2^20).
    value = m.group(1)
    return {"weights_bytes": mib(value) if m.group(2) == "MB" else gib(value)}


def _profile_kv(m: re.Match[str]) -> dict[str, Any]:
    """0.6.2-0.6.3: `Memory profiling results: total_gpu_memory=..GiB initial_memory_usage=..GiB
    peak_torch_memory=..GiB memory_usage_post_profile=..GiB non_torch_memory=..GiB kv_cache_size=..GiB
    gpu_memory_utilization=..` on one line."""
    text = m.group(0)
    out: dict[str, Any] = {"settings.vllm_engine": "v0"}
    for key, name in (
        ("total_gpu_memory", "total_gpu_memory_bytes"),
        ("non_torch_memory", "non_torch_bytes"),
        ("kv_cache_size", "kv_cache_bytes"),
        ("peak_torch_memory", "extra.peak_torch_bytes"),
        ("initial_memory_usage", "extra.initial_memory_usage_bytes"),
    ):
        f = re.search(rf"\b{key}=({N})GiB", text)
        if f:
            out[name] = gib(f.group(1))
    u = re.search(rf"\bgpu_memory_utilization=({N})", text)
    if u:
        out["settings.gpu_memory_utilization"] = float(u.group(1))
    return out


def _kv_refused(m: re.Match[str]) -> dict[str, Any]:
    """V1's refusal names the KV memory it had: `To serve at least one request with the models's
    max seq len (L), (X GiB KV cache is needed, which is larger than the available KV cache memory
    (Y GiB). Based on the available memory, the estimated maximum model length is M.`"""
    out: dict[str, Any] = {
        "max_model_len": integer(m.group("len")),
        "kv_cache_bytes": gib(m.group("avail")),
        "extra.kv_cache_needed_bytes": gib(m.group("need")),
        "extra.refused_max_model_len": integer(m.group("len")),
    }
    if m.group("est"):
        out["extra.estimated_max_model_len"] = integer(m.group("est"))
    return out


def _graph_util_advice(m: re.Match[str]) -> dict[str, Any]:
    """0.21+: the utilization given, what it equals without CUDA graph profiling, and what keeps
    the KV pool of before (`... is equivalent to --gpu-memory-utilization=0.8878 without ...`)."""
    out: dict[str, Any] = {"settings.gpu_memory_utilization": float(m.group(1))}
    if m.group(2):
        out["extra.util_without_graph_profiling"] = float(m.group(2))
    if m.group(3):
        out["extra.util_to_keep_kv"] = float(m.group(3).rstrip("."))
    return out


RULES: list[Rule] = (
    SETTINGS_RULES
    + [
        rule(
            "weights",
            rf"(?:Loading model weights|Model loading) took ({N}) ?(GiB|GB|MB)",
            _weights,
            once=True,
        ),
        # 0.6.2-0.6.3: the profile on one line of key=value pairs.
        rule("profile_kv", r"Memory profiling results: total_gpu_memory=.*", _profile_kv, once=True),
        # 0.6.4-0.6.5: a table, one figure per line, under a `Memory profiling results:` header.
        rule(
            "profile_table",
            r"Memory profiling results:\s*$",
            lambda m: {"settings.vllm_engine": "v0"},
            starts=True,
        ),
        rule(
            "table_total",
            rf"\btotal_gpu_memory\s+({N}) ?GiB\s*$",
            lambda m: {"total_gpu_memory_bytes": gib(m.group(1))},
        ),
        rule(
            "table_util",
            rf"\bgpu_memory_utilization\s+({N})\s*$",
            lambda m: {"settings.gpu_memory_utilization": float(m.group(1))},
        ),
        rule(
            "table_budget",
            rf"the current vLLM instance can use\s+({N}) ?GiB\s*$",
            lambda m: {"budget_bytes": gib(m.group(1))},
        ),
        rule(
            "table_weights",
            rf"model weights take\s+({N}) ?GiB\s*$",
            lambda m: {"weights_bytes": gib(m.group(1))},
            once=True,
        ),
        rule(
            "table_non_torch",
            rf"\bnon_torch_memory\s+({N}) ?GiB\s*$",
            lambda m: {"non_torch_bytes": gib(m.group(1))},
        ),
        rule(
            "table_peak",
            rf"PyTorch activation peak memory\s+({N}) ?GiB\s*$",
            lambda m: {"activation_peak_bytes": gib(m.group(1))},
        ),
        rule(
            "table_kv",
            rf"available_kv_cache_memory\s+({N}) ?GiB\s*$",
            lambda m: {"kv_cache_bytes": gib(m.group(1))},
        ),
        rule(
            "v0_budget",
            rf"total_gpu_memory \(({N}) ?GiB\) x gpu_memory_utilization \(({N})\)(?: = ({N}) ?GiB)?",
            _v0_budget,
        ),
        rule(
            "v0_split",
            rf"model weights take ({N}) ?GiB; non_torch_memory takes ({N}) ?GiB; PyTorch activation peak memory "
            rf"takes ({N}) ?GiB; the rest of the memory reserved for KV Cache is ({N}) ?GiB",
            _v0_split,
            once=True,
        ),
        rule(
            "v1_profile",
            rf"Total non KV cache memory: (?P<non_kv>{N}) ?GiB; torch peak memory increase: (?P<peak>{N}) ?GiB; "
            rf"(?:non-torch forward increase memory: (?P<non_torch>{N}) ?GiB; )?"
            rf"(?:total consumed \(from mem_get_info\): (?P<consumed>{N}) ?GiB; )?weights memory: (?P<weights>{N}) ?GiB",
            _v1_profile,
        ),
        rule("snapshot", r"worker init memory snapshot: .*total_memory=.*", _snapshot),
        rule(
            "requested",
            rf"Initial free memory: ({N}) ?GiB; Requested memory: ({N}) \(util\), ({N}) ?GiB",
            lambda m: {
                "free_gpu_memory_bytes": gib(m.group(1)),
                "settings.gpu_memory_utilization": float(m.group(2)),
                "budget_bytes": gib(m.group(3)),
            },
        ),
        rule(
            "free_on_device",
            rf"Free memory on device(?: \S+)? \((?P<free>{N})/(?P<total>{N}) ?GiB\) on startup"
            rf"(?:.*?utilization (?:is )?\((?P<util>{N}), (?P<budget>{N}) ?GiB\))?",
            lambda m: (
                _suggestion(m)
                if m.group("util")
                else {
                    "free_gpu_memory_bytes": gib(m.group("free")),
                    "total_gpu_memory_bytes": gib(m.group("total")),
                }
            ),
        ),
        rule(
            "actual_usage",
            rf"Actual usage(?: is|:) ({N}) ?GiB for weights?, ({N}) ?GiB for peak activation, ({N}) ?GiB for non-torch "
            rf"memory,? (?:and )?({N}) ?GiB for (?:CUDAGraph|CUDA graph|[A-Z]PU graph) memory",
            _actual_usage,
        ),
        # 0.27+ wording (gpu_worker.py): "consumed" is cudaMemGetInfo's loss since the init snapshot (weights, non-torch,
        # torch buffers outside the weights, the allocator's cache); "peak activation" is the transient torch peak PLUS
        # the CUDA-graph estimate the budget took; "CUDAGraph memory" what the capture really used. Neither of the first
        # two is the older figure of the same name, so they are kept apart.
        rule(
            "consumed_usage",
            rf"Actual usage is ({N}) ?GiB for consumed memory \(weights \+ non-torch\), ({N}) ?GiB for peak activation, "
            rf"and ({N}) ?GiB for (?:CUDAGraph|CUDA graph) memory",
            lambda m: {
                "extra.consumed_weights_non_torch_bytes": gib(m.group(1)),
                "extra.peak_activation_with_graph_estimate_bytes": gib(m.group(2)),
                "cuda_graph_bytes": gib(m.group(3)),
            },
        ),
        # The advisory line's suggestion: what the KV pool could be if the budget were given in bytes.
        rule(
            "kv_cache_memory_advice",
            r"--kv-cache-memory=(\d+)",
            lambda m: {"extra.suggested_kv_cache_memory_bytes": int(m.group(1))},
        ),
        rule(
            "graph_util_advice",
            rf"The current --gpu-memory-utilization=({N}) is equivalent to(?: --gpu-memory-utilization=({N}) without "
            rf"CUDA graph memory profiling\.(?:.*?increase --gpu-memory-utilization to ({N}))?)?",
            _graph_util_advice,
            shared=True,
        ),
        rule(
            "kv_refused",
            r"max seq len \((?P<len>[\d,]+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the "
            r"available KV cache memory \((?P<avail>-?[\d.]+) GiB\)(?:.*?estimated maximum model length is (?P<est>[\d,]+))?",
            _kv_refused,
            shared=True,
        ),
        # V0 (and the engine before V0 had a name), worker.py `raise_if_cache_size_invalid` / llm_engine.py: the pool in
        # tokens is block_size x num_gpu_blocks, printed as the KV cache's capacity.
        rule(
            "max_len_vs_kv",
            r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV "
            r"cache \((\d+)\)",
            lambda m: {
                "max_model_len": int(m.group(1)),
                "extra.kv_capacity_tokens": int(m.group(2)),
                "kv_cache_tokens": int(m.group(2)),
                "extra.refused_max_model_len": int(m.group(1)),
            },
            shared=True,
        ),
        rule(
            "kv_memory",
            rf"Available KV cache memory: ({N}) ?GiB",
            lambda m: {"kv_cache_bytes": gib(m.group(1))},
            once=True,
        ),
        rule(
            "kv_tokens",
            r"GPU KV cache size:\s*([\d,]+) tokens",
            lambda m: {"kv_cache_tokens": integer(m.group(1)), "settings.vllm_engine": "v1"},
            shared=True,
        ),
        rule(
            "concurrency",
            r"Maximum concurrency for ([\d,]+) tokens per request: (\d+(?:\.\d+)?) ?x",
            lambda m: {"max_concurrency": float(m.group(2)), "max_model_len": integer(m.group(1))},
            shared=True,
        ),
        # V0 prints GPU and CPU blocks; V1 0.7 printed `# GPU blocks: N` alone (kv_cache_utils.py).
        rule(
            "blocks",
            r"(?:^|[\s#])(?:GPU|cuda|CUDA|npu|xpu|hpu) blocks: (\d+)(?:, # CPU blocks: (\d+))?",
            _blocks,
            shared=True,
        ),
        rule(
            "v1_blocks", r"num_gpu_blocks is: (\d+)", lambda m: {"gpu_blocks": int(m.group(1))}, shared=True
        ),
        rule(
            "blocks_override",
            r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(\d+)",
            lambda m: {"gpu_blocks": int(m.group(1))},
            shared=True,
        ),
        rule(
            "block_size_override",
            r"Setting attention block size to (\d+) tokens",
            lambda m: {"block_size": int(m.group(1))},
            shared=True,
        ),
        # Which kernel the profiled sampler ran (vllm/v1/sample/ops/topk_topp_sampler.py): FlashInfer does not sort the
        # vocabulary; the PyTorch-native fallback does (a larger activation peak).
        rule(
            "flashinfer_sampler",
            r"Using FlashInfer for top-p & top-k sampling",
            lambda m: {"settings.flashinfer_sampler": True},
            shared=True,
        ),
        rule(
            "native_sampler",
            r"Falling back to the PyTorch-native implementation of top-p & top-k sampling|"
            r"FlashInfer top-p/top-k sampling (?:unavailable|disabled via|is available but disabled)",
            lambda m: {"settings.flashinfer_sampler": False},
            shared=True,
        ),
        # custom_all_reduce.py: the GPUs cannot reach each other directly, so no NVLink/NVSwitch buffers either.
        rule(
            "no_p2p",
            r"Custom allreduce is disabled because (?:your platform lacks GPU P2P capability|this process "
            r"group spans across nodes)",
            lambda m: {"settings.gpu_p2p": False},
            shared=True,
        ),
        # V1's vision-encoder profile (gpu_model_runner.profile_run) and the prompt limits that shape it.
        rule(
            "encoder_profile",
            r"Encoder cache will be initialized with a budget of (\d+) tokens, and profiled with "
            r"(\d+) (\w+) items",
            _encoder_profile,
            shared=True,
        ),
        rule("mm_limits", r"limit_mm_per_prompt['\"]?\s*[:=]\s*\{([^}]*)\}", _mm_limits, shared=True),
        rule(
            "graphs",
            rf"Graph capturing finished in \d+ secs?, took ({N}) ?GiB",
            lambda m: {"cuda_graph_bytes": gib(m.group(1))},
        ),
        rule(
            "graph_estimate",
            rf"Estimated CUDA graph memory: ({N}) ?GiB",
            lambda m: {"cuda_graph_estimate_bytes": gib(m.group(1))},
        ),
        rule(
            "graph_pool",
            rf"CUDA graph pool memory: ({N}) ?GiB \(actual\), ({N}) ?GiB \(estimated\)",
            lambda m: {"cuda_graph_bytes": gib(m.group(1)), "cuda_graph_estimate_bytes": gib(m.group(2))},
        ),
    ]
    + vllm_cpu.RULES
    + devices.RULES
)


def parse(lines: Iterable[str]) -> list[Any]:
    """Observations (one per rank and start-up) from a vLLM log."""
    startups, _ = parse_lines(lines, RULES)
    return assemble(ENGINE, startups, _finish)


def _finish(fields: dict[str, Any]) -> None:
    vllm_cpu.finish(fields)
    if fields.get("budget_bytes") is None:
        fields.pop("budget_bytes", None)
    # V1 sizes the KV pool in blocks of 16 tokens by default; a log that prints both blocks and
    # tokens tells the block size the engine used (hybrid models print derived tokens: skip).
    blocks, tokens = fields.get("gpu_blocks"), fields.get("kv_cache_tokens")
    if (
        fields.get("block_size") is None
        and blocks
        and tokens
        and tokens % blocks == 0
        and tokens // blocks
        in (
            16,
            32,
            64,
            128,
            256,
        )
    ):
        fields["block_size"] = tokens // blocks
