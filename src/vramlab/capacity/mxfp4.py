"""How MXFP4 experts are stored: padded rows per MoE backend in vLLM, unpadded ggml blocks in a GGUF file."""

from __future__ import annotations

import math

from vramlab.capacity.spec import ModelSpec


def _pad(x: float, to: int) -> float:
    return math.ceil(x / to) * to


# vLLM's Mxfp4MoEMethod.create_weights (vllm/model_executor/layers/quantization/mxfp4.py, 0.10.1 on) pads each rank's
# expert width and the hidden size for the MoE backend that will run them, (width, hidden) multiples: Marlin ("n % 256
# == 0 and k % 128 == 0": CUDA cards below Blackwell, and Hopper unless the triton_kernels package is importable with
# torch >= 2.8) 128 and 256; FlashInfer on SM100 256 and 256; the Triton kernels 64 and none. A GGUF file (llama.cpp,
# Ollama) stores MXFP4 as ggml's `block_mxfp4` (ggml/src/ggml-common.h: one E8M0 byte and 16 bytes of 4-bit values per
# 32 weights, `static_assert(sizeof(block_mxfp4) == sizeof(uint8_t) + QK_MXFP4/2)`): 4.25 bits, rows unpadded.
MXFP4_PADS = {"marlin": (128, 256), "flashinfer": (256, 256), "triton": (64, 1), "gguf": (1, 1)}


def mxfp4_padding(m: ModelSpec, tp: int, layout: str = "flashinfer") -> float:
    """The stored experts grow by the padded over the real (hidden x width) of one rank (gpt-oss at TP 1:
    2880 x 2880 -> 3072 x 2944 under Marlin, 3072 x 3072 under FlashInfer, unpadded under Triton)."""
    if not m.moe_intermediate_size:
        return 1.0
    width_pad, hidden_pad = MXFP4_PADS[layout]
    inter = m.moe_intermediate_size / tp
    return (_pad(m.hidden_size, hidden_pad) * _pad(inter, width_pad)) / (m.hidden_size * inter)
