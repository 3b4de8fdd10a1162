"""The capacity model's free constants: a default, a band, and where the default comes from.

Everything the model cannot derive from shapes is one of these. `vramlab calibrate` fits them
per engine (and version range) and writes a profile; `Constants.with_overrides` applies it, and
the components that used a fitted value say "calibrated".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramlab.units import GIB

MIB = 1 << 20


@dataclass(frozen=True)
class Constant:
    value: float
    rel_band: float  # +/- relative uncertainty of the default
    source: str
    calibrated: bool = False
    # Why `vramlab calibrate` does not fit it (no log prints the quantity it drives); None = fittable.
    fixed: str | None = None


_DEFAULTS: dict[str, Constant] = {
    # vLLM V1 profiles the sampler on max_num_seqs dummy sequences: fp32 logits and a few
    # same-sized temporaries (probs, logprobs, sort buffers) over the whole vocabulary.
    # Fitted on vLLM 0.19 H100 rows where the sampler dominates (Llama/Qwen/Gemma): 14.8-16.6.
    "sampler_bytes_per_seq_vocab": Constant(
        15.6, 0.08, "vLLM 0.19 torch peak increase vs max_num_seqs x vocab"
    ),
    # The sorting top-k/top-p path (`apply_top_k_top_p`: fp32 logits, sorted values + int64 indices,
    # softmax, cumsum, scatter): V0, V1 without FlashInfer before 0.17: 38.6-41 B per sequence per
    # vocab entry on every V0 row (Unsloth notebooks, 0.7-0.9), on 0.15/0.16 (llm-d version sweep)
    # and on V1 0.10.2 (r109's printed 1.40 GiB peak activation = 256 x 151936 x 38.6 B).
    "legacy_sampler_bytes_per_seq_vocab": Constant(
        39.0, 0.10, "vLLM V0 0.7-0.9, V1 0.10.2 and 0.15-0.16 activation peaks"
    ),
    # FlashInfer's top_k_top_p_sampling_from_logits (no sort): the vLLM 0.10.1.1 rows whose logs print
    # "Using FlashInfer for top-p & top-k sampling" (dennislee22 A100 pods), spread wide.
    "flashinfer_sampler_bytes_per_seq_vocab": Constant(
        15.0, 0.6, "vLLM V1 0.10.1 rows logging the FlashInfer sampler: 8-17 B"
    ),
    # Forward pass of one dense layer at the profile batch: ~2 copies of the gated MLP
    # intermediate and ~8 hidden-sized tensors (residual, norms, qkv, attention out), bf16.
    "forward_intermediate_copies": Constant(2.0, 0.25, "vLLM 0.19 PP rank-0 / small-vocab activation peaks"),
    "forward_hidden_copies": Constant(8.0, 0.25, "vLLM 0.19 PP rank-0 / small-vocab activation peaks"),
    # Fused-MoE workspace: tokens x top-k x (gate_up + down + hidden) elements, kept alongside
    # the sampler peak in V1.
    "moe_workspace_copies": Constant(
        1.0, 0.30, "vLLM 0.19 MoE rows (Qwen3-30B-A3B, DeepSeek-V2-Lite, Mixtral)"
    ),
    # Non-torch memory that grows during the profile run (cuBLAS workspaces, Triton), TP=1.
    "non_torch_forward_bytes": Constant(
        0.25 * GIB, 0.5, "vLLM 0.19 'non-torch forward increase' at TP=1: 0.24-0.46 GiB"
    ),
    # ... with TP>1 on NVLink-SHARP systems (H100/H200/B200 SXM): NCCL NVLS buffers allocated
    # at the first all-reduce.
    "non_torch_forward_tp_bytes": Constant(
        2.1 * GIB, 0.15, "vLLM 0.19 'non-torch forward increase' at TP>=2 on H100: 2.06-2.21 GiB"
    ),
    # ... with TP>1 elsewhere (A100, PCIe, Ada): ordinary NCCL ring buffers.
    "non_torch_forward_tp_nonvls_bytes": Constant(
        0.15 * GIB, 1.0, "vLLM 0.10 TP=2/4 A100 rows: remainder after the sampler 0.05-0.1 GiB"
    ),
    # ... with PP>1 and TP=1 (no custom all-reduce).
    "non_torch_forward_pp_bytes": Constant(0.07 * GIB, 1.0, "vLLM 0.19 PP=2/4 rows: 0.07 GiB"),
    # V0 era non-torch memory (CUDA context excluded, NCCL inside the window at TP>1).
    "v0_non_torch_bytes": Constant(
        0.06 * GIB, 1.0, "vLLM V0 log 'non_torch_memory takes' 0.03-0.09 GiB at TP=1"
    ),
    # V0 at TP>1: NCCL init and the custom all-reduce buffers fall inside the profiling window, so
    # the term follows the interconnect. PCIe / no NVSwitch: NCCL ring buffers and (TP=2 only,
    # vLLM disables custom all-reduce on more than two PCIe GPUs) 8 MiB IPC buffers.
    "v0_non_torch_tp_bytes": Constant(
        0.25 * GIB,
        0.6,
        "vLLM V0 'non_torch_memory takes' at TP 2-4 on PCIe cards: 0.20-0.30 GiB "
        "(vllm#13061 2x RTX 4090, vllm PR #14447 24 GiB cards)",
    ),
    # ... on NVSwitch nodes (SXM A100/H100): custom all-reduce at any TP with registered IPC
    # buffers, and NCCL's NVLink buffers.
    "v0_non_torch_tp_nvswitch_bytes": Constant(
        2.0 * GIB,
        0.3,
        "vLLM V0 'non_torch_memory takes' 2.10 GiB at TP 8 on A100-40GB "
        "SXM (p4d); H100 TP2 adds 1.79 GiB over TP1 (vllm PR #10511)",
    ),
    # CUDA context + cuBLAS handles before the engine measures anything.
    "cuda_context_bytes": Constant(
        0.51 * GIB, 0.3, "vLLM 0.19 worker init snapshot non_torch_memory=0.51GiB; PyTorch #107667"
    ),
    # NCCL communicators created at init for TP/PP > 1 (outside vLLM V1's budget).
    "nccl_init_bytes": Constant(
        1.2 * GIB, 0.4, "vLLM 0.19 init non-torch 1.43-2.05 GiB at TP/PP>1 less the 0.51 GiB context"
    ),
    # ... on PCIe cards (no NVSwitch): ring buffers only.
    "nccl_init_pcie_bytes": Constant(
        0.15 * GIB,
        0.5,
        "SGLang 'Init torch distributed ends. mem usage=0.13 GB' at TP4 on 4x L4 PCIe (EC2 g6.12xlarge)",
    ),
    # CUDA graphs (vLLM): a shared mempool; grows with layers and the number of captured sizes.
    "cuda_graph_base_bytes": Constant(
        0.35 * GIB, 0.5, "vLLM 0.19 'Graph capturing finished ... took' 0.49-1.61 GiB"
    ),
    "cuda_graph_per_layer_bytes": Constant(0.016 * GIB, 0.5, "same; fitted against num_layers"),
    # vLLM >= 0.21 estimates graph memory during profiling and reports a multiple of actual.
    "cuda_graph_estimate_ratio": Constant(
        1.0,
        0.6,
        "vLLM CUDA graph pool 'actual vs estimated' lines: 0.5x-2x",
        fixed="no development row of vLLM >= 0.21 prints the estimate",
    ),
    # SGLang decode graphs: ~2 MiB x max batch size in its own reservation heuristic.
    "sglang_graph_bytes_per_bs": Constant(
        2 * MIB, 0.6, "SGLang server_args reservation heuristic (PR #10975)"
    ),
    # TGI warm-up prefill peak per prefill token (logits + forward, bf16), per hidden unit.
    "tgi_prefill_bytes_per_token_hidden": Constant(16.0, 0.5, "TGI warmup peak, FlashCausalLM.warmup"),
    # llama.cpp compute buffer beyond its largest graph phase (engines/llamacpp_placement.py): the phases
    # alone give r095, r208 and r223's 150.00 / 300.75 / 1080.00 MiB to 0.1 % (1 MiB more, 0.1-0.7 %); r103 (flash attention, one
    # logit row) is 3.5 % over. The band covers graphs the phases were not read off.
    "llamacpp_compute_scratch_bytes": Constant(
        1 * MIB, 0.1, "llama.cpp 'compute buffer size' lines vs the graph phases"
    ),
    # CPU engines (host memory): the Python/torch runtime is a term of its own, read off the engines' resident sets
    # here (psutil RSS, process tree) with a tiny model, so weights and KV are a few MiB of it. vLLM 0.32.0's CPU
    # build: the worker 644 MiB (the automatic pool's budget charges it), the API server 616 MiB + the engine core
    # 593 MiB + a resource tracker 12 MiB; llama-cpp-python 0.3.36's server 74-76 MiB with a 1.5 MiB model.
    # No start-up log prints them: `vramlab calibrate RUN` fits them to a run's host readings of the processes
    # (analysis/host_runtime.py), one reading a window.
    "vllm_cpu_worker_runtime_bytes": Constant(
        630 * MIB, 0.3, "vLLM 0.32.0 CPU worker resident set, tiny model"
    ),
    "vllm_cpu_frontend_runtime_bytes": Constant(
        1220 * MIB, 0.3, "vLLM 0.32.0 CPU API server + engine core resident sets"
    ),
    "llamacpp_cpu_runtime_bytes": Constant(
        72 * MIB, 0.5, "llama-cpp-python 0.3.36 server resident set less its buffers"
    ),
    # transformers serve on the CPU: Python, torch, transformers and the HTTP server (0.73 GiB beyond the
    # parameters in a run of transformers 5.25's `transformers serve`)
    "transformers_cpu_runtime_bytes": Constant(
        0.73 * GIB, 0.4, "transformers serve 5.25 resident set beyond the parameters"
    ),
    # transformers: eager forward at prefill keeps several hidden-sized activations per token.
    "hf_activation_hidden_copies": Constant(
        12.0, 0.5, "transformers generate() peak beyond weights and cache"
    ),
}


@dataclass(frozen=True)
class Constants:
    values: dict[str, Constant]
    profile: str = "defaults"

    @classmethod
    def defaults(cls) -> Constants:
        return cls(dict(_DEFAULTS))

    def __getitem__(self, name: str) -> float:
        return self.values[name].value

    def get(self, name: str) -> Constant:
        return self.values[name]

    def provenance(self, *names: str) -> str:
        """'calibrated' if any of the constants behind a component was fitted, else 'default'."""
        return "calibrated" if any(self.values[n].calibrated for n in names) else "default"

    def band(self, *names: str) -> float:
        """Relative band of a component built from these constants (the widest one)."""
        return max(self.values[n].rel_band for n in names)

    def with_overrides(self, overrides: dict[str, tuple[float, float, str]], profile: str) -> Constants:
        """Apply fitted values: name -> (value, relative band, source)."""
        vals = dict(self.values)
        for name, (value, rel, source) in overrides.items():
            if name not in vals:
                raise KeyError(name)
            vals[name] = replace(vals[name], value=value, rel_band=rel, source=source, calibrated=True)
        return Constants(vals, profile)


def names() -> list[str]:
    return sorted(_DEFAULTS)


def fixed_names() -> list[str]:
    """Constants `vramlab calibrate` leaves alone, each with its reason in `Constant.fixed`."""
    return sorted(n for n, c in _DEFAULTS.items() if c.fixed)


# The observations a constant needs before `vramlab calibrate` fits it, from logs, measurement files and stored runs
# alike (--min-points changes it; check_min_points is its one check).
MIN_POINTS = 3


def check_min_points(min_points: int) -> int:
    from vramlab.errors import ConfigError

    # two: with one observation the leave-one-out error is the in-sample one, and one run cannot tell the fit from
    # that run's own noise
    if not 2 <= min_points <= 1_000_000:
        raise ConfigError(f"--min-points: must be at least 2, got {min_points}")
    return min_points
