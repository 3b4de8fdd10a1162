"""Engine settings with the engines' own flag names. `None` means "the engine's default"."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.capacity.spec import ModelSpec

from vramlab.engines import names

ENGINES = names()  # the registry's engines (vramlab.engines), each with its policy module

# The release assumed when --engine-version is left out: the newest each policy was checked against
# (docs/capacity-model.md, "Default releases").
DEFAULT_VERSIONS = {
    "vllm": "0.29.0",  # vllm_eras.MODELLED_UP_TO: the newest release whose terms come from its source or logs
    "sglang": "0.5.8",  # the newest release a scored start-up ran (r261); its speculative rules reach 0.5.14
    "tgi": "3.3.6",  # the newest release engines/tgi.py reads (TGI_WIGGLE_ROOM of 3.x)
    # the build Ollama v0.32.15 pins (ollama_server.LLAMA_CPP_BUILDS); no modelled rule lies between PR #23861's b9300
    # and it, and PR #27496's n_streams (STREAMS_FROM, build not pinned) is left to --engine-version
    "llama.cpp": "b10488",
    "transformers": "5.0.0",
    # the newest stable tag (2026-08-19): llama-server with --fit at b10488 (engines/ollama_server.py); v0.11.6's
    # llm/memory.go estimator (engines/ollama.py), deleted in v0.12.11, stays reachable with --engine-version
    "ollama": "0.32.15",
}
# `--vllm-engine v0` without a version: the last release that still shipped the V0 engine
# (V0 was removed in 0.11.0).
LAST_VLLM_V0_RELEASE = "0.10.2"


def parse_version(text: str | None) -> tuple[int, ...]:
    """'0.8.5.post1' -> (0, 8, 5); 'b4567' -> (4567,); '0.16.1rc1.dev206+g0' -> (0, 16, 1)."""
    if not text:
        return ()
    out: list[int] = []
    for part in text.strip().lstrip("vb").split("."):
        digits = ""
        for ch in part:
            if ch.isdigit():
                digits += ch
            else:
                break
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding, whatever the engine calls it (capacity/speculative.py plans it). *method* is vLLM's
    word: eagle, eagle3, mtp (the model's own multi-token-prediction layers), draft_model (a whole smaller model:
    SGLang's STANDALONE, llama.cpp's -md) or ngram (no model)."""

    method: str
    draft: ModelSpec | None = None  # the draft model or EAGLE head; None for ngram and mtp
    num_speculative_tokens: int | None = None  # vLLM; SGLang --speculative-num-steps; llama.cpp --draft-max
    eagle_topk: int | None = None  # SGLang --speculative-eagle-topk
    num_draft_tokens: int | None = None  # SGLang --speculative-num-draft-tokens
    draft_n_gpu_layers: int | None = None  # llama.cpp -ngld (None or -1 = every layer)
    draft_ctx_size: int | None = None  # llama.cpp -cd: each slot's draft context (builds with one per slot)
    draft_cache_type_k: str | None = None  # llama.cpp -ctkd (default f16)
    draft_cache_type_v: str | None = None  # llama.cpp -ctvd (default f16)


@dataclass(frozen=True)
class KVOffload:
    """A host-memory tier for the KV cache (capacity/offload.py plans it)."""

    backend: str  # vLLM: "native" (OffloadingConnector) | "lmcache"; SGLang: "hicache"
    size_bytes: int | None = (
        None  # vLLM --kv-offloading-size (all ranks) / cpu_bytes_to_use; SGLang --hicache-size
    )
    num_cpu_blocks: int | None = None  # vLLM 0.11.0-0.13 OffloadingConnector `num_cpu_blocks`
    ratio: float | None = None  # SGLang --hicache-ratio (2.0 when neither it nor --hicache-size is given)
    transfer_config: bool = False  # given as vLLM --kv-transfer-config rather than --kv-offloading-size


@dataclass(frozen=True)
class EngineSettings:
    engine: str = "vllm"
    engine_version: str | None = None
    vllm_engine: str | None = None  # "v0" | "v1"; None = the release's own default
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_model_len_auto: bool = False  # vLLM --max-model-len auto / -1 (engines/vllm_auto.py)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory (CPU build: VLLM_CPU_KVCACHE_SPACE too)
    num_gpu_blocks_override: int | None = None  # vLLM --num-gpu-blocks-override (planned on the CPU build)
    mem_fraction_static: float | None = None  # SGLang
    chunked_prefill_size: int | None = None  # SGLang
    cuda_graph_max_bs: int | None = None  # SGLang
    max_batch_prefill_tokens: int | None = None  # TGI
    ctx_size: int | None = None  # llama.cpp -c (total over all slots)
    parallel: int | None = None  # llama.cpp -np
    n_ubatch: int | None = None  # llama.cpp -ub
    flash_attn: bool | None = None  # llama.cpp -fa
    cache_type_v: str | None = None  # llama.cpp --cache-type-v (None = same as the K type)
    llamacpp_server: str = "llama-server"  # or "llama-cpp-python" (python -m llama_cpp.server)
    # llama.cpp placement (engines/llamacpp_placement.py): None = every layer offloaded (-ngl 99)
    n_gpu_layers: int | None = None  # -ngl; -1 = all
    override_tensor: tuple[str, ...] = ()  # -ot REGEX=BUFT, in the order given
    n_cpu_moe: int = 0  # --n-cpu-moe: experts of the first N layers on the host
    tensor_split: tuple[float, ...] | None = None  # --tensor-split; None = by each device's free memory
    split_mode: str = "layer"  # --split-mode layer | row | none
    main_gpu: int = 0  # --main-gpu
    no_kv_offload: bool = False  # --no-kv-offload: every layer's KV in host memory
    mmap: bool = True  # --no-mmap turns it off: the host buffer is then CPU, not CPU_Mapped
    # llama-server --fit (engines/llamacpp_params_fit.py): None = the build's default (on from b7414)
    fit: bool | None = None
    fit_target_mib: tuple[int, ...] = ()  # --fit-target MiB per device (one value: every device); () = 1024
    fit_ctx: int | None = None  # --fit-ctx: the shortest context --fit may cut to (default 4096)
    ollama_gpu_overhead_bytes: int = 0  # OLLAMA_GPU_OVERHEAD
    devices: tuple[
        tuple[str, int], ...
    ] = ()  # (name, bytes) of every card when they differ; () = the one --gpu
    enable_chunked_prefill: bool | None = None  # vLLM V0: None = the engine decides (auto above 32k)
    flashinfer_sampler: bool | None = (
        None  # vLLM: FlashInfer top-k/top-p sampler on/off (None = the release's default)
    )
    gpu_p2p: bool | None = (
        None  # False: no P2P/NVLink between the GPUs (other nodes, no P2P); None = from the card
    )
    allow_long_max_model_len: bool = False  # vLLM VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    rope_scaling_factor: float | None = None  # a rope-scaling override (vLLM --hf-overrides/--rope-scaling)
    disable_sliding_window: bool = (
        False  # vLLM --disable-sliding-window: context capped at the window, full layers
    )
    continuous_batching: bool = False  # transformers serve --continuous-batching
    api_server: bool = True  # vLLM: `vllm serve` defaults, not the LLM class
    in_trainer: bool = (
        False  # vLLM's LLM class inside a training process (Unsloth fast_inference, TRL colocate)
    )
    other_processes_bytes: int = 0  # memory other processes already hold on each card
    mps_memory_limit_bytes: int = 0  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for this client; 0 = none
    enable_lora: bool = False  # vLLM --enable-lora: LoRA slots are allocated at load time
    max_lora_rank: int = 16  # vLLM --max-lora-rank (vLLM's default 16)
    max_loras: int = 1  # vLLM --max-loras (vLLM's default 1)
    limit_mm_per_prompt: tuple[tuple[str, int], ...] | None = (
        None  # vLLM --limit-mm-per-prompt (image=2,video=0)
    )
    speculative: Speculative | None = None  # a draft model, EAGLE head, MTP layers or n-grams
    kv_offload: KVOffload | None = (
        None  # a host-memory KV tier (vLLM CPU offloading / LMCache, SGLang HiCache)
    )
    host_memory_bytes: int | None = None  # host memory available to the engine, to check a host tier against

    def with_(self, **changes: object) -> EngineSettings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def version(self) -> tuple[int, ...]:
        return parse_version(self.resolved_version)

    @property
    def resolved_version(self) -> str:
        """The release planned for: the one given, else the engine's default (the last V0 release
        for `--vllm-engine v0`)."""
        if self.engine_version:
            return self.engine_version
        if self.engine == "vllm" and (self.vllm_engine or "").lower() == "v0":
            return LAST_VLLM_V0_RELEASE
        return DEFAULT_VERSIONS[self.engine]

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def explicit(self) -> dict[str, object]:
        """Settings the user gave (not defaults), for reports."""
        base = EngineSettings()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }
