"""The simulated engine: start-up through the device ledger, then a continuous-batching loop.

Start-up follows each engine's order and accounting (docs/research/capacity-anchors.md §1-4), so
the failures come out of the same arithmetic: vLLM checks free memory against util x total,
loads weights, profiles, and sizes the KV pool from what it *saw* the card's usage grow by (so
a co-tenant loading at the same moment is charged to it, vllm #55827); SGLang and TGI size the
pool from the free memory left after loading (a co-tenant shrinks it); llama.cpp allocates a
fixed context and fails on the allocation. At run time each step's activation memory is taken
from the ledger when it outgrows what the caching allocator already holds, so a balloon that
took the headroom makes the next growth fail like cudaMalloc, and the engine dies.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable
from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.sim import startup_log as L
from vramlab.sim.config import SimConfig
from vramlab.sim.death import die_crash, die_oom
from vramlab.sim.faults import FaultState
from vramlab.sim.ledger import DeviceLedger, SimOutOfMemory
from vramlab.sim.metrics import EngineStats
from vramlab.sim.scheduler import Batch, Request, Scheduler, cdiv
from vramlab.sim.startup_log import EngineLog
from vramlab.sim.timing import Roofline, load_s
from vramlab.units import MIB, to_gib

PROCESS_NAMES = {
    "vllm": "VLLM::EngineCore",
    "sglang": "sglang::scheduler",
    "tgi": "text-generation-server",
    "llama.cpp": "llama-server",
}
ACTIVATION_ROUND_BYTES = 2 << 20  # the caching allocator rounds large blocks to 2 MiB


class StartupRefused(Exception):
    """The engine refused to start; the text is already in the log."""

    def __init__(self, text: str, exit_code: int = 1):
        super().__init__(text)
        self.exit_code = exit_code


class SimEngine:
    def __init__(self, cfg: SimConfig, est: Estimate, ledger: DeviceLedger, log: EngineLog):
        self.cfg, self.est, self.ledger, self.log = cfg, est, ledger, log
        self.version = cfg.version
        self.watchdog_s = cfg.watchdog_s
        self.stats = EngineStats()
        self.faults = FaultState()
        self.sched: Scheduler | None = None
        self.ready = False
        self.dead = False
        self.death_text = ""
        self.exit_code: int | None = None
        self.exited = asyncio.Event()
        self._wake = asyncio.Event()
        self._handles: list[int] = []
        self._activation_bytes = 0
        self._own_bytes = 0
        self._rng = random.Random(cfg.seed)
        self._name = PROCESS_NAMES[cfg.engine]
        settings = est.settings or {}
        self.util = float(settings.get("gpu_memory_utilization") or cfg.gpu_memory_utilization or 0.9)
        self.max_model_len = est.max_model_len or cfg.max_model_len or 4096
        self.max_num_seqs = int(settings.get("max_num_seqs") or cfg.max_num_seqs or 256)
        self.max_num_batched_tokens = int(
            settings.get("max_num_batched_tokens")
            or cfg.max_num_batched_tokens
            or max(8192, min(self.max_model_len, 16384))
        )
        from vramlab.capacity.gpus import get_gpu

        gpu = get_gpu(cfg.gpu)
        self.gpu_label = f"NVIDIA {gpu.name.upper()}"
        self.roofline = Roofline(
            params=est.weights_bytes / 2,
            weights_bytes=est.weights_bytes,
            kv_bytes_per_token=est.kv_bytes_per_token,
            bf16_tflops=gpu.bf16_tflops,
            bandwidth_gbps=gpu.bandwidth_gbps,
        )

    # --- memory through the ledger ------------------------------------------------------
    def _alloc(self, nbytes: int, kind: str) -> int:
        if self.faults.oom_next_allocation:
            self.faults.oom_next_allocation = False
            total, _, free = self.ledger.memory_info()
            raise SimOutOfMemory(nbytes, min(free, max(0, nbytes - 1)), total)
        h = self.ledger.allocate(nbytes, kind, self._name)
        self._handles.append(h)
        self._own_bytes += nbytes
        return h

    def _release(self, handle: int, nbytes: int) -> None:
        self.ledger.release(handle)
        self._handles.remove(handle)
        self._own_bytes -= nbytes

    def _alloc_context(self) -> None:
        """The CUDA context (and NCCL at TP > 1) exists before the engine measures anything."""
        comp = self.est.component("cuda_context")
        if comp is not None and comp.bytes:
            self._alloc(comp.bytes, "non_torch")

    def release_all(self) -> None:
        """What process exit does to GPU memory (needed in-process, where the pid lives on)."""
        for h in list(self._handles):
            self.ledger.release(h)
        self._handles.clear()
        self._own_bytes = 0

    async def _meet(self, stage: str) -> None:
        """Wait for the other sims started at once (--start-barrier); a no-op without one."""
        if not self.cfg.start_barrier:
            return
        from vramlab.sim.barrier import StartBarrier

        if not await StartBarrier.parse(self.cfg.start_barrier).wait(stage):
            self.log.warning(f"start barrier: not every peer reached {stage!r}; going on alone")

    async def _sleep_scaled(self, sim_s: float) -> None:
        await asyncio.sleep(sim_s / self.cfg.speed)

    # --- start-up -----------------------------------------------------------------------
    async def startup(self) -> None:
        """Allocate and size everything in the engine's order; raise StartupRefused on failure."""
        try:
            await {
                "vllm": self._start_vllm,
                "sglang": self._start_sglang,
                "tgi": self._start_tgi,
                "llama.cpp": self._start_llamacpp,
            }[self.cfg.engine]()
        except SimOutOfMemory as oom:
            self._refuse_oom(oom)
        self.ready = True

    def _refuse(self, final: str, exit_code: int = 1) -> None:
        if self.cfg.engine == "vllm":
            self.log.error("EngineCore failed to start.", "core")
            self.log.error(
                L.traceback_block(
                    final, [("/usr/lib/python3/site-packages/vllm/v1/engine/core.py", 699, "run_engine_core")]
                ),
                "core",
            )
            self.log.error(L.CORE_INIT_FAILED, "core")
        else:
            self.log.error(final)
        self.release_all()
        raise StartupRefused(final, exit_code)

    def _refuse_oom(self, oom: SimOutOfMemory) -> None:
        total, _, free = self.ledger.memory_info()
        if self.cfg.engine == "llama.cpp":
            self.log.error(
                f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {oom.requested_bytes / MIB:.2f} "
                "MiB on device 0: cudaMalloc failed: out of memory"
            )
            self._refuse("main: exiting due to model loading error")
        self._refuse(L.torch_oom(oom.requested_bytes, total, free, self._own_bytes))

    async def _load_weights(self) -> float:
        """Weights arrive in pieces over the load time, so a co-tenant sees them grow."""
        total = self.est.weights_bytes
        seconds = load_s(total, self.cfg.load_gbps)
        pieces = 8
        for i in range(pieces):
            part = total // pieces + (total % pieces if i == pieces - 1 else 0)
            self._alloc(part, "weights")
            await self._sleep_scaled(seconds / pieces)
        return seconds

    async def _profile(self) -> int:
        """Run the dummy forward: take the activation peak, free it; return memory we did not take."""
        _, used_before, _ = self.ledger.memory_info()
        if self.est.non_torch_bytes:
            self._alloc(self.est.non_torch_bytes, "non_torch")  # cuBLAS/NCCL workspaces: kept
        h = self._alloc(self.est.activation_peak_bytes, "activation")
        await self._sleep_scaled(0.5)
        _, used_peak, _ = self.ledger.memory_info()
        self._release(h, self.est.activation_peak_bytes)
        return max(0, used_peak - used_before - self.est.activation_peak_bytes - self.est.non_torch_bytes)

    def _make_scheduler(self, num_blocks: int) -> None:
        self.sched = Scheduler(
            num_blocks,
            self.est.block_size,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.max_model_len,
        )
        if self.cfg.prefix_caching_on:
            from vramlab.sim.prefix_cache import PrefixCache
            from vramlab.sim.tokenizer import token_text

            seed = self.cfg.seed
            self.sched.cache = PrefixCache()
            self.sched.generated_tokens = lambda req: [
                token_text(seed, req.key, i).strip() for i in range(req.generated)
            ]

    async def _start_vllm(self) -> None:
        v = self.version
        self.log.info(f"vLLM API server version {self.cfg.version_text}", "api")
        args = {
            "model": self.cfg.model,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.util,
            "max_num_seqs": self.max_num_seqs,
            "tensor_parallel_size": self.cfg.tensor_parallel_size,
        }
        self.log.info(f"non-default args: {args}", "utils.py:326")
        self._alloc_context()
        await self._meet("context")
        total, used_snapshot, free = self.ledger.memory_info()
        await self._meet("snapshot")  # started at once: every sim looked at the card before anyone loads
        if free < self.util * total:
            self._refuse(L.vllm_free_memory_error(v, free, total, self.util))
        own_at_snapshot = self._own_bytes
        seconds = await self._load_weights()
        self.log.info(L.vllm_loading(v, self.est.weights_bytes, seconds), "load")
        await self._profile()
        _, used_now, _ = self.ledger.memory_info()
        # V1 charges every byte the card gained since its snapshot to itself (vllm #55827).
        others_growth = max(0, (used_now - used_snapshot) - (self._own_bytes - own_at_snapshot))
        kv_bytes = self.est.kv_cache_bytes - others_growth
        if kv_bytes <= 0:
            self._refuse(L.vllm_no_cache_error())
        block_bytes = self.est.block_size * self.est.kv_bytes_per_token
        num_blocks = (
            self.est.num_blocks if others_growth == 0 and self.est.num_blocks else kv_bytes // block_bytes
        )
        tokens = num_blocks * self.est.block_size
        if tokens < self.max_model_len:
            self._refuse(
                L.vllm_max_len_error(
                    v,
                    self.max_model_len,
                    self.max_model_len * self.est.kv_bytes_per_token,
                    kv_bytes,
                    tokens,
                    tokens,
                )
            )
        self._alloc(num_blocks * block_bytes, "kv_cache")
        for line in L.vllm_kv_lines(v, kv_bytes, tokens, self.max_model_len, tokens / self.max_model_len):
            self.log.info(line, "cache")
        if self.est.cuda_graph_bytes:
            self._alloc(self.est.cuda_graph_bytes, "cuda_graph")
            await self._sleep_scaled(5.0)
            self.log.info(
                f"Graph capturing finished in 5 secs, took {to_gib(self.est.cuda_graph_bytes):.2f} GiB",
                "graph",
            )
        self._make_scheduler(num_blocks)

    async def _start_from_free(self) -> tuple[int, int, int]:
        """SGLang/TGI: load, then size the pool from what is free now (co-tenants included)."""
        self._alloc_context()
        await self._meet("context")
        _, _, avail_before = self.ledger.memory_info()
        await self._meet("snapshot")
        await self._load_weights()
        _, _, avail_after_load = self.ledger.memory_info()
        await self._profile()
        _, used_now, _ = self.ledger.memory_info()
        others = max(0, used_now - self._own_bytes)
        kv_bytes = self.est.kv_cache_bytes - others
        block_bytes = self.est.block_size * self.est.kv_bytes_per_token
        num_blocks = max(0, kv_bytes // block_bytes) if others else self.est.num_blocks
        return avail_before, avail_after_load, num_blocks

    async def _start_sglang(self) -> None:
        avail_before, avail_after_load, num_blocks = await self._start_from_free()
        if num_blocks <= 0:
            self._refuse("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        kv_bytes = num_blocks * self.est.block_size * self.est.kv_bytes_per_token
        self._alloc(kv_bytes, "kv_cache")
        self._alloc(self.est.cuda_graph_bytes, "cuda_graph")
        _, _, avail_after_pool = self.ledger.memory_info()
        for line in L.sglang_lines(
            self.est.weights_bytes,
            num_blocks * self.est.block_size,
            kv_bytes,
            avail_before,
            avail_after_load,
            avail_after_pool + self.est.cuda_graph_bytes,
            self.est.cuda_graph_bytes,
            self.max_num_seqs,
            self.max_model_len,
            self.max_num_batched_tokens,
        ):
            self.log.info(line)
        self._make_scheduler(num_blocks)

    async def _start_tgi(self) -> None:
        _, _, num_blocks = await self._start_from_free()
        if num_blocks * self.est.block_size < self.max_model_len:
            self._refuse(
                f"Not enough memory to handle {self.max_num_batched_tokens} prefill tokens. You need to "
                "decrease `--max-batch-prefill-tokens`"
            )
        self._alloc(num_blocks * self.est.block_size * self.est.kv_bytes_per_token, "kv_cache")
        self._alloc(self.est.cuda_graph_bytes, "cuda_graph")
        for line in L.tgi_lines(num_blocks, self.est.block_size, num_blocks * self.est.block_size):
            self.log.info(line)
        self._make_scheduler(num_blocks)

    async def _start_llamacpp(self) -> None:
        self._alloc_context()
        _, _, free = self.ledger.memory_info()
        await self._load_weights()
        kv = self.est.kv_cache_bytes
        self._alloc(kv, "kv_cache")
        self._alloc(self.est.activation_peak_bytes, "activation")
        if self.est.non_torch_bytes:
            self._alloc(self.est.non_torch_bytes, "non_torch")
        cells = kv // max(1, self.est.kv_bytes_per_token)
        for line in L.llamacpp_lines(
            self.gpu_label,
            free,
            self.est.weights_bytes,
            kv,
            cells,
            int(self.est.extra.get("num_layers", 32)),
            self.max_num_seqs,
            self.est.activation_peak_bytes,
        ):
            self.log.info(line)
        self._make_scheduler(max(1, cells // self.est.block_size))
        self._activation_bytes = (
            self.est.activation_peak_bytes
        )  # llama.cpp reserves its compute buffer up front

    # --- requests -----------------------------------------------------------------------
    def submit(
        self,
        rid: str,
        prompt_tokens: int,
        max_tokens: int,
        ignore_eos: bool,
        key: str,
        sink: asyncio.Queue[tuple[str, Any]],
        tokens: list[str] | None = None,
    ) -> Request:
        stop_at = max_tokens
        if not ignore_eos and max_tokens > 1:
            # As if the model sampled EOS: a length fixed by the seed and the prompt, never by timing.
            stop_at = random.Random(f"{self.cfg.seed}:{key}:{max_tokens}").randint(
                max(1, max_tokens // 2), max_tokens
            )
        req = Request(rid, prompt_tokens, max_tokens, stop_at, key, time.monotonic(), sink)
        self.stats.requests += 1
        assert self.sched is not None
        if self.sched.cache is not None and tokens is not None:  # its blocks by content: shared prefixes
            from vramlab.sim.prefix_cache import block_hashes

            req.hashes, req.tail = block_hashes(tokens, self.sched.block_size)
        self.sched.add(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if self.sched is not None and req.finished_reason is None:
            self.sched.abort(req)
            req.finished_reason = "abort"
            self.stats.success["abort"] += 1

    # --- the loop -----------------------------------------------------------------------
    def _activation_need(self, batch: Batch) -> int:
        frac = max(batch.num_tokens / self.max_num_batched_tokens, len(batch.scheduled) / self.max_num_seqs)
        need = int(self.est.activation_peak_bytes * min(1.0, frac))
        return cdiv(need, ACTIVATION_ROUND_BYTES) * ACTIVATION_ROUND_BYTES

    def _grow_activation(self, need: int) -> None:
        """The caching allocator keeps what it reserved; only growth goes to the driver."""
        if need <= self._activation_bytes and not self.faults.oom_next_allocation:
            return
        extra = max(need - self._activation_bytes, ACTIVATION_ROUND_BYTES)
        self._alloc(extra, "activation")
        self._activation_bytes += extra

    def _log_preemptions(self, preempted: Iterable[Request]) -> None:
        assert self.sched is not None
        for req in preempted:
            self.stats.preemptions += 1
            if self.cfg.engine == "vllm" and self.version < (0, 8):
                self.log.warning(
                    f"Sequence group {req.id} is preempted by PreemptionMode.RECOMPUTE mode because there is not "
                    "enough KV cache space. This can affect the end-to-end performance. Increase "
                    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
                    f"total_num_cumulative_preemption={self.stats.preemptions}",
                    "sched",
                )
            elif self.cfg.engine == "sglang":
                ratio = self._rng.uniform(0.6, 0.9)
                self.log.info(
                    f"Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: {ratio:.4f} -> "
                    f"{min(1.0, ratio + 0.1):.4f}"
                )
            elif self.cfg.engine == "llama.cpp":
                self.log.info(
                    "update_slots: failed to find free space in the KV cache, retrying with smaller "
                    "batch size"
                )

    async def run(self) -> None:
        """Step until stopped or dead. Cancel the task to stop."""
        assert self.sched is not None
        sched = self.sched
        while not self.dead:
            if self.faults.crash:
                die_crash(self)
                return
            if self.faults.hang:
                await self.faults.wait_unhang()
                continue
            if not sched.running and not sched.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = sched.schedule()
            self._log_preemptions(batch.preempted)
            if not batch.scheduled:
                await asyncio.sleep(0.001)  # everyone preempted or waiting on blocks: let time pass
                continue
            try:
                self._grow_activation(self._activation_need(batch))
            except SimOutOfMemory as oom:
                die_oom(self, oom)
                return
            step = self.roofline.step_s(batch.prefill_tokens, batch.decode_seqs, batch.context_tokens)
            await asyncio.sleep(step * self.faults.slow_factor / self.cfg.speed)
            if self.dead:
                return
            self._deliver(batch, time.monotonic(), step / self.cfg.speed)

    def _deliver(self, batch: Batch, now: float, step_wall_s: float) -> None:
        assert self.sched is not None
        if batch.prefill_tokens:
            self.stats.prompt_seconds += step_wall_s
        if batch.decode_seqs:
            self.stats.predicted_seconds += step_wall_s
        for req, finished in self.sched.complete(batch, now):
            s = self.stats
            if req.generated == 1:
                s.prompt_tokens += req.prompt_tokens
            s.generation_tokens += 1
            if req.generated == 1:
                s.ttft_s.observe(now - req.arrival_s)
                s.queue_s.observe((req.first_scheduled_s or now) - req.arrival_s)
            elif req.prev_token_s is not None:
                s.itl_s.observe(now - req.prev_token_s)
            idx = req.generated - 1
            if req.sink is not None:
                req.sink.put_nowait(("token", idx))
            if finished:
                s.success[req.finished_reason or "stop"] += 1
                s.e2e_s.observe(now - req.arrival_s)
                if req.sink is not None:
                    req.sink.put_nowait(("done", req.finished_reason))
