"""Activation peaks and runtime overheads, built from shapes and the calibratable constants.

vLLM measures its activation peak by running a dummy forward at the profile batch
(`max_num_batched_tokens`) and, in V1, a dummy sampler on `max_num_seqs` sequences. On
vLLM 0.19 the sampler dominates for most models: the torch peak increase tracks
max_num_seqs x vocab (Llama-3.1-8B 1.89 GiB, Gemma 3 3.9 GiB, TP-invariant), and the forward
pass shows through only for small vocabularies or on pipeline stages without the LM head.
"""

from __future__ import annotations

from vramlab.capacity.constants import Constants
from vramlab.capacity.spec import ModelSpec, dtype_bytes


def forward_peak_bytes(m: ModelSpec, tokens: int, tp: int, model_dtype: str, c: Constants) -> float:
    """Peak of one layer's temporaries for a batch of *tokens* (flash attention: no L^2 term)."""
    b = dtype_bytes(model_dtype)
    if m.is_moe and not m.intermediate_size:
        inter = m.shared_expert_intermediate_size or m.moe_intermediate_size
    elif m.is_moe and len(m.moe_layer_indices()) == m.num_layers:
        inter = m.shared_expert_intermediate_size or m.moe_intermediate_size
    else:
        inter = m.intermediate_size
    width = c["forward_intermediate_copies"] * inter / tp + c["forward_hidden_copies"] * m.hidden_size
    return tokens * width * b


def moe_workspace_bytes(m: ModelSpec, tokens: int, tp: int, model_dtype: str, c: Constants) -> float:
    """Fused-MoE intermediate caches: tokens x top-k x (gate_up + down + hidden)."""
    if not m.is_moe:
        return 0.0
    b = dtype_bytes(model_dtype)
    inter = m.moe_intermediate_size / tp
    topk = max(1, m.num_experts_per_tok)
    return c["moe_workspace_copies"] * tokens * topk * (3 * inter + m.hidden_size) * b


def sampler_peak_bytes(
    m: ModelSpec, num_seqs: int, c: Constants, key: str = "sampler_bytes_per_seq_vocab"
) -> float:
    """The dummy sampler's fp32 logits and temporaries over the full (all-gathered) vocabulary."""
    return num_seqs * m.vocab_size * c[key]


def cuda_graph_bytes(m: ModelSpec, num_layers_local: int, num_capture_sizes: int, c: Constants) -> float:
    """vLLM CUDA-graph pool: a base plus a per-layer cost, scaled by how many sizes are captured."""
    sizes_factor = min(1.0, max(0.1, num_capture_sizes / 67))
    return c["cuda_graph_base_bytes"] + c["cuda_graph_per_layer_bytes"] * num_layers_local * sizes_factor


def vllm_capture_sizes(max_num_seqs: int) -> int:
    """How many batch sizes vLLM captures: 1, 2, 4, then steps of 8 up to min(max_num_seqs, 512)."""
    top = min(max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    return max(1, len(sizes))
