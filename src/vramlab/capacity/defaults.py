"""Every default an engine derives before it sizes anything, per engine and release: one place.

The engine policies, and through them the plan text, the JSON, the sweep and the suggestions, read the
defaults from here; none decides one of its own. The context an engine derives from a config (and what
the sliding window does to it: vLLM's cap with the window off, TGI's refusal without windowed attention), the
batch defaults of each vLLM release and card, SGLang's memory fraction, chunk and graph batch, and
TGI's total and prefill tokens. Where each rule comes from (file, release) is in docs/capacity-model.md,
"Derived defaults".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlab.capacity.engines.common import Context
    from vramlab.capacity.settings import EngineSettings
    from vramlab.capacity.spec import ModelSpec

# --- the context each engine derives from the config -------------------------------------------------------
# vLLM `_get_and_verify_max_len` (vllm/config.py to 0.10, vllm/config/model.py after): the factor is not applied
# for rope types whose max_position_embeddings already states the extended length; yarn scales
# original_max_position_embeddings; model types containing "gemma3" skip the factor altogether (their
# max_position_embeddings, 128K, is already scaled), a clause that came with Gemma 3 support in 0.8.0.
VLLM_NO_FACTOR_TYPES = ("su", "longrope", "llama3")
GEMMA3_SKIP_FROM = (0, 8)
# vLLM's patch_rope_scaling_dict turns "mrope" into "default", which has no factor.
NO_FACTOR_TYPES = ("default", "mrope")
# TGI's launcher (launcher/src/main.rs): max_position_embeddings, else max_seq_len, read raw from config.json
# (no rope factor); 1.x-2.x then cap the default at 4096 (2.x, "tgi will now set its default to 4096") or 2048.
TGI_DEFAULT_CAP = (((2,), 4096), ((1,), 2048))
TGI_UNCAPPED_FROM = (3, 0)

# --- the sliding window ----------------------------------------------------------------------------------
# vLLM `_get_and_verify_max_len`: with the window disabled (--disable-sliding-window, or forced below) the length
# from the config is capped at the (smallest) sliding window before the rope factor is applied, and every layer is
# then full attention (get_sliding_window() returns None). ModelSpec.sliding_window is already None where the config
# turns the window off (Qwen2's `use_sliding_window: false`), as vLLM's get_hf_config_sliding_window does.
# A rope type other than su/longrope/llama3 (Gemma 3 excepted: its whole rope clause is skipped) then raises
# NotImplementedError("Disabling sliding window is not supported for models with rope_scaling") in vllm/config.py
# (to 0.10) and in the first vllm/config/model.py (the 0.11 one, which still reads `rope_scaling` and announces
# removals "in v0.12.0"); the later copy that reads `rope_parameters` no longer raises and multiplies the capped
# length by the factor (yarn restarts from original_max_position_embeddings). The first release without the
# refusal is not pinned: planned as 0.12.0.
VLLM_WINDOW_ROPE_REFUSAL_BEFORE = (0, 12)
# ModelConfig.__init__ (vllm/config.py) forced disable_sliding_window for model_type "gemma2" with a window: "Gemma 2
# uses sliding window attention for every odd layer, which is currently not supported by vLLM" (PR #5908, merged
# 2024-06-27, first in 0.5.1); PR #10584 ("gemma2 full context length support", merged 2024-11-23, first in 0.6.5)
# kept the cap only for VLLM_ATTENTION_BACKEND=XFORMERS (later also FLASHINFER, V0 only), an environment variable
# vramlab does not model. The range is from the PR merge dates, not read at the tags.
VLLM_GEMMA2_WINDOW_FORCED = ((0, 5, 1), (0, 6, 5))


@dataclass(frozen=True)
class DerivedContext:
    tokens: int
    rule: str  # how the engine got there, one clause


def vllm_window_off(
    model: ModelSpec, version: tuple[int, ...] | None, disable_sliding_window: bool
) -> str | None:
    """Why vLLM at *version* runs this model without its sliding window (every layer full attention, the context
    capped at the window), or None when it keeps the window."""
    if not model.sliding_window:
        return None
    if disable_sliding_window:
        return "--disable-sliding-window"
    low, high = VLLM_GEMMA2_WINDOW_FORCED
    if model.model_type == "gemma2" and version and low <= version < high:
        return "vLLM 0.5.1-0.6.4 turns Gemma 2's sliding window off"
    return None


def derived_context(
    model: ModelSpec,
    engine: str,
    version: tuple[int, ...] | None = None,
    rope_factor: float | None = None,
    disable_sliding_window: bool = False,
) -> DerivedContext:
    """The longest context *engine* (at *version*) derives from the model's config; with a rope-scaling
    override (*rope_factor*), the base length times the user's factor. vLLM with the window off (see
    `vllm_window_off`) caps the config's length at the sliding window first."""
    base = model.max_position_embeddings
    if not base:
        return DerivedContext(0, "unknown: no max_position_embeddings in the config")
    window_off = vllm_window_off(model, version, disable_sliding_window) if engine == "vllm" else None
    if window_off:
        return _vllm_windowless(model, version, rope_factor, window_off)
    if rope_factor:
        start = model.rope_original_max_position or base
        return DerivedContext(
            int(start * rope_factor), f"{start:,} x the rope-scaling override {rope_factor:g}"
        )
    kind = (model.rope_scaling_type or "").lower()
    factor = model.rope_scaling_factor if kind else 1.0
    if engine in ("tgi", "llama.cpp"):
        how = "the launcher reads it raw" if engine == "tgi" else "n_ctx_train, the GGUF context_length"
        return DerivedContext(base, f"max_position_embeddings {base:,} ({how}; no rope factor)")
    if engine == "sglang":
        # get_context_length (hf_transformers_utils.py): the factor unless the dict names
        # original_max_position_embeddings or the type is llama3; no model-type exception.
        if factor <= 1 or kind == "llama3" or model.rope_original_max_position or kind in NO_FACTOR_TYPES:
            return DerivedContext(base, f"max_position_embeddings {base:,}")
        return DerivedContext(
            int(base * factor), f"max_position_embeddings {base:,} x rope factor {factor:g}"
        )
    return _vllm_context(model, kind, factor, version)


def _vllm_context(
    model: ModelSpec, kind: str, factor: float, version: tuple[int, ...] | None
) -> DerivedContext:
    base = model.max_position_embeddings
    if factor <= 1 or kind in VLLM_NO_FACTOR_TYPES or kind in NO_FACTOR_TYPES:
        why = f" ({kind} configs state the extended length)" if kind in VLLM_NO_FACTOR_TYPES else ""
        return DerivedContext(base, f"max_position_embeddings {base:,}{why}")
    if "gemma3" in model.model_type and (not version or version >= GEMMA3_SKIP_FROM):
        return DerivedContext(
            base,
            f"max_position_embeddings {base:,} (Gemma 3's is already scaled: its rope "
            f"factor {factor:g} is not applied)",
        )
    if kind == "yarn" and model.rope_original_max_position:
        start = model.rope_original_max_position
        return DerivedContext(
            int(start * factor), f"yarn: original_max_position_embeddings {start:,} x {factor:g}"
        )
    return DerivedContext(
        int(base * factor), f"max_position_embeddings {base:,} x {kind} rope factor {factor:g}"
    )


def _vllm_windowless(
    model: ModelSpec, version: tuple[int, ...] | None, rope_factor: float | None, why: str
) -> DerivedContext:
    from vramlab.errors import ConfigError

    window = model.sliding_window or 0
    base = model.max_position_embeddings
    capped = min(base, window)
    rule = (
        f"capped at the sliding window {window:,} ({why}; max_position_embeddings {base:,})"
        if capped < base
        else f"max_position_embeddings {base:,} (within the sliding window {window:,}; {why})"
    )
    kind = "override" if rope_factor else (model.rope_scaling_type or "").lower()
    factor = rope_factor or (model.rope_scaling_factor if kind else 1.0)
    skips = "gemma3" in model.model_type and not rope_factor and (not version or version >= GEMMA3_SKIP_FROM)
    if not kind or kind in VLLM_NO_FACTOR_TYPES or skips:
        return DerivedContext(capped, rule)
    if version and version < VLLM_WINDOW_ROPE_REFUSAL_BEFORE:
        raise ConfigError(
            f"vLLM: Disabling sliding window is not supported for models with rope_scaling ({why}; "
            f"{model.name} has {kind} rope scaling): vLLM {'.'.join(map(str, version))} refuses to start"
        )
    if kind == "yarn" and model.rope_original_max_position and not rope_factor:
        start = model.rope_original_max_position
        return DerivedContext(
            int(start * factor),
            f"yarn: original_max_position_embeddings {start:,} x {factor:g} "
            f"(replaces the sliding-window cap {capped:,}; {why})",
        )
    return DerivedContext(int(capped * factor), f"{rule}, x rope factor {factor:g}")


def tgi_warmup_total(derived: int, prefill_tokens: int) -> int:
    """TGI 3.x without --max-total-tokens: the server's warm-up sets it to the warm-up batch's own tokens
    (flash_causal_lm.py `warmup`: `max_total_tokens = sum(batch.cache_lengths)`), the router then prints "Maximum
    total tokens defaulted to N": the launcher's max_batch_prefill_tokens, itself at most max_position_embeddings
    (a gemma-3-27b-it start-up on two RTX A6000 defaulted to 8000, its prefill default)."""
    return max(1, min(derived, prefill_tokens))


def settings_context(model: ModelSpec, settings: EngineSettings) -> DerivedContext:
    """`derived_context` for these engine settings."""
    return derived_context(
        model,
        settings.engine,
        settings.version,
        settings.rope_scaling_factor,
        settings.disable_sliding_window,
    )


def default_context(model: ModelSpec, settings: EngineSettings) -> int:
    """max_model_len when none is given: the derived context, less what the release caps it at."""
    version = settings.version
    derived = settings_context(model, settings).tokens
    if settings.engine == "tgi" and derived and version and version < TGI_UNCAPPED_FROM:
        cap = next((c for since, c in TGI_DEFAULT_CAP if version >= since), 2048)
        return min(derived, cap)
    return derived


def context_note(model: ModelSpec, settings: EngineSettings, resolved: int) -> str | None:
    """One line for the plan saying where a default max_model_len came from (None when one was given)."""
    if settings.max_model_len or settings.ctx_size or not resolved:
        return None
    derived = settings_context(model, settings)
    engine = f"{settings.engine} {settings.resolved_version}"
    if settings.engine == "llama.cpp" and resolved < derived.tokens:
        return (
            f"context per slot {resolved:,}: {engine} takes n_ctx from the config ({derived.tokens:,}, "
            f"{derived.rule}), split over the slots or cut by --fit (the notes say which)"
        )
    if settings.engine == "llama.cpp":
        return f"context per slot {resolved:,}: {engine} takes n_ctx from the config, {derived.rule}"
    if resolved < derived.tokens and settings.engine == "tgi" and settings.version >= TGI_UNCAPPED_FROM:
        return (
            f"max_model_len {resolved:,}: {engine} sets max_total_tokens at warm-up when it is not given, to the "
            f"warm-up batch's tokens (max_batch_prefill_tokens); the config gives {derived.tokens:,}, {derived.rule}"
        )
    if resolved < derived.tokens:
        return (
            f"max_model_len {resolved:,}: {engine} caps its default there; the config gives {derived.tokens:,}, "
            f"{derived.rule}"
        )
    return f"max_model_len {resolved:,}: the default {engine} derives from the config, {derived.rule}"


def context_limit(model: ModelSpec, settings: EngineSettings) -> int:
    """The longest max_model_len a plan searches up to: the derived context (or the one given, if longer)."""
    derived = settings_context(model, settings).tokens
    return max(derived, settings.max_model_len or 0) or (1 << 20)


# --- vLLM: utilization and batch defaults -----------------------------------------------------------------
# The 0.20.0 wheel: config/cache.py gpu_memory_utilization defaults to 0.92 (0.19: 0.9).
UTIL_092_FROM = (0, 20)
V1_BATCH_BY_NAME_ONLY_FROM = (0, 8, 4)  # 0.8.0-0.8.3: `default_max_num_seqs = 1024` whatever the card
V1_BATCH_BY_MEMORY_FROM = (0, 8, 5)  # `device_memory >= 70 * GiB_bytes` replaces the H100/H200 name test
BATCH_DEFAULTS_BY_GPU_FROM = (0, 9)  # ... and A100 is excluded ("NOTE(Kuntai)", PR #17885)
# V0 EngineArgs: `use_long_context = max_model_len > 32K` turns chunked prefill on (CUDA, no
# sliding window); the scheduler then profiles max_num_batched_tokens, 512 in the 0.6 series
# ("Chunked prefill is enabled with max_num_batched_tokens=512."), 2048 later.
V0_LONG_CONTEXT_ABOVE = 32 * 1024
V0_CHUNKED_BUDGET_2048_FROM = (0, 7)


def vllm_context(ctx: Context) -> int:
    from vramlab.errors import ConfigError

    length = ctx.settings.max_model_len or ctx.default_context
    if not length:
        raise ConfigError(
            f"the context length of {ctx.model.name} is unknown (no max_position_embeddings "
            "in its config): pass --max-model-len"
        )
    return length


def vllm_batch(ctx: Context, kind: str) -> tuple[float, int, int]:
    """(gpu_memory_utilization, max_num_seqs, max_num_batched_tokens) as vLLM would pick them."""
    settings, version = ctx.settings, ctx.version
    util = settings.gpu_memory_utilization or (0.92 if version and version >= UTIL_092_FROM else 0.9)
    if kind == "v0":
        seqs = settings.max_num_seqs or 256
        if v0_chunked_prefill(ctx):
            budget = 2048 if not version or version >= V0_CHUNKED_BUDGET_2048_FROM else 512
            return util, seqs, settings.max_num_batched_tokens or budget
        return util, seqs, settings.max_num_batched_tokens or max(vllm_context(ctx), 2048)
    big, seqs_big_anyway = v1_big_card(ctx)
    tokens_default = (
        (8192 if settings.api_server else 16384) if big else (2048 if settings.api_server else 8192)
    )
    seqs_default = 1024 if big or seqs_big_anyway else 256
    return util, settings.max_num_seqs or seqs_default, settings.max_num_batched_tokens or tokens_default


def v1_big_card(ctx: Context) -> tuple[bool, bool]:
    """(the larger batch defaults apply, max_num_seqs is 1024 on every card) as `EngineArgs._set_default_args_v1`
    of each release decides: 0.8.0-0.8.3 1024 sequences everywhere and the larger token budget on H100/H200 by
    device name; 0.8.4 both on H100/H200 only; 0.8.5 on cards of >= 70 GiB; 0.9.0 excludes A100 (PR #17885)."""
    version, gpu = ctx.version, ctx.gpu
    by_name = "h100" in gpu.name or "h200" in gpu.name
    if version and version < V1_BATCH_BY_NAME_ONLY_FROM:
        return by_name, True
    if version and version < V1_BATCH_BY_MEMORY_FROM:
        return by_name, False
    # `get_device_total_memory()` is NVML's total (0 where NVML cannot read it: unified memory), not the slice or
    # cap the process sees (GPU.defaults_memory_gib)
    if version and version < BATCH_DEFAULTS_BY_GPU_FROM:
        return gpu.defaults_memory_gib >= 70, False
    return gpu.defaults_memory_gib >= 70 and not gpu.is_a100, False


def v0_chunked_prefill(ctx: Context) -> bool:
    """V0 turns chunked prefill on for contexts above 32k on CUDA models without a sliding window."""
    asked = ctx.settings.enable_chunked_prefill
    if asked is not None:
        return asked
    window = ctx.model.sliding_window and not vllm_window_off(
        ctx.model, ctx.version, ctx.settings.disable_sliding_window
    )
    return vllm_context(ctx) > V0_LONG_CONTEXT_ABOVE and ctx.gpu.vendor == "nvidia" and not window


# --- SGLang: chunk, graph batch and memory fraction -----------------------------------------------------
NEW_HEURISTIC_FROM = (0, 5, 3)
# PR #7054 ("Simplify the heuristics for setting --mem-fraction-static", merged 2025-06-10, the day 0.4.7
# was tagged): GPU-size buckets replace the TP-size table; 0.4.7 itself is taken as the first with buckets.
GPU_BUCKETS_FROM = (0, 4, 7)


def sglang_gpu_defaults(ctx: Context) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) defaults by card size and TP.

    From 0.5.3 (PR #10975, `_handle_gpu_memory_settings`): < 20 GiB 2048 / 8; < 35 GiB 2048 / 24 (80 at
    TP >= 4); < 60 GiB 4096 / 32 (160); < 160 GiB 8192 / 256 (512); above 16384 / 512. Before, the
    buckets recorded in docs/research/capacity-anchors.md §2 (a ~0.4.3 L4 log printed 2048 / 80 at TP 4)."""
    gib = ctx.gpu.memory_gib
    if not ctx.version or ctx.version >= NEW_HEURISTIC_FROM:
        big = ctx.tp >= 4
        if gib < 20:
            return 2048, 8
        if gib < 35:
            return 2048, (80 if big else 24)
        if gib < 60:
            return 4096, (160 if big else 32)
        if gib < 160:
            return 8192, (512 if big else 256)
        return 16384, 512
    if gib < 35:
        return 2048, (8 if ctx.tp < 4 else 80)
    if gib < 160 and ctx.gpu.arch != "cdna3":
        return 8192, (256 if ctx.tp < 4 else 512)
    return 16384, 512


def sglang_tp_fraction(ctx: Context) -> float:
    """ServerArgs.__post_init__ before PR #7054 (merged 2025-06-10): the fraction follows the TP size only.
    0.1.x: 0.90 / 0.85 (TP 2) / 0.82 (TP 4) / 0.80 (TP 8); 0.2 onwards 0.88 / 0.87 / 0.85 / 0.81 (TP 8;
    0.83 in some 0.2-0.3 releases, not pinned) / 0.79 (TP 16)."""
    tp = ctx.tp  # one 0.4 copy keys it on world_size instead (TP x PP): equal at PP 1
    table: tuple[tuple[int, float], ...]
    if ctx.version and ctx.version < (0, 2):
        table = ((8, 0.80), (4, 0.82), (2, 0.85), (1, 0.90))
    else:
        table = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
    return next(frac for size, frac in table if tp >= size)


def speculative_reserve_mib(ctx: Context) -> float:
    """What the default fraction keeps back for a draft (capacity/speculative_sglang.py)."""
    if ctx.settings.speculative is None:
        return 0.0
    from vramlab.capacity.speculative_sglang import sglang_reserve_mib

    return sglang_reserve_mib(ctx)


def sglang_fraction(ctx: Context, chunk: int, graph_bs: int) -> float:
    gib = ctx.gpu.memory_gib
    world = ctx.tp * ctx.pp
    if ctx.version and ctx.version < GPU_BUCKETS_FROM:
        return sglang_tp_fraction(ctx)
    if ctx.version and ctx.version < NEW_HEURISTIC_FROM:
        if gib < 35:
            reserved = 2.8 + world / 10
        elif gib < 90:
            reserved = 9.5 + world / 2
        elif gib < 160:
            reserved = 12 + world / 2
        else:
            reserved = 32
        return round((gib - reserved - speculative_reserve_mib(ctx) / 1024) / gib, 3)
    reserved_mib = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + world / 8 * 1024
    reserved_gib = reserved_mib / 1024
    if gib > 60:
        reserved_gib = max(reserved_gib, 10)
    reserved_gib += speculative_reserve_mib(ctx) / 1024  # added after the 10 GiB floor (0.5.6)
    frac = round((gib - reserved_gib) / gib, 3)
    return frac if 0 < frac < 1 else 0.88


def sglang_max_running(pool_tokens: int, context_len: int) -> int:
    """max_running_requests when not given (model_runner.py `init_memory_pool`): the pool over the context x 512,
    at least 2048 and at most 4096 (other releases' copies have no upper bound or 5120: not told apart here)."""
    return min(max(int(pool_tokens / max(1, context_len) * 512), 2048), 4096)


# --- TGI: prefill tokens -------------------------------------------------------------------------------
# GPU name -> f16 TFLOP/s in the 3.x launcher's `ComputeType::f16_flop` (cards whose nvidia-smi name it
# does not recognise, e.g. "NVIDIA GeForce RTX 4090", "Tesla T4", "NVIDIA H100 PCIe", get no compute estimate).
LAUNCHER_TFLOPS = {
    "l4": 121,
    "l40": 181,
    "l40s": 363,
    "a10g": 125,
    "a40": 149,
    "h100-80gb": 900,
    "h100-nvl": 900,
    "a100-80gb": 312,
    "a100-40gb": 312,
    "a100-80gb-pcie": 312,
    "h200": 989,
}


# server/text_generation_server/models/__init__.py `get_model` (v2.1.0 to v3.3.6): a config `sliding_window` (read from
# the top-level config.json) with `max_input_tokens > sliding_window` on a backend where SUPPORTS_WINDOWING is False
# raises "The backend ... does not support sliding window attention"; layers/attention/cuda.py sets it to
# flash-attn v2 being importable (Ampere and newer; Turing runs flash-attn v1, Volta none), rocm.py to False.
# The launcher passes --max-input-tokens always to v2.4.0 (default max_total_tokens - 1) and only when given from
# v2.4.1 (launcher/src/main.rs), so a default start checks the window in 2.1.0-2.4.0 only.
TGI_WINDOW_CHECK = ((2, 1), (2, 4, 1))
NO_FLASH_ATTN_V2 = ("pascal", "volta", "turing")


def tgi_window_refusal(ctx: Context, max_total: int) -> str | None:
    """TGI's start-up refusal of a sliding-window model on a backend without windowed attention, or None."""
    m, version = ctx.model, ctx.version
    low, high = TGI_WINDOW_CHECK
    # a vision-language config keeps `sliding_window` in its text_config: the top-level read finds none
    window = None if m.vision_params else m.sliding_window
    windowing = ctx.gpu.vendor == "nvidia" and ctx.gpu.arch not in NO_FLASH_ATTN_V2
    max_input = max_total - 1
    if not window or windowing or not version or not low <= version < high or max_input <= window:
        return None
    backend = "ROCm" if ctx.gpu.vendor == "amd" else f"CUDA without flash-attn v2 ({ctx.gpu.arch.title()})"
    return (
        f"TGI {'.'.join(map(str, version))} refuses to start: the {backend} backend does not support sliding window "
        f"attention, and max_input_tokens {max_input:,} is above the model's sliding_window {window:,} (pass "
        f"--max-model-len {window + 1} or less)"
    )


def tgi_prefill_tokens(ctx: Context, max_total: int) -> int:
    """`--max-batch-prefill-tokens` when not given. 1.x: 4096. 2.x: max_input_tokens + 50 (max_input =
    max_total - 1). 3.x (launcher main.rs): min(card f16 FLOP/s x shards / model FLOP per token, else 4096
    (10,000 for Qwen2-VL, 8,000 for Gemma 3); max_position_embeddings; the tokens the card's VRAM allows)."""
    m, version = ctx.model, ctx.version
    if version and version < (2,):
        return 4096
    if version and version < TGI_UNCAPPED_FROM:
        return max_total - 1 + 50
    # the launcher reads the top-level config's model_type: multimodal Gemma 3 is "gemma3" (1B is "gemma3_text")
    top_type = {
        "Gemma3ForConditionalGeneration": "gemma3",
        "Qwen2VLForConditionalGeneration": "qwen2_vl",
        "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    }.get(m.architecture, m.model_type)
    default = {"qwen2_vl": 10_000, "qwen2_5_vl": 10_000, "gemma3": 8000}.get(top_type, 4096)
    tflops = LAUNCHER_TFLOPS.get(ctx.gpu.name)
    if tflops and not m.vision_params:
        # the launcher's Config.flop: config intermediate_size x (experts per token + shared experts), as read
        inter = m.intermediate_size * ((m.num_experts_per_tok or 1) + m.num_shared_experts)
        attn = 2 * m.head_dim * m.hidden_size * (3 * m.num_attention_heads + 2 * m.num_kv_heads)
        flop = (attn + 6 * m.hidden_size * inter) * m.num_layers
        optimal = int(tflops * 10**12 * ctx.tp // max(1, flop))
        if optimal > 100:
            default = optimal
    value = min(default, m.max_position_embeddings or default)
    fraction = ctx.settings.gpu_memory_utilization or 1.0
    available = int(ctx.gpu.memory_bytes * ctx.tp * fraction * 0.95)
    model_vram = 2 * (
        m.num_layers
        * (
            (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
            + m.num_attention_heads * m.head_dim * m.hidden_size
            + 3 * m.intermediate_size * max(1, m.num_experts) * m.hidden_size
        )
        + 2 * m.hidden_size * m.vocab_size
    )
    token_vram = (
        m.num_kv_heads * 2 * m.head_dim * 2 * m.num_layers
        + (m.intermediate_size + m.intermediate_size // 2) * max(1, m.num_experts) * 2 * 3
    )
    if ctx.quant is None and available > model_vram and token_vram:
        value = min(value, (available - model_vram) // token_vram)
    return max(1, value)
