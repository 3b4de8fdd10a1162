"""Quantization names vramlab knows: llama.cpp's GGUF file types with their average bits per weight, and the
load-time methods the GPU servers accept (`--quantization`), with the check that refuses an unknown name."""

from __future__ import annotations

from vramlab.capacity.spec import QuantSpec

# Average bits per weight of llama.cpp's file types (mixes keep some tensors at higher precision).
GGUF_BPW = {
    "f32": 32.0,
    "f16": 16.0,
    "bf16": 16.0,
    "q8_0": 8.5,
    "q6_k": 6.5625,
    "q5_k_m": 5.69,
    "q5_k_s": 5.54,
    "q5_0": 5.5,
    "q5_1": 6.0,
    "q5_k": 5.5,
    "q4_k": 4.5,
    "q3_k": 3.4375,
    "q4_k_m": 4.85,
    "q4_k_s": 4.58,
    "q4_0": 4.5,
    "q4_1": 5.0,
    "iq4_xs": 4.25,
    "iq4_nl": 4.5,
    "q3_k_l": 4.27,
    "q3_k_m": 3.91,
    "q3_k_s": 3.5,
    "iq3_xxs": 3.06,
    "iq3_m": 3.66,
    "q2_k": 3.35,
    "iq2_xs": 2.31,
    "iq2_xxs": 2.06,
    "iq1_s": 1.56,
    "mxfp4": 4.25,
}


def gguf_quant(name: str) -> QuantSpec | None:
    """A llama.cpp file type (Q4_K_M, q8_0, ...) as storage: every matrix, embeddings and output included."""
    key = name.strip().lower().replace("-", "_")
    if key not in GGUF_BPW:
        return None
    return QuantSpec(
        "gguf",
        GGUF_BPW[key],
        quantize_lm_head=True,
        quantize_embedding=True,
        unquantized_dtype="float32",
        gguf_type=name.upper(),
    )


# The load-time methods effective_quant models (vLLM/SGLang --quantization, TGI --quantize, transformers' configs),
# with the aliases the engines accept; a GGUF file type is taken too (vLLM and SGLang load GGUF files).
LOAD_TIME_QUANTIZATIONS = frozenset(
    {
        "none",
        "auto",
        "fp8",
        "fbgemm_fp8",
        "ptpc_fp8",
        "awq",
        "awq_marlin",
        "gptq",
        "gptq_marlin",
        "marlin",
        "bitsandbytes",
        "bnb",
        "bnb-4bit",
        "bnb-8bit",
        "mxfp4",
        "int8",
        "w8a8",
        "int4",
        "w4a16",
        "compressed-tensors",
        "compressed-tensors-w8a8",
        "compressed-tensors-w4a16",
        "nvfp4",
        "modelopt",
        "modelopt_fp4",
        "gguf",
    }
)


def quantization_problem(engine: str, name: str | None, checkpoint_method: str | None) -> str | None:
    """Why *name* is not a quantization this engine takes (None when it is): llama.cpp and Ollama take GGUF file
    types; the others their load-time methods, a GGUF type, or the checkpoint's own method. An unknown name was
    once planned as 8-bit without a word."""
    if name is None or name.strip().lower() in ("", "none", "auto"):
        return None
    key = name.strip().lower().replace("-", "_")
    gguf = key in GGUF_BPW
    if engine in ("llama.cpp", "ollama"):
        known = sorted(GGUF_BPW)
        if gguf:
            return None
        what = "a GGUF file type"
    else:
        known = sorted(LOAD_TIME_QUANTIZATIONS)
        own = (checkpoint_method or "").lower()
        if (
            gguf
            or name.strip().lower() in LOAD_TIME_QUANTIZATIONS
            or (own and key.startswith(own.split("-")[0]))
        ):
            return None
        what = "a quantization method"
    from vramlab.errors import near_matches

    hint = near_matches(key, known)
    return (
        f"--quantization {name!r}: not {what} vramlab knows for {engine}"
        + (
            f"; did you mean {', '.join(h.upper() if engine in ('llama.cpp', 'ollama') else h for h in hint)}?"
            if hint
            else ""
        )
        + f" (known: {', '.join(k.upper() if engine in ('llama.cpp', 'ollama') else k for k in known[:12])}, ...)"
    )
