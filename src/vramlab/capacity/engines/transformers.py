"""Hugging Face transformers `generate()`: no pool; the dynamic cache grows with batch x length.

Memory = weights + batch x length x KV bytes per token + the prefill activation peak (hidden
states for every prompt token, and fp32 logits of the last position from 4.45 on, every
position before) + the CUDA context.
"""

from __future__ import annotations

from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import FORMULA, GIB, Component, Limits, band
from vramlab.capacity.spec import dtype_bytes
from vramlab.errors import ConfigError

LOGITS_TO_KEEP_FROM = (4, 45)


def plan(ctx: Context) -> PolicyResult:
    m, s, c = ctx.model, ctx.settings, ctx.constants
    length = s.max_model_len or ctx.model_max_len
    if not length:
        raise ConfigError(f"the context length of {m.name} is unknown: pass --max-model-len")
    batch = s.max_num_seqs or 1
    per_tok = ctx.kv_bytes_per_token()
    state = ctx.state_bytes_per_seq()
    b = dtype_bytes(ctx.dtype)
    comps: list[Component] = [
        ctx.constant_component("cuda_context", "cuda_context_bytes", "CUDA context and cuBLAS"),
        ctx.weights_component(),
    ]

    def act_for(bsz: int, tokens: int) -> float:
        hidden = c["hf_activation_hidden_copies"] * bsz * tokens * m.hidden_size * b
        inter = 2 * bsz * tokens * m.intermediate_size / ctx.tp * b
        last_only = not ctx.version or ctx.version >= LOGITS_TO_KEEP_FROM
        logits = 4 * 2 * bsz * (1 if last_only else tokens) * m.vocab_size
        return hidden + inter + logits

    act = act_for(batch, length)
    comps.append(band("activation_peak", act, c.band("hf_activation_hidden_copies"),
                      c.band("hf_activation_hidden_copies"), c.provenance("hf_activation_hidden_copies"),
                      f"prefill of {batch} x {length} tokens (SDPA, no L^2 term)"))
    kv_bytes = batch * (length * per_tok + state)
    total, other = ctx.total, ctx.other
    fixed = sum(cp.bytes for cp in comps[:2])
    per_seq = length * per_tok + state + act_for(1, length)

    def kv_rule(components: list[Component], point: str) -> int:
        return kv_bytes

    def limits(kv: int) -> Limits:
        conc = max(0.0, (total - other - fixed) / per_seq) if per_seq else 0.0
        return Limits(kv, batch * length, batch, conc)

    used = fixed + act + kv_bytes
    reasons = []
    if used > total - other:
        reasons.append(f"batch {batch} x {length} tokens needs {used / GIB:.2f} GiB; the card has "
                       f"{(total - other) / GIB:.2f} GiB (torch.OutOfMemoryError)")
    return PolicyResult(
        components=comps, budget_bytes=total - other, kv_rule=kv_rule, limits=limits, max_model_len=length,
        block_size=1, kv_bytes_per_token=per_tok,
        settings={"batch_size": batch, "max_length": length, "dtype": ctx.dtype, "cache": "DynamicCache"},
        kv_provenance=FORMULA, kv_note=f"dynamic cache: {batch} x {length} tokens x {per_tok} B",
        kv_fixed=True, per_sequence_state_bytes=state, reasons=reasons,
        notes=["transformers keeps no pool: memory grows with every token generated"],
    )
