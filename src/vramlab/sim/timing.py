"""Step time from a roofline of the chosen GPU.

A step costs the larger of its compute time and its memory time. Prefill is compute-bound:
about 2 x parameters FLOPs per token at ~50 % of the card's dense bf16 peak. Decode is
memory-bound: every step reads all the weights once plus the KV of every running sequence, at
~75 % of the card's bandwidth. A fixed per-step overhead stands for the scheduler and kernel
launches (a few ms in vLLM without CUDA graphs, well under 1 ms with them).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_MFU = 0.5  # vLLM/SGLang prefill on H100 reaches 40-60 % of dense peak
DECODE_BANDWIDTH_FRACTION = 0.75  # decode kernels reach 70-80 % of HBM bandwidth
STEP_OVERHEAD_S = 0.0008


@dataclass(frozen=True)
class Roofline:
    params: float  # parameters per GPU (after TP split)
    weights_bytes: int  # per GPU
    kv_bytes_per_token: int  # per GPU
    bf16_tflops: float
    bandwidth_gbps: float

    def step_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Seconds for one engine step.

        prefill_tokens: prompt tokens computed in this step; decode_seqs: sequences producing one
        token; context_tokens: KV tokens attended over (all running sequences' lengths).
        """
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        flops = 2.0 * self.params * (prefill_tokens + decode_seqs)
        compute_s = flops / (self.bf16_tflops * 1e12 * PREFILL_MFU)
        bytes_read = self.weights_bytes + context_tokens * self.kv_bytes_per_token
        memory_s = bytes_read / (self.bandwidth_gbps * 1e9 * DECODE_BANDWIDTH_FRACTION)
        return max(compute_s, memory_s) + STEP_OVERHEAD_S


def load_s(weights_bytes: int, load_gbps: float = 2.0) -> float:
    """Weight loading time: safetensors from a local NVMe page cache reach ~1-3 GB/s per GPU."""
    return weights_bytes / (load_gbps * 1e9)
