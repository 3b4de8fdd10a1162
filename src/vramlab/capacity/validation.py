"""Type and range checks at the edge: engine flags and the numbers of a model's config.

Everything a user or a file hands the capacity model passes through here before any
arithmetic: 0 is never "not set", a negative, fractional, boolean, NaN or infinite value is
refused with the field's name in one line (ConfigError, exit 2), and sizes are capped by bounds
no real model or card reaches, so a hostile config cannot make `plan` run for minutes.

A declarative table, not a pydantic model: `plan` imports no heavy library (a test holds it to
that; pydantic alone costs ~0.2 s, more than the whole plan), and these are flat numeric fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vramlab.capacity.settings import EngineSettings, parse_version
from vramlab.errors import ConfigError

# Bounds well above every published model and card (the largest configs have ~130 layers,
# 10.5M positions, 262k vocabularies) and far below what would make planning slow.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # hidden / intermediate / expert widths
MAX_HEADS = 1 << 14
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 28
MAX_EXPERTS = 1 << 16
MAX_SEQS = 1 << 20
MAX_TOKENS = 1 << 30
MAX_GPUS = 4096
MAX_BYTES = 1 << 50


@dataclass(frozen=True)
class Rule:
    whole: bool  # a whole number (131072.0 accepted) or any real
    low: float
    high: float
    low_open: bool = False  # low itself is refused (utilization: > 0)

    def check(self, value: Any) -> str | None:
        """Why *value* is refused, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a {'whole ' if self.whole else ''}number, got {value!r}"
        if not math.isfinite(value):
            return f"must be finite, got {value!r}"
        if self.whole and isinstance(value, float) and not value.is_integer():
            return f"must be a whole number, got {value!r}"
        if value < self.low or (self.low_open and value == self.low):
            bound = f"greater than {self.low:g}" if self.low_open else f"at least {self.low:g}"
            return f"must be {bound}, got {value!r}"
        if value > self.high:
            return f"must be at most {self.high:g}, got {value!r}"
        return None


def _count(high: float, low: float = 1) -> Rule:
    return Rule(True, low, high)


CONFIG_RULES: dict[str, Rule] = {
    **{k: _count(MAX_LAYERS) for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")},
    **{
        k: _count(MAX_WIDTH)
        for k in ("hidden_size", "d_model", "n_embd", "intermediate_size", "head_dim", "kv_lora_rank")
    },
    **{
        k: _count(MAX_WIDTH, 0)
        for k in (
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "qk_rope_head_dim",
            "q_lora_rank",
        )
    },
    **{k: _count(MAX_HEADS) for k in ("num_attention_heads", "n_head", "num_key_value_heads")},
    "vocab_size": _count(MAX_VOCAB),
    "max_position_embeddings": _count(MAX_CONTEXT),
    **{
        k: _count(MAX_EXPERTS, 0)
        for k in ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok")
    },
}

FLAG_RULES: dict[str, Rule] = {
    "gpu_memory_utilization": Rule(False, 0, 1, low_open=True),
    "mem_fraction_static": Rule(False, 0, 1, low_open=True),
    "max_model_len": _count(MAX_CONTEXT),
    "max_num_seqs": _count(MAX_SEQS),
    "max_num_batched_tokens": _count(MAX_TOKENS),
    "tensor_parallel_size": _count(MAX_GPUS),
    "pipeline_parallel_size": _count(MAX_GPUS),
    "block_size": _count(1 << 20),
    "kv_cache_memory_bytes": _count(MAX_BYTES),
    "num_gpu_blocks_override": _count(1 << 40),
    "chunked_prefill_size": _count(MAX_TOKENS, -1),  # SGLang: -1 turns chunking off
    "cuda_graph_max_bs": _count(MAX_SEQS),
    "max_batch_prefill_tokens": _count(MAX_TOKENS),
    "ctx_size": _count(MAX_CONTEXT, 0),  # llama.cpp: 0 = the model's own context
    "parallel": _count(MAX_SEQS),
    "n_ubatch": _count(MAX_TOKENS),
    "other_processes_bytes": _count(MAX_BYTES, 0),
    "mps_memory_limit_bytes": _count(MAX_BYTES, 0),
    "rope_scaling_factor": Rule(False, 1, 1 << 12),
    "max_lora_rank": _count(1 << 12),  # vLLM accepts up to 512; a typo in the thousands is still refused
    "max_loras": _count(1 << 10),
    "n_gpu_layers": _count(1 << 20, -1),  # llama.cpp -ngl: -1 = all, counts above the layers too
    "n_cpu_moe": _count(MAX_LAYERS, 0),
    "main_gpu": _count(MAX_GPUS, 0),
    "fit_ctx": _count(MAX_CONTEXT),
}


def check_config_numbers(config: dict[str, Any], name: str) -> None:
    """ConfigError naming the first numeric config field of the wrong type or out of range."""
    for key, rule in CONFIG_RULES.items():
        value = config.get(key)
        if value is None:
            continue
        why = rule.check(value)
        if why:
            raise ConfigError(f"{name}: config field {key!r} {why}")
    if config.get("chunked_prefill_size") == 0:
        raise ConfigError(f"{name}: config field 'chunked_prefill_size' must not be 0")
    check_config_flags(config, name)


# The true/false fields the capacity model reads. A string ("False") is truthy in Python: read
# as-is it would flip the answer (tied embeddings counted once), so only JSON booleans pass.
CONFIG_FLAGS = ("tie_word_embeddings", "attention_bias", "use_sliding_window", "multi_query")
QUANT_FLAGS = ("zero_point", "sym", "lm_head", "load_in_4bit", "load_in_8bit", "bnb_4bit_use_double_quant")


def check_config_flags(config: dict[str, Any], name: str) -> None:
    """ConfigError naming the first true/false config field that holds anything but a boolean."""
    quant = config.get("quantization_config")
    fields = [(k, config.get(k)) for k in CONFIG_FLAGS]
    if isinstance(quant, dict):
        fields += [(f"quantization_config.{k}", quant.get(k)) for k in QUANT_FLAGS]
    for key, value in fields:
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{name}: config field {key!r} must be true or false, got {value!r}")


FLAG_NAMES = {
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "other_processes_bytes": "--other-processes-gib",
    "mps_memory_limit_bytes": "--mps-memory-limit-gib",
    "n_ubatch": "--ubatch-size",
}


def check_settings(settings: EngineSettings) -> EngineSettings:
    """The settings, or ConfigError naming the flag that is of the wrong type or out of range."""
    if settings.engine_version is not None and not parse_version(str(settings.engine_version)):
        raise ConfigError(
            f"--engine-version: not a release number, got {settings.engine_version!r} "
            "(examples: 0.8.5, 0.10.1.1, b4567 for llama.cpp)"
        )
    for key, rule in FLAG_RULES.items():
        value = getattr(settings, key)
        if value is None:
            continue
        why = rule.check(value)
        if why:
            raise ConfigError(f"{FLAG_NAMES.get(key, '--' + key.replace('_', '-'))}: {why}")
    dtype = getattr(settings, "dtype", None)
    if dtype not in (None, "auto"):
        from vramlab.capacity.spec import DTYPE_BYTES

        if str(dtype).replace("torch.", "").lower() not in {k.lower() for k in DTYPE_BYTES} | {
            "half",
            "float",
        }:
            raise ConfigError(
                f"--dtype: unknown dtype {dtype!r} (auto, bfloat16, float16/half, float32/float)"
            )
    if settings.max_model_len_auto and settings.engine != "vllm":
        raise ConfigError(f"--max-model-len auto: a vLLM setting, not {settings.engine}'s; give a length")
    if settings.disable_sliding_window and settings.engine != "vllm":
        raise ConfigError(
            f"--disable-sliding-window: a vLLM setting, not {settings.engine}'s; add --engine vllm"
        )
    if settings.num_gpu_blocks_override is not None and settings.engine != "vllm":
        raise ConfigError(
            f"--num-gpu-blocks-override: a vLLM setting, not {settings.engine}'s; add --engine vllm"
        )
    for mib in settings.fit_target_mib:
        why = _count(MAX_BYTES >> 20, 0).check(mib)
        if why:
            raise ConfigError(f"--fit-target: {why}")
    if settings.chunked_prefill_size == 0:
        raise ConfigError("--chunked-prefill-size: must be -1 (off) or positive, got 0")
    return settings


def check_version_range(low: str | None, high: str | None, what: str = "--versions") -> None:
    """A version range whose ends are release numbers, low <= high."""
    for end in (low, high):
        if end is not None and not parse_version(str(end)):
            raise ConfigError(f"{what}: not a release number, got {end!r}")
    if low and high and parse_version(str(low)) > parse_version(str(high)):
        raise ConfigError(f"{what}: the range is reversed ({low} > {high})")
