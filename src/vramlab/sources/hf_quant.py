"""A checkpoint's quantization config (config.json `quantization_config`, or ModelOpt's hf_quant_config.json
read beside it) as the `QuantSpec` the weights are sized from, with the fields each method's vLLM loader reads."""

from __future__ import annotations

from typing import Any

from vramlab.capacity.spec import QuantSpec


def quant_spec(c: dict[str, Any], torch_dtype: str) -> QuantSpec | None:
    """The checkpoint's `quantization_config` (AWQ, GPTQ, FP8 with or without blocks, MXFP4, bitsandbytes,
    compressed-tensors, ModelOpt FP8 / NVFP4) as a `QuantSpec`; None for an unquantized checkpoint."""
    q = c.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    unq = torch_dtype if torch_dtype in ("bfloat16", "float16") else "bfloat16"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "autoround"):
        g = q.get("group_size", 128)
        return QuantSpec(
            method="gptq" if "gptq" in method or "round" in method else "awq",
            bits=float(q.get("bits") or q.get("w_bit") or 4),
            group_size=None if g in (None, -1) else int(g),
            has_zeros=bool(q.get("zero_point", not q.get("sym", False)))
            if "awq" in method
            else not q.get("sym", True),
            has_g_idx="gptq" in method or "round" in method,
            quantize_lm_head=bool(q.get("lm_head", False)),
            unquantized_dtype="float16",
        )
    if method == "fp8":
        # Block-quantized checkpoints (`weight_block_size` [128, 128]: DeepSeek-V3, Kimi-K2) keep one fp32
        # `weight_scale_inv` per block (vllm/model_executor/layers/quantization/fp8.py `Fp8LinearMethod`).
        block = q.get("weight_block_size")
        per_scale = int(block[0]) * int(block[1]) if isinstance(block, list) and len(block) == 2 else None
        return QuantSpec("fp8", 8.0, group_size=per_scale, unquantized_dtype=unq)
    if method == "mxfp4":
        return QuantSpec("mxfp4", 4.25, quantize_experts_only=True, unquantized_dtype=unq)
    if method == "bitsandbytes":
        bits = 4.0 if q.get("load_in_4bit", True) and not q.get("load_in_8bit") else 8.0
        skip = q.get("llm_int8_skip_modules") or ()
        # vLLM BitsAndBytesConfig.from_config: use_double_quant defaults to False, skip list to [].
        return QuantSpec(
            "bitsandbytes",
            bits,
            group_size=64 if bits == 4 else None,
            unquantized_dtype=unq,
            skip_modules=tuple(str(x) for x in skip) if isinstance(skip, (list, tuple)) else (),
            double_quant=bool(q.get("bnb_4bit_use_double_quant", False)),
        )
    if method == "compressed-tensors":
        return _compressed_tensors(q, unq)
    producer = q.get("producer")
    if (
        method.startswith("modelopt")
        or method == "nvfp4"
        or (not method and isinstance(producer, dict) and producer.get("name") == "modelopt")
    ):
        return _modelopt(q, method, unq)
    if method:
        width = q.get("bits")
        return QuantSpec(method, float(width) if width else 8.0, unquantized_dtype=unq)
    return None


def _modelopt(q: dict[str, Any], method: str, unq: str) -> QuantSpec:
    """A ModelOpt checkpoint as vLLM reads it (vllm/model_executor/layers/quantization/modelopt.py
    `ModelOptQuantConfigBase.from_config`): hf_quant_config.json nests `quant_algo`, `group_size` and
    `exclude_modules` under "quantization"; a config.json `quantization_config` keeps them flat, the
    exclusions as `ignore`. vLLM takes the method from `producer.name == "modelopt"` when
    `quant_method` is absent. NVFP4 stores 4-bit weights with an fp8 scale per `group_size` (16) inputs."""
    nested = q.get("quantization")
    src = nested if isinstance(nested, dict) else q
    algo = str(src.get("quant_algo") or "").upper()
    excl = (
        src.get("exclude_modules") if isinstance(nested, dict) else q.get("ignore", q.get("exclude_modules"))
    )
    skip = tuple(str(x) for x in excl) if isinstance(excl, list) else ()
    if "FP4" in algo or (not algo and method != "modelopt"):
        group = src.get("group_size")
        for grp in (q.get("config_groups") or {}).values() if group is None else ():
            group = ((grp or {}).get("weights") or {}).get("group_size")
            break
        return QuantSpec(
            "nvfp4",
            4.0,
            group_size=int(group or 16),
            has_zeros=False,
            unquantized_dtype=unq,
            skip_modules=skip,
        )
    return QuantSpec("fp8", 8.0, unquantized_dtype=unq, skip_modules=skip)


def _compressed_tensors(q: dict[str, Any], unq: str) -> QuantSpec:
    """compressed-tensors: read the weight scheme of the first config group."""
    bits: float = 8.0
    group: int | None = None
    method = "compressed-tensors"
    groups = q.get("config_groups") or {}
    for grp in groups.values():
        w = (grp or {}).get("weights") or {}
        bits = float(w.get("num_bits", 8))
        if w.get("type") == "float" and bits == 8:
            method = "compressed-tensors-fp8"
        elif bits == 4 and w.get("type") == "float":
            method = "compressed-tensors-nvfp4"  # fp8 scale per 16 inputs (strategy "tensor_group")
            group = int(w.get("group_size") or 16)
        if w.get("strategy") == "group" and method != "compressed-tensors-nvfp4":
            group = int(w.get("group_size") or 128)
        break
    return QuantSpec(method, bits, group_size=group, has_zeros=False, unquantized_dtype=unq)


__all__ = ["quant_spec"]
