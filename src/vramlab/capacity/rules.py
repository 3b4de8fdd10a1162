"""Every release-keyed rule of the capacity model, named, with what it moves: the provenance of a version difference.

The policies key their rules on module constants (`UTIL_092_FROM = (0, 20)`, `FREE_SHARE = (((1, 0), 1.0), ...)`).
`release_rules()` finds every such constant in the capacity modules (a version tuple named `*_FROM`, `*_BEFORE`,
`*_AFTER`, `*_IN` or `*_UP_TO`, a `(first, end)` pair of versions, or a table of `(version, value)` steps) and pairs
it with its entry in `DESCRIBED`: the engine, one line of what changes at that release, the plan's components and
settings it moves, and where it was read. A version rule without an entry fails tests/test_capacity_rules.py, so a
new rule says what it does. `crossed(engine, a, b)` are the rules whose answer differs between two releases
(capacity/regression.py names them beside the components that moved).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module
from typing import Any

from vramlab.capacity.settings import parse_version

# Where release rules live (first module wins when another imports the constant).
RULE_MODULES = (
    "defaults",
    "engines.common",
    "engines.vllm_eras",
    "engines.vllm_mm",
    "engines.sglang",
    "engines.llamacpp",
    "engines.llamacpp_graph",
    "engines.llamacpp_params_fit",
    "engines.llamacpp_fit",
    "engines.tgi",
    "engines.ollama",
    "engines.ollama_graph",
    "engines.ollama_server",
    "engines.vllm_auto",
    "engines.transformers",
    "speculative",
    "offload",
)
_NAME = re.compile(r"_(FROM|BEFORE|AFTER|IN|UP_TO)$")
Version = tuple[int, ...]

POOL = ("kv_cache", "kv_cache_tokens", "max_concurrency")


@dataclass(frozen=True)
class Described:
    engine: str
    what: str  # one line: what the plan does differently from that release on
    moves: tuple[str, ...]  # components, resolved settings and figures it changes
    source: str  # file and release it was read in


# NAME | engine | what the plan does differently from that release on | what it moves (POOL: the KV pool's bytes,
# tokens and concurrency) | where it was read
_TABLE = """
GEMMA3_SKIP_FROM | vllm | Gemma 3 skips its rope factor in the derived context | max_model_len POOL | vllm/config.py 0.8.0
VLLM_WINDOW_ROPE_REFUSAL_BEFORE | vllm | the sliding window off with rope scaling is refused before this | max_model_len fits | vllm/config.py, vllm/config/model.py 0.11
VLLM_GEMMA2_WINDOW_FORCED | vllm | Gemma 2's sliding window is forced off (context capped at the window) | max_model_len kv_bytes_per_token POOL | PR #5908 / #10584 merge dates
UTIL_092_FROM | vllm | gpu_memory_utilization defaults to 0.92 (0.9 before) | gpu_memory_utilization budget_bytes POOL | vllm/config/cache.py 0.20.0
V1_BATCH_BY_NAME_ONLY_FROM | vllm | V1 batch defaults: 1024 sequences only on H100/H200 (every card before) | max_num_seqs activation_peak cuda_graphs POOL | EngineArgs._set_default_args_v1 0.8.4
V1_BATCH_BY_MEMORY_FROM | vllm | V1 batch defaults by card memory (>= 70 GiB), not by name | max_num_seqs max_num_batched_tokens activation_peak cuda_graphs POOL | EngineArgs._set_default_args_v1 0.8.5
BATCH_DEFAULTS_BY_GPU_FROM | vllm | A100 excluded from the larger V1 batch defaults | max_num_seqs max_num_batched_tokens activation_peak cuda_graphs POOL | PR #17885, 0.9.0
V0_CHUNKED_BUDGET_2048_FROM | vllm | V0 chunked prefill profiles 2048 tokens (512 in 0.6) | max_num_batched_tokens activation_peak POOL | vllm/engine/arg_utils.py 0.7
LORA_IN_WEIGHTS_FROM | vllm | LoRA slots are allocated before the weights line and count as weights | weights activation_peak POOL | PunicaWrapperGPU log order 0.7.3 / 0.8.1
BNB_DQ_EXPANDED_FROM | vllm | bitsandbytes double-quant statistics expand to fp32 at load | weights POOL | PR #19742, 0.9.2
V1_DEFAULT_FROM | vllm | the V1 engine is the default (V0 before) | engine_mode activation_peak non_torch cuda_graphs cuda_context POOL | vllm/envs.py 0.8.0
V0_REMOVED_IN | vllm | the V0 engine is gone | engine_mode fits | 0.11.0 release
V1_SNAPSHOT_FROM | vllm | V1 takes a baseline snapshot after the CUDA context: the context leaves the budget | cuda_context budget_bytes POOL | v1/worker/gpu_worker.py 0.9.1
NCCL_BEFORE_SNAPSHOT_FROM | vllm | NCCL init happens before the snapshot: outside the budget | nccl non_torch POOL | v1/worker/gpu_worker.py 0.11.0
GRAPH_ESTIMATE_FROM | vllm | the CUDA-graph estimate is taken from the budget during profiling | cuda_graphs POOL | envs VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS 0.20.0
TOKENS_AS_CONCURRENCY_FROM | vllm | hybrid models report KV tokens as concurrency x max_model_len | kv_cache_tokens | v1/core/kv_cache_utils.py 0.27
MODELLED_FROM | vllm | releases before this: unknown terms, bands widened | activation_peak non_torch cuda_graphs | vramlab's measured eras
MODELLED_UP_TO | vllm | releases after this: unknown terms, bands widened | activation_peak non_torch cuda_graphs | vramlab's measured eras
V0_MLA_ABSORPTION | vllm | V0 MLA keeps absorbed matrices beside the raw weights | weights POOL | attention/backends/mla/utils.py 0.7.1-0.7.3
FLASHINFER_OPT_IN_FROM | vllm | the FlashInfer sampler becomes opt-in (it ran whenever installed before) | sampler activation_peak POOL | envs VLLM_USE_FLASHINFER_SAMPLER 0.11.1
TRITON_TOP_K_TOP_P_FROM | vllm | the Triton top-k/top-p sampler replaces the sort for batches >= 8 | sampler activation_peak POOL | v1/sample/ops/topk_topp_sampler.py 0.17
FLASHINFER_SAMPLER_DEFAULT_FROM | vllm | the FlashInfer sampler is on by default | sampler activation_peak POOL | envs VLLM_USE_FLASHINFER_SAMPLER 0.22
WARM_NATIVE_SAMPLER_FROM | vllm | the profile also warms the native sampler: the larger peak counts | activation_peak POOL | gpu_model_runner.py _dummy_sampler_run 0.22
MOE_WORKSPACE_PERSISTS_FROM | vllm | the fused-MoE workspace persists through the sampler | activation_peak POOL | fused_moe/modular_kernel.py 0.13
TOTAL_CONSUMED_FROM | vllm | the budget charges everything cudaMemGetInfo saw consumed | non_torch POOL | vllm/utils/mem_utils.py 0.27
FRAMES_CAP_14_FROM | vllm | a profiled video is capped at 14 frames (16 before) | activation_peak POOL | multimodal profiling 0.11
ONE_PER_MODALITY_FROM | vllm | the encoder profile counts one item per modality | activation_peak POOL | multimodal budget 0.13
FLOOR_ITEMS_FROM | vllm | the encoder profile floors its item count and caps it by max_model_len | activation_peak POOL | MultiModalBudget.get_max_items 0.10.2
IMAGES_OFF_VIDEO_BEFORE | vllm | a prompt's images come off the video's frames | activation_peak POOL | multimodal profiling to 0.9
NEW_HEURISTIC_FROM | sglang | mem_fraction_static from the reservation heuristic (chunk, graph batch, TP x PP) | mem_fraction_static chunked_prefill_size cuda_graph_max_bs budget_bytes POOL | server_args.py 0.5.3 (PR #10975)
GPU_BUCKETS_FROM | sglang | mem_fraction_static by GPU-size bucket (by TP size before) | mem_fraction_static budget_bytes POOL | PR #7054, 0.4.7
QWEN3_MOE_EAGER_EXPERT_DICT | sglang | Qwen3-MoE keeps its bf16 experts referenced through online FP8 | weights POOL | models/qwen3_moe.py 0.4.7-0.5.8
HYBRID_SWA_FROM | sglang | the hybrid sliding-window pool for the allowlisted architectures | kv_cache_tokens max_concurrency | PR #7367
GPT_OSS_HYBRID_AFTER | sglang | GPT-OSS gets the hybrid sliding-window pool | kv_cache_tokens max_concurrency | server_args.py after 0.5.8
SGLANG_SPEC_HEADROOM_BEFORE | sglang | speculative decoding adds max_reqs x (steps x topk + draft tokens) + 100 tokens to both pools | speculative speculative_slots draft_kv kv_cache_tokens max_concurrency | model_runner.py init_memory_pool to 0.5.6
SGLANG_SPEC_RESERVE_4G_FROM | sglang | the default fraction keeps 4 GiB for an EAGLE draft (2 GiB before) | mem_fraction_static budget_bytes POOL | server_args.py 0.5.10
SGLANG_DRAFT_IN_BUDGET_FROM | sglang | the draft's weights count against mem_fraction_static and its KV is sized with the target's | speculative draft_weights draft_kv mem_fraction_static kv_bytes_per_token POOL | PR #23862, 0.5.14
SGLANG_OTHER_SMALL_FROM | sglang | speculative defaults (3, 1, 4) for models outside the named families ((5, 4, 8) before) | speculative speculative_slots draft_kv | server_args.py auto_choose_speculative_params 0.5.8
SGLANG_GLM_SMALL_FROM | sglang | speculative defaults (3, 1, 4) for GLM-4.5 and MiMo-V2 ((5, 4, 8) before) | speculative | server_args.py auto_choose_speculative_params 0.5.7
CTX_FROM_MODEL_FROM | llama.cpp | n_ctx from the model when -c is absent (4096 before) | ctx_size kv_cache activation_peak | common/arg.cpp b5000
FLASH_ATTN_AUTO_FROM | llama.cpp | flash attention auto (on where supported) | flash_attn activation_peak | b6200
UNIFIED_FOUR_SLOTS_FROM | llama.cpp | -np auto: 4 slots sharing one unified KV buffer | parallel kv_unified max_concurrency kv_cache | PR #16736
PER_SEQ_PAD_FROM | llama.cpp | each stream's cells padded to 256 without a unified cache | kv_size_padded kv_cache | PR #17046
KV_STREAMS_FROM | llama.cpp | the attention graph reads one KV stream's cells (a stream per slot without --kv-unified) | activation_peak | PR #14363 (b5920 taken)
LOGITS_PER_SEQ_FROM | llama.cpp | llama-server reserves logits for one row per sequence, not n_ubatch | activation_peak draft_compute | PR #23861
LLAMACPP_DRAFT_ONE_SLOT_FROM | llama.cpp | -np auto stays at 1 slot with a draft model | parallel kv_unified draft_kv draft_compute max_concurrency kv_cache | PR #17017
LLAMACPP_SHARED_DRAFT_CTX_FROM | llama.cpp | one draft context for every slot (one per slot before) | speculative draft_kv draft_compute parallel kv_cache | PR #22838
TGI_DEFAULT_CAP | tgi | the default max_total_tokens cap (2048 in 1.x, 4096 in 2.x) | max_model_len POOL | launcher/src/main.rs
TGI_UNCAPPED_FROM | tgi | max_total_tokens from the warm-up batch, no fixed cap | max_model_len POOL | launcher 3.0
TGI_WINDOW_CHECK | tgi | sliding-window models refused without windowed attention | fits | models/__init__.py 2.1.0-2.4.0
FRACTION_WIGGLE_FROM | tgi | warm-up keeps a share of the card, not of the free memory | POOL | flash_causal_lm.py 3.0
FREE_SHARE | tgi | the share of free memory warm-up keeps back (1.x-2.x) | POOL | flash_causal_lm.py warmup
CARD_WIGGLE | tgi | TGI_WIGGLE_ROOM by release (3.x) | POOL | globals.py
FLASHINFER_FROM | tgi | flashinfer attention by default: blocks of 1 token | block_size kv_cache_tokens | launcher 2.3.0
LOGSOFTMAX_IN_PLACE_FROM | tgi | log_softmax in place: one copy of the warm-up logits | activation_peak POOL | generate_token 2.4
NO_PREFILL_LOGPROBS_FROM | tgi | no prefill logprobs at warm-up: next-token rows only | activation_peak POOL | from_pb 3.0
CONTEXT_4096_FROM | ollama | default num_ctx 4096 (2048 before) | max_model_len kv_cache activation_peak | envconfig v0.6.8
PARALLEL_ONE_FROM | ollama | OLLAMA_NUM_PARALLEL defaults to 1 (4 when it fits before) | parallel kv_cache | v0.10.0
LAST_LAYER_FIRST_FROM | ollama | layers placed from the last one down | weights kv_cache fits | llm/memory.go v0.7.0
GPTOSS_PARTIAL_ONLY_FROM | ollama | gpt-oss's graph: 2 x GQA x KV / 6, full = partial (4 x and twice that before) | activation_peak fits | fs/ggml/ggml.go v0.11.5
GPTOSS_FLASH_FROM | ollama | gpt-oss turns flash attention on itself; its graph is (4 x parallel + context / 1024 + 110) MiB | flash_attention activation_peak fits | fs/ggml/ggml.go v0.11.8
FLASH_ENV_OVERRIDES_FROM | ollama | OLLAMA_FLASH_ATTENTION overrides the model's own default (OR'd with it before) | flash_attention kv_cache activation_peak | llm/memory.go v0.12.5
LOGITS_TO_KEEP_FROM | transformers | generate computes the last token's logits only | activation_peak | transformers 4.45
CHECKPOINT_DTYPE_FROM | transformers | from_pretrained loads the checkpoint's own dtype | weights kv_cache | transformers 5.0
FIT_FROM | llama.cpp | llama-server's --fit (on by default) moves weights to the host and cuts the context to fit each device | weights kv_cache ctx_size n_gpu_layers activation_peak fits | PR #16653 (b7414)
STREAMS_FROM | llama.cpp | --fit's context target is the trained context x the streams of a non-unified cache | ctx_size kv_cache | PR #27496
EXPLICIT_ZERO_CTX_FROM | llama.cpp | -c 0 keeps the trained context under --fit | ctx_size kv_cache | PR #19070
VRAM_TIERS_FROM | ollama | default num_ctx by the cards' total VRAM (4,096 / 32,768 / 262,144) | max_model_len kv_cache activation_peak | server/routes.go v0.15.5
LLAMA_SERVER_FROM | ollama | Ollama starts upstream llama-server, whose --fit places the layers | weights kv_cache activation_peak fits | PR #16031, v0.30.0
LLAMA_CPP_BUILDS | ollama | the llama.cpp build Ollama ships (its LLAMA_CPP_VERSION) | weights kv_cache activation_peak | ollama/ollama tags
AUTO_FROM | vllm | --max-model-len auto / -1 fits the longest context one request holds in the pool | max_model_len max_concurrency fits | PR #29431, 0.12.0
VLLM_OFFLOADING_CONNECTOR_FROM | vllm | the OffloadingConnector (--kv-transfer-config) exists | kv_offload | v1/kv_offload 0.11.0
VLLM_KV_OFFLOADING_SIZE_FROM | vllm | --kv-offloading-size / --kv-offloading-backend exist | kv_offload | engine/arg_utils.py 0.11.1
VLLM_CPU_BYTES_FROM | vllm | the OffloadingConnector takes cpu_bytes_to_use (num_cpu_blocks before) | kv_offload | v1/kv_offload/cpu.py 0.14
VLLM_LMCACHE_MP_FROM | vllm | --kv-offloading-backend lmcache runs a separate LMCache server (in process before) | kv_offload lmcache_buffer | vllm/config/vllm.py 0.23
"""


def _parse(table: str) -> dict[str, Described]:
    out = {}
    for line in filter(None, (ln.strip() for ln in table.splitlines())):
        name, engine, what, moves, source = (cell.strip() for cell in line.split("|"))
        items = tuple(m for word in moves.split() for m in (POOL if word == "POOL" else (word,)))
        out[name] = Described(engine, what, items, source)
    return out


DESCRIBED: dict[str, Described] = _parse(_TABLE)


@dataclass(frozen=True)
class ReleaseRule:
    name: str
    module: str
    shape: str  # "since" (a first release) | "range" ([first, end)) | "table" (version steps)
    boundaries: tuple[Version, ...]
    described: Described | None

    def answer(self, version: Version) -> int:
        """Which side of the rule a release is on (the step index for a table)."""
        if self.shape == "range":
            low, high = self.boundaries
            return int(low <= version < high)
        return sum(1 for b in self.boundaries if version >= b)

    def to_json(self) -> dict[str, Any]:
        d = self.described
        return {
            "rule": self.name,
            "module": f"capacity/{self.module.replace('.', '/')}.py",
            "releases": [".".join(map(str, b)) for b in self.boundaries],
            "engine": d.engine if d else None,
            "what": d.what if d else "not described",
            "moves": list(d.moves) if d else [],
            "source": d.source if d else None,
        }


def _is_version(v: object) -> bool:
    return isinstance(v, tuple) and bool(v) and all(type(x) is int for x in v)


def _shape(name: str, v: object) -> tuple[str, tuple[Version, ...]] | None:
    if _is_version(v) and _NAME.search(name):
        return "since", (v,)  # type: ignore[return-value]
    if isinstance(v, tuple) and len(v) == 2 and all(_is_version(x) for x in v):
        return "range", tuple(v)
    if (
        isinstance(v, tuple)
        and v
        and all(isinstance(x, tuple) and len(x) == 2 and _is_version(x[0]) for x in v)
    ):
        return "table", tuple(sorted(x[0] for x in v))
    return None


@lru_cache(maxsize=1)
def release_rules() -> tuple[ReleaseRule, ...]:
    """Every release-keyed constant of the capacity modules, with its description (None when it has none)."""
    seen: dict[str, ReleaseRule] = {}
    for module in RULE_MODULES:
        mod = import_module(f"vramlab.capacity.{module}")
        for name, value in vars(mod).items():
            if not name.isupper() or name in seen:
                continue
            shape = _shape(name, value)
            if shape:
                seen[name] = ReleaseRule(name, module, shape[0], shape[1], DESCRIBED.get(name))
    return tuple(seen.values())


def crossed(engine: str, a: str, b: str) -> list[ReleaseRule]:
    """The rules of *engine* whose answer differs between releases *a* and *b*."""
    va, vb = parse_version(a), parse_version(b)
    return [
        rule
        for rule in release_rules()
        if rule.described is not None
        and rule.described.engine == engine
        and rule.answer(va) != rule.answer(vb)
    ]
