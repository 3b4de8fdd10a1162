"""config.json shapes no engine would load, refused in one line instead of planned as something they
are not: grouped-query heads that do not divide, an MLP width left out where no default is the
family's own, a quantization_config vLLM's loaders would reject."""

from __future__ import annotations

from typing import Any

from vramlab.errors import ConfigError

# Families whose config leaves the MLP width out meaning 4 x hidden (transformers: GPT2Config n_inner,
# GPTJConfig n_inner, GPTNeoConfig intermediate_size, FalconConfig ffn_hidden_size, CodeGen's n_inner;
# BLOOM has no field): only these get the default.
_FOUR_X_MLP = frozenset(("gpt2", "gpt_bigcode", "gptj", "gpt_neo", "codegen", "falcon", "bloom"))


def check_heads(name: str, heads: int, kv: int) -> None:
    """Grouped-query attention shares each KV head among a whole number of query heads: vLLM's
    Attention layer asserts num_heads % num_kv_heads == 0 (its test_num_heads_not_divisble_by_num_kv_heads),
    and transformers' repeat_kv cannot split 32 query heads over 7 KV heads."""
    if kv > 0 and heads > 0 and (kv > heads or heads % kv):
        raise ConfigError(
            f"{name}: num_key_value_heads ({kv}) must divide num_attention_heads ({heads}): each KV head "
            "serves a whole group of query heads (vLLM's attention layer refuses it)"
        )


def mlp_width(c: dict[str, Any], name: str, model_type: str, hidden: int) -> int:
    """The MLP's intermediate size: the config's, or 4 x hidden for the families that mean that by
    leaving it out; ConfigError for any other config without one (it would be a guess)."""
    given = next(
        (
            c[k]
            for k in ("intermediate_size_mlp", "intermediate_size", "ffn_hidden_size", "n_inner")
            if c.get(k) is not None
        ),
        None,
    )
    if given is None and model_type not in _FOUR_X_MLP and not c.get("moe_intermediate_size"):
        raise ConfigError(
            f"{name}: config is missing 'intermediate_size' (the MLP's width, needed for the weights); "
            f"a {model_type or 'model'} config has no default vramlab could assume"
        )
    return int(given if given is not None else 4 * hidden)


_GPTQ_LIKE = ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "autoround")
# Every quant_method vLLM registers (vllm/model_executor/layers/quantization/__init__.py,
# QUANTIZATION_METHODS, 0.6-0.11), with the weight width of those whose width is the method's own.
_FIXED_BITS = {
    "fp8": 8.0,
    "fbgemm_fp8": 8.0,
    "ptpc_fp8": 8.0,
    "experts_int8": 8.0,
    "tpu_int8": 8.0,
    "marlin": 4.0,
    "gptq_marlin_24": 4.0,
    "qqq": 4.0,
    "mxfp4": 4.25,
    "nvfp4": 4.5,
    "modelopt_fp4": 4.5,
}
_KNOWN = frozenset(
    (
        *_GPTQ_LIKE,
        *_FIXED_BITS,
        "bitsandbytes",
        "compressed-tensors",
        "modelopt",
        "deepspeedfp",
        "bitblas",
        "gptq_bitblas",
        "gguf",
        "hqq",
        "ipex",
        "quark",
        "moe_wna16",
        "torchao",
        "rtn",
        "inc",
        "neuron_quant",
        "petit_nvfp4",
    )
)


def check_quant_config(c: dict[str, Any], name: str) -> None:
    """ConfigError for a `quantization_config` no engine would load, instead of planning it as
    something it is not: not an object, no quant_method, a method vLLM does not know, or a
    GPTQ/AWQ config without its width or group size (vLLM's GPTQConfig/AWQConfig.from_config read
    `bits`/`w_bit` and `group_size`/`q_group_size` with get_from_keys: absent, the load fails)."""
    if "quantization_config" not in c or c["quantization_config"] is None:
        return
    q = c["quantization_config"]
    where = f"{name}: config field 'quantization_config'"
    if not isinstance(q, dict):
        raise ConfigError(f"{where} must be an object, got {q!r:.40}")
    method = q.get("quant_method")
    producer = q.get("producer")
    if method is None and isinstance(producer, dict) and producer.get("name") == "modelopt":
        return
    if not isinstance(method, str) or not method:
        raise ConfigError(f"{where} has no quant_method (awq, gptq, fp8, bitsandbytes, ...)")
    m = method.lower()
    if m not in _KNOWN and not m.startswith("modelopt"):
        raise ConfigError(
            f"{where}: quant_method {method!r} is not one vLLM knows; vramlab will not guess its width"
        )
    if m in _GPTQ_LIKE:
        bits = q.get("bits", q.get("w_bit"))
        allowed = (4,) if m.startswith("awq") else (2, 3, 4, 8)
        if isinstance(bits, bool) or bits not in allowed:
            raise ConfigError(f"{where}: {m} needs 'bits' of {' or '.join(map(str, allowed))}, got {bits!r}")
        group = q.get("group_size", q.get("q_group_size"))
        if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group > 0):
            raise ConfigError(
                f"{where}: {m} needs 'group_size' (-1 or a positive whole number), got {group!r}"
            )
    elif (
        m not in _FIXED_BITS
        and m not in ("bitsandbytes", "compressed-tensors")
        and not m.startswith("modelopt")
    ):
        bits = q.get("bits")
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 1 <= bits <= 16:
            raise ConfigError(
                f"{where}: quant_method {method!r} gives no 'bits' (1-16); vramlab will not guess its width"
            )
