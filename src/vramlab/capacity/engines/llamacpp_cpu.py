"""llama.cpp on the CPU (`--gpu cpu`, or no GPU layers): every buffer in host memory.

The same assignment rules as on a card (engines/llamacpp_placement.py) with no layer offloaded: the host
holds the model buffer (every tensor, the token embedding included: llama.cpp prints it as one
`CPU_Mapped model buffer`, or `CPU model buffer` with --no-mmap), the KV buffer of every layer and the CPU
compute buffer. No CUDA context: the process's own runtime (llama-cpp-python's Python interpreter, or
llama-server's threads and HTTP server) is a term of its own. Checked against llama-cpp-python 0.3.36's
CPU build here (its log's buffer lines; its resident set for the runtime term).
"""

from __future__ import annotations

from typing import Any

from vramlab.capacity.engines import llamacpp as cpp
from vramlab.capacity.engines.common import Context, PolicyResult
from vramlab.capacity.estimate import FORMULA, Component, Limits, band
from vramlab.errors import ConfigError
from vramlab.units import gib


def _host_weights(ctx: Context, model_bytes: int) -> Component:
    """The host model buffer: the whole file's tensors (the token embedding included)."""
    full = ctx.weights_component()
    rel_low = (full.bytes - full.low_bytes) / full.bytes if full.bytes else 0.0
    rel_high = (full.high_bytes - full.bytes) / full.bytes if full.bytes else 0.0
    return band(
        "weights",
        model_bytes,
        rel_low,
        rel_high,
        full.provenance,
        "host model buffer: every tensor, the token embedding included (llama.cpp's CPU_Mapped / CPU buffer)",
    )


def plan(ctx: Context) -> PolicyResult:
    settings = ctx.settings
    if settings.n_gpu_layers not in (None, 0):
        raise ConfigError(
            f"--n-gpu-layers {settings.n_gpu_layers}: the host has no GPU to offload to; plan a card with --gpu "
            "NAME, or leave -ngl at 0 for llama.cpp's CPU build"
        )
    if settings.devices:
        raise ConfigError("--gpu cpu plans the host alone: name no other card")
    ctx = Context(ctx.model, ctx.gpu, settings.with_(n_gpu_layers=0), ctx.constants)
    server = cpp.resolve_server(ctx)
    kv_size = cpp.kv_cells(ctx, server)
    host = cpp.layout(ctx, server, kv_size).host
    # the CPU backend's compute buffer is the largest graph phase alone: llama-cpp-python 0.3.36 prints 0.81 MiB
    # for the phases' 852,992 B (n_ubatch 64, tiny model); the scratch term was read off CUDA buffers
    scratch_key = "llamacpp_compute_scratch_bytes"
    compute = host.compute_bytes
    rel = ctx.constants.band(scratch_key)
    comps: list[Component] = [
        ctx.constant_component(
            "runtime",
            "llamacpp_cpu_runtime_bytes",
            "the server process's own runtime (interpreter, threads, HTTP server), host memory; no CUDA context",
        ),
        _host_weights(ctx, host.model_bytes),
        band(
            "activation_peak",
            compute,
            rel,
            rel,
            ctx.constants.provenance(scratch_key),
            f"CPU compute buffer for n_ubatch {server.n_ubatch}: the largest graph phase",
        ),
    ]
    return _result(ctx, server, kv_size, comps, host, compute)


def _result(
    ctx: Context, server: cpp.ServerSetup, kv_size: int, comps: list[Component], host: Any, compute: int
) -> PolicyResult:
    kv_bytes = host.kv_bytes
    used = sum(c.bytes for c in comps) + kv_bytes
    reasons = []
    if used > ctx.total - ctx.other:
        reasons.append(
            f"llama.cpp would hold {gib(used, unit=True)} of host memory with "
            f"{gib(ctx.total - ctx.other, unit=True)} free; lower --ctx-size"
        )
    return PolicyResult(
        components=comps,
        budget_bytes=ctx.total - ctx.other,
        kv_rule=lambda components, point: kv_bytes,
        limits=lambda kv: Limits(kv, server.n_ctx, server.n_ctx, float(server.slots)),
        max_model_len=server.per_slot_context,
        block_size=cpp.KV_PAD,
        kv_bytes_per_token=int(kv_bytes / kv_size) if kv_size else 0,
        settings={
            "device": "cpu",
            "server": server.server,
            "ctx_size": server.n_ctx,
            "parallel": server.slots,
            "kv_unified": server.unified,
            "cache_type_k": server.type_k,
            "cache_type_v": server.type_v,
            "n_ubatch": server.n_ubatch,
            "flash_attn": server.flash_attn,
            "kv_size_padded": kv_size,
            "n_gpu_layers": 0,
            "quantization": ctx.quant.gguf_type or ctx.quant.method if ctx.quant else None,
        },
        kv_provenance=FORMULA,
        kv_note=f"{kv_size} cells ({server.n_ctx} padded to {cpp.KV_PAD}) x layers x (K in {server.type_k} + "
        f"V in {server.type_v}), in host memory",
        kv_fixed=True,
        per_sequence_state_bytes=ctx.state_bytes_per_seq(),
        reasons=reasons,
        notes=list(server.notes)
        + ["llama.cpp's CPU build: every layer, the output layer and the KV cache in host memory"],
        extra={
            "host": {
                "model_buffer_bytes": host.model_bytes,
                "mapped": ctx.settings.mmap,
                "mapped_buffer_bytes": host.mapped_bytes,
                "kv_buffer_bytes": kv_bytes,
                "compute_buffer_bytes": compute,
                "layers": len(host.layers),
                "output_layer": host.has_output,
            }
        },
    )
