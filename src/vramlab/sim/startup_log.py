"""The engine's log, in each engine's own wording (docs/research/capacity-anchors.md §1.6, §2-4).

`vramlab check-log` and drill detectors read these lines, so the wording follows the engines
verbatim; the numbers come from the simulated start-up. vLLM lines follow V1 (>= 0.11 wording
for "Model loading took"); older versions get the older wording where it is known to differ.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import IO

from vramlab.units import GIB, MIB, to_gib

# file[:line] vLLM prints in its log prefix, so a reader sees where a line would come from.
_VLLM_SRC = {
    "load": "gpu_model_runner.py:2602",
    "kv": "gpu_worker.py:298",
    "cache": "kv_cache_utils.py:1087",
    "graph": "gpu_model_runner.py:3480",
    "api": "api_server.py:1971",
    "core": "core.py:708",
    "stats": "loggers.py:123",
    "sched": "scheduler.py:311",
    "launcher": "launcher.py:99",
}


class EngineLog:
    """Writes log lines with the engine's prefix to a stream and, optionally, a file."""

    def __init__(self, engine: str, stream: IO[str] | None = None, path: str | None = None):
        self.engine = engine
        self.stream = stream if stream is not None else sys.stdout
        self.file = open(path, "a", buffering=1, encoding="utf-8") if path else None
        self.lines: deque[str] = deque(maxlen=5000)  # the recent lines, for in-process readers

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None

    def _prefix(self, level: str, where: str) -> str:
        now = time.time()
        if self.engine == "vllm":
            return f"{level} {time.strftime('%m-%d %H:%M:%S', time.localtime(now))} [{_VLLM_SRC.get(where, where)}] "
        if self.engine == "tgi":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
            return f"{stamp} {level:>5} text_generation_launcher: "
        if self.engine == "sglang":
            return f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}] "
        return ""  # llama.cpp prints bare lines with a function-name prefix in the message

    def write(self, msg: str, level: str = "INFO", where: str = "") -> None:
        self.raw("\n".join(self._prefix(level, where) + part for part in msg.split("\n")))

    def raw(self, text: str) -> None:
        from vramlab.redact import redact

        text = redact(text)  # the log is an output too: a URL's password or a key never reaches it
        self.lines.append(text)
        for out in (self.stream, self.file):
            if out is not None:
                try:
                    out.write(text + "\n")
                    out.flush()
                except (OSError, ValueError):
                    pass  # a closed pipe must not stop the engine

    def info(self, msg: str, where: str = "") -> None:
        self.write(msg, "INFO", where)

    def warning(self, msg: str, where: str = "") -> None:
        self.write(msg, "WARNING", where)

    def error(self, msg: str, where: str = "") -> None:
        self.write(msg, "ERROR", where)


# --- vLLM ----------------------------------------------------------------------------------
def vllm_loading(version: tuple[int, ...], weights_bytes: int, seconds: float) -> str:
    if version >= (0, 11):
        return f"Model loading took {to_gib(weights_bytes):.2f} GiB memory and {seconds:.6f} seconds"
    return f"Model loading took {to_gib(weights_bytes):.4f} GiB and {seconds:.6f} seconds"


def vllm_kv_lines(
    version: tuple[int, ...], kv_bytes: int, tokens: int, max_model_len: int, concurrency: float
) -> list[str]:
    if version < (0, 8):  # V0 wording
        return [
            f"# cuda blocks: {tokens // 16}, # CPU blocks: 2048",
            f"Maximum concurrency for {max_model_len} tokens per request: {concurrency:.2f}x",
        ]
    return [
        f"Available KV cache memory: {to_gib(kv_bytes):.2f} GiB",
        f"GPU KV cache size: {tokens:,} tokens",
        f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency:.2f}x",
    ]


def vllm_free_memory_error(version: tuple[int, ...], free: int, total: int, util: float) -> str:
    dev = "device cuda:0" if version >= (0, 10) else "device"
    return (
        f"ValueError: Free memory on {dev} ({to_gib(free):.2f}/{to_gib(total):.2f} GiB) on startup is less than "
        f"desired GPU memory utilization ({util}, {to_gib(util * total):.2f} GiB). Decrease GPU memory "
        "utilization or reduce GPU memory used by other processes."
    )


def vllm_no_cache_error() -> str:
    return (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine."
    )


def vllm_max_len_error(
    version: tuple[int, ...],
    max_model_len: int,
    needed_bytes: int,
    available_bytes: int,
    tokens: int,
    largest_len: int,
) -> str:
    if version < (0, 8):
        return (
            f"ValueError: The model's max seq len ({max_model_len}) is larger than the maximum number of "
            f"tokens that can be stored in KV cache ({tokens}). Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine."
        )
    return (
        f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
        f"({to_gib(needed_bytes):.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({to_gib(available_bytes):.2f} GiB). Based on the available memory, the estimated maximum "
        f"model length is {largest_len}. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )


def torch_oom(requested: int, total: int, free: int, process_bytes: int) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested / MIB:.2f} MiB. GPU 0 has "
        f"a total capacity of {to_gib(total):.2f} GiB of which {free / MIB:.2f} MiB is free. Including non-PyTorch "
        f"memory, this process has {to_gib(process_bytes):.2f} GiB memory in use. Of the allocated memory "
        f"{to_gib(process_bytes):.2f} GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


ENGINE_DEAD = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)
CORE_INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)


def traceback_block(final: str, frames: list[tuple[str, int, str]]) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line, fn in frames:
        lines.append(f'  File "{path}", line {line}, in {fn}')
    lines.append(final)
    return "\n".join(lines)


# --- SGLang, TGI, llama.cpp ---------------------------------------------------------------
def sglang_lines(
    weights: int,
    kv_tokens: int,
    kv_bytes: int,
    avail_before: int,
    avail_after_load: int,
    avail_after_pool: int,
    graph_bytes: int,
    max_running: int,
    context_len: int,
    chunked: int,
) -> list[str]:
    gb = GIB  # SGLang prints "GB" but divides by 1024**3
    return [
        f"Load weight begin. avail mem={avail_before / gb:.2f} GB",
        f"Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={avail_after_load / gb:.2f} GB, "
        f"mem usage={weights / gb:.2f} GB.",
        f"KV Cache is allocated. #tokens: {kv_tokens}, K size: {kv_bytes / 2 / gb:.2f} GB, "
        f"V size: {kv_bytes / 2 / gb:.2f} GB",
        f"Memory pool end. avail mem={avail_after_pool / gb:.2f} GB",
        f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail_after_pool / gb:.2f} GB",
        f"Capture cuda graph end. Time elapsed: 4.20 s. mem usage={graph_bytes / gb:.2f} GB. "
        f"avail mem={(avail_after_pool - graph_bytes) / gb:.2f} GB.",
        f"max_total_num_tokens={kv_tokens}, chunked_prefill_size={chunked}, max_prefill_tokens=16384, "
        f"max_running_requests={max_running}, context_len={context_len}, "
        f"available_gpu_mem={(avail_after_pool - graph_bytes) / gb:.2f} GB",
    ]


def tgi_lines(num_blocks: int, block_size: int, total_tokens: int) -> list[str]:
    return [
        f"KV-cache blocks: {num_blocks}, size: {block_size}",
        f"Setting max batch total tokens to {total_tokens}",
        "Cuda Graphs are enabled for sizes [32, 16, 8, 4, 2, 1]",
    ]


def llamacpp_lines(
    gpu_name: str,
    free_before: int,
    weights: int,
    kv_bytes: int,
    cells: int,
    layers: int,
    seqs: int,
    compute: int,
) -> list[str]:
    return [
        f"llama_model_load_from_file_impl: using device CUDA0 ({gpu_name}) - {free_before // MIB} MiB free",
        f"load_tensors: CUDA0 model buffer size = {weights / MIB:.2f} MiB",
        f"llama_kv_cache: CUDA0 KV buffer size = {kv_bytes / MIB:.2f} MiB",
        f"llama_kv_cache: size = {kv_bytes / MIB:7.2f} MiB ({cells:6d} cells, {layers:3d} layers, {seqs:2d} seqs), "
        f"K (f16): {kv_bytes / 2 / MIB:7.2f} MiB, V (f16): {kv_bytes / 2 / MIB:7.2f} MiB",
        f"llama_context: CUDA0 compute buffer size = {compute / MIB:.2f} MiB",
    ]
