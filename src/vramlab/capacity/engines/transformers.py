"""Hugging Face transformers (`generate()` / `transformers serve`): no pool; the dynamic cache
grows with batch x length.

Memory = weights + batch x length x KV bytes per token + the prefill activation peak (hidden
states for every prompt token, and fp32 logits of the last position from 4.45 on, every
position before) + the CUDA context; on the CPU (`--gpu cpu`) host memory, with the Python/torch
runtime (and the HTTP server) as its own term instead of a CUDA context.

- dtype: from 5.0 `from_pretrained` loads the checkpoint's own dtype by default (`dtype="auto"`);
  before, float32 unless `torch_dtype="auto"` was passed. An F32 checkpoint stays F32 on 5.x.
- `transformers serve` answers one request at a time unless `--continuous-batching` is on: max
  concurrency is 1 then, however many sequences the card could hold.
- A context above the model's `max_position_embeddings` (rope scaling included) is refused.
"""

from __future__ import annotations

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import FORMULA, Component, Limits, band
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError
from vramlab.units import gib

LOGITS_TO_KEEP_FROM = (4, 45)
CHECKPOINT_DTYPE_FROM = (5,)


def context_length(ctx: Context) -> int:
    length = ctx.settings.max_model_len or ctx.default_context
    if not length:
        raise ConfigError(f"the context length of {ctx.model.name} is unknown: pass --max-model-len")
    trained = ctx.model_max_len
    if trained and length > trained and not ctx.settings.rope_scaling_factor:
        raise ConfigError(
            f"transformers: max_length {length} exceeds the model's maximum context {trained} "
            f"(max_position_embeddings and rope scaling of {ctx.model.name}); extend it with a rope-scaling "
            "override (--rope-scaling-factor) or lower --max-model-len"
        )
    return length


def activation_bytes(ctx: Context, batch: int, tokens: int) -> float:
    """Prefill of *batch* x *tokens*: hidden-sized activations, the MLP intermediate, the logits."""
    m, constants = ctx.model, ctx.constants
    element = dtype_bytes(ctx.dtype)
    hidden = constants["hf_activation_hidden_copies"] * batch * tokens * m.hidden_size * element
    inter = 2 * batch * tokens * m.intermediate_size / ctx.tp * element
    last_only = not ctx.version or ctx.version >= LOGITS_TO_KEEP_FROM
    logits = 4 * 2 * batch * (1 if last_only else tokens) * m.vocab_size
    return hidden + inter + logits


def runtime_component(ctx: Context) -> Component:
    """The CUDA context on a card; on the host, the Python/torch runtime with the HTTP server instead."""
    if ctx.gpu.is_host:
        return ctx.constant_component(
            "runtime",
            "transformers_cpu_runtime_bytes",
            "Python, torch, transformers and the HTTP server (host memory; no CUDA context on the CPU)",
        )
    return ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and cuBLAS")


def plan(ctx: Context) -> PolicyResult:
    settings, constants = ctx.settings, ctx.constants
    length = context_length(ctx)
    serial = not settings.continuous_batching
    batch = settings.max_num_seqs or 1
    per_token = ctx.kv_bytes_per_token()
    state = ctx.state_bytes_per_seq()
    key = "hf_activation_hidden_copies"
    activation = activation_bytes(ctx, batch, length)
    comps: list[Component] = [
        runtime_component(ctx),
        ctx.weights_component(),
        band(
            "activation_peak",
            activation,
            constants.band(key),
            constants.band(key),
            constants.provenance(key),
            f"prefill of {batch} x {length} tokens (SDPA, no L^2 term)",
        ),
    ]
    kv_bytes = batch * (length * per_token + state)
    total, other = ctx.total, ctx.other
    fixed = sum(cp.bytes for cp in comps[:2])
    per_sequence = length * per_token + state + activation_bytes(ctx, 1, length)

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_bytes

    def limits(kv: int) -> Limits:
        fit = max(0.0, (total - other - fixed) / per_sequence) if per_sequence else 0.0
        return Limits(kv, batch * length, batch, min(fit, 1.0) if serial else fit)

    used = fixed + activation + kv_bytes
    reasons = []
    if used > total - other:
        reasons.append(
            f"batch {batch} x {length} tokens needs {gib(used, unit=True)}; the {_where(ctx)} has "
            f"{gib(total - other, unit=True)} ({'MemoryError' if ctx.gpu.is_host else 'torch.OutOfMemoryError'})"
        )
    notes = ["transformers keeps no pool: memory grows with every token generated"]
    if serial:
        notes.append(
            "transformers serve answers one request at a time without --continuous-batching: "
            "max concurrency is 1"
        )
    if ctx.version and ctx.version < CHECKPOINT_DTYPE_FROM and settings.dtype in ("auto", None):
        notes.append("transformers 4.x loads float32 unless torch_dtype='auto' is passed: planned in float32")
    return PolicyResult(
        components=comps,
        budget_bytes=total - other,
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=length,
        block_size=1,
        kv_bytes_per_token=per_token,
        settings={
            "batch_size": batch,
            "max_length": length,
            "dtype": ctx.dtype,
            "cache": "DynamicCache",
            "continuous_batching": settings.continuous_batching,
        },
        kv_provenance=FORMULA,
        kv_note=f"dynamic cache: {batch} x {length} tokens x {per_token} B",
        kv_fixed=True,
        per_sequence_state_bytes=state,
        reasons=reasons,
        notes=notes,
    )


def _where(ctx: Context) -> str:
    return "host" if ctx.gpu.is_host else "card"
