"""How the simulated engine dies, in each engine's own words: a CUDA out-of-memory at run time, an
injected crash; every request in flight fails with the engine's text, and the process exits after
the watchdog (vLLM's VLLM_WATCHDOG_TIME_S) with the engine's exit code."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING

from vramlab.sim import startup_log as L
from vramlab.sim.ledger import SimOutOfMemory
from vramlab.units import MIB

if TYPE_CHECKING:
    from vramlab.sim.engine import SimEngine


def fail_all(eng: SimEngine, message: str) -> None:
    assert eng.sched is not None
    for req in [*eng.sched.running, *eng.sched.waiting]:
        if eng.cfg.engine == "vllm":
            eng.log.error(f"Request {req.id} failed (engine dead).", "api")
        eng.stats.failures["generation"] += 1
        if req.sink is not None:
            req.sink.put_nowait(("error", message))
    eng.sched.running.clear()
    eng.sched.waiting.clear()


def die(eng: SimEngine, lines: list[str], exit_code: int) -> None:
    eng.dead = True
    eng.death_text = "\n".join(lines)
    for line in lines:
        eng.log.error(line, "core")
    fail_all(eng, lines[-1])
    asyncio.get_running_loop().call_later(eng.watchdog_s, partial(exit_, eng), exit_code)


def die_oom(eng: SimEngine, oom: SimOutOfMemory) -> None:
    total, _, free = eng.ledger.memory_info()
    text = L.torch_oom(oom.requested_bytes, total, free, eng._own_bytes)
    frames = [
        ("/usr/lib/python3/site-packages/vllm/v1/engine/core.py", 851, "run_busy_loop"),
        ("/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", 2311, "execute_model"),
        ("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
    ]
    kind = eng.cfg.engine
    if kind == "vllm":
        die(eng, ["EngineCore encountered a fatal error.", L.traceback_block(text, frames), L.ENGINE_DEAD], 1)
    elif kind == "sglang":
        die(
            eng,
            [
                f"Scheduler hit an exception: {L.traceback_block(text, frames[2:])}",
                "Received sigquit from a child process. It usually means the child failed.",
            ],
            1,
        )
    elif kind == "tgi":
        die(eng, [f"Shard 0 failed: {text}", "Shard 0 crashed"], 1)
    else:
        die(
            eng,
            [
                f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {oom.requested_bytes / MIB:.2f} MiB "
                "on device 0: cudaMalloc failed: out of memory",
                "CUDA error: out of memory",
            ],
            134,
        )


def die_crash(eng: SimEngine) -> None:
    text = "RuntimeError: CUDA error: an illegal memory access was encountered"
    codes = {
        "vllm": [text, L.ENGINE_DEAD],
        "sglang": [
            f"Scheduler hit an exception: {text}",
            "Received sigquit from a child process. It usually means the child failed.",
        ],
        "tgi": [f"Shard 0 failed: {text}", "Shard 0 crashed"],
        "llama.cpp": ["CUDA error: an illegal memory access was encountered"],
    }
    die(eng, codes[eng.cfg.engine], 134 if eng.cfg.engine == "llama.cpp" else 1)


def exit_(eng: SimEngine, code: int) -> None:
    if eng.cfg.engine == "vllm":
        eng.log.info("Shutting down FastAPI HTTP server.", "launcher")
    eng.release_all()
    eng.exit_code = code
    eng.exited.set()
