"""What one instance needs on each of its cards, from the capacity model.

The engine's own knob (vLLM `--gpu-memory-utilization`, SGLang `--mem-fraction-static`) is
solved by asking `vramlab.capacity.estimate` for the smallest value at which the guaranteed
concurrency x context fits (at the model's pessimistic band when it gives one). No memory maths
lives here: the capacity model owns the formulas, this module only searches its knob.

Packing and the simulation take any `DemandFn`, so they can be tested with hand-made demands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vramlab.placement.inputs import Card, Instance

# The engine knob that sizes its memory, by engine. Others size from explicit settings.
KNOBS = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
KNOB_STEP = 0.001  # the knob is emitted with 3 decimals, rounded up
KNOB_MAX = {"gpu_memory_utilization": 1.0, "mem_fraction_static": 0.999}  # SGLang wants it below 1


@dataclass(frozen=True)
class Demand:
    """Per-GPU bytes of one instance at one TP size, split the way the memory map draws it."""

    instance: str
    gpu: str
    tp: int
    fits: bool
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    activation_bytes: int = 0
    overhead_bytes: int = 0  # CUDA context, NCCL, CUDA graphs, non-torch: stays while asleep
    margin_bytes: int = 0  # kept free on the card for the model's error band and the user's margin
    knobs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    max_concurrency: float = 0.0
    reason: str = ""

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.overhead_bytes

    @property
    def total_bytes(self) -> int:
        return self.used_bytes + self.margin_bytes

    @property
    def asleep_bytes(self) -> int:
        """What a slept engine keeps on the card (vLLM sleep drops weights and KV, not the process)."""
        return self.overhead_bytes


class DemandFn(Protocol):
    def __call__(self, inst: Instance, card: Card, tp: int, other_processes_bytes: int = 0) -> Demand: ...


class CapacityDemand:
    """`DemandFn` backed by `vramlab.capacity.estimate` and `vramlab.sources.resolve_model`.

    Results are cached: infeasibility advice re-packs many variants of the same instances.
    """

    def __init__(
        self,
        estimate_fn: Callable[..., Any] | None = None,
        resolve_fn: Callable[[str], Any] | None = None,
        constants: Any = None,
    ) -> None:
        self._estimate = estimate_fn
        self._resolve = resolve_fn
        self._constants = constants
        self._specs: dict[tuple[str, str | None], Any] = {}
        self._cache: dict[tuple[Any, ...], Demand] = {}
        self.calls = 0

    # -- the capacity model's pieces, imported on first use -----------------------------------------
    def _estimate_fn(self) -> Callable[..., Any]:
        if self._estimate is None:
            from vramlab.capacity import estimate

            self._estimate = estimate
        return self._estimate

    def spec(self, inst: Instance) -> Any:
        key = (inst.model, inst.quantization)
        if key not in self._specs:
            if self._resolve is None:
                from vramlab.sources import resolve_model

                self._resolve = resolve_model
            spec = self._resolve(inst.model)
            if inst.quantization:
                spec = spec.with_(quant=quant_spec(inst.quantization))
            self._specs[key] = spec
        return self._specs[key]

    def gpu(self, card: Card) -> Any:
        from vramlab.capacity.gpus import custom_gpu, get_gpu

        gpu = get_gpu(card.gpu_name)
        if card.memory_bytes != gpu.memory_bytes:
            gpu = custom_gpu(card.memory_bytes / (1 << 30), like=gpu)
        return gpu

    def settings(self, inst: Instance, tp: int, other_processes_bytes: int = 0, **knob: Any) -> Any:
        from vramlab.capacity.settings import EngineSettings

        extra: dict[str, Any] = dict(inst.settings_dict())
        if inst.engine == "llama.cpp":
            # llama.cpp splits -c across -np slots: each slot gets the full context.
            extra |= {"ctx_size": inst.context_tokens * inst.concurrency, "parallel": inst.concurrency}
        return EngineSettings(
            engine=inst.engine,
            max_model_len=inst.context_tokens,
            max_num_seqs=inst.concurrency,
            tensor_parallel_size=tp,
            other_processes_bytes=other_processes_bytes,
            **extra,
            **knob,
        )

    def estimate(
        self, inst: Instance, card: Card, tp: int, other_processes_bytes: int = 0, **knob: float
    ) -> Any:
        self.calls += 1
        return self._estimate_fn()(
            self.spec(inst),
            self.gpu(card),
            self.settings(inst, tp, other_processes_bytes, **knob),
            self._constants,
        )

    # -- the demand --------------------------------------------------------------------------------
    def __call__(self, inst: Instance, card: Card, tp: int, other_processes_bytes: int = 0) -> Demand:
        key = (inst, card.gpu_name, card.memory_bytes, tp, other_processes_bytes)
        if key not in self._cache:
            self._cache[key] = self._demand(inst, card, tp, other_processes_bytes)
        return self._cache[key]

    def _enough(self, inst: Instance, est: Any) -> bool:
        """The KV pool holds the guaranteed sequences (monotone in the knob, unlike `fits`)."""
        lim = est.pessimistic or est
        enough: bool = lim.max_concurrency >= inst.concurrency and est.max_model_len >= inst.context_tokens
        return enough

    def _ok(self, inst: Instance, est: Any) -> bool:
        return bool(est.fits) and self._enough(inst, est)

    def _demand(self, inst: Instance, card: Card, tp: int, other: int) -> Demand:
        knob = KNOBS.get(inst.engine)
        if knob is None or inst.settings_dict().get(knob) is not None:
            # No knob to solve (llama.cpp sizes per slot; the user pinned it): take the settings as given.
            est = self.estimate(inst, card, tp, other)
            return self._to_demand(inst, card, tp, est, {}, self._ok(inst, est))
        # The smallest knob (n x KNOB_STEP) whose pool holds the guaranteed sequences; then the
        # capacity model says whether the process fits the card at that value.
        lo, hi = 0, int(round(KNOB_MAX[knob] / KNOB_STEP))
        best = self.estimate(inst, card, tp, other, **{knob: hi * KNOB_STEP})
        if not self._enough(inst, best):
            return self._to_demand(inst, card, tp, best, {knob: KNOB_MAX[knob]}, False)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            est = self.estimate(inst, card, tp, other, **{knob: mid * KNOB_STEP})
            if self._enough(inst, est):
                hi, best = mid, est
            else:
                lo = mid
        return self._to_demand(inst, card, tp, best, {knob: round(hi * KNOB_STEP, 3)}, bool(best.fits))

    def _to_demand(
        self, inst: Instance, card: Card, tp: int, est: Any, knobs: dict[str, Any], ok: bool
    ) -> Demand:
        w, kv, act = est.weights_bytes, est.kv_cache_bytes, est.activation_peak_bytes
        overhead = max(0, est.used_bytes - w - kv - act)
        # Memory the engine does not budget (context, NCCL, graphs outside the KV formula) can
        # overrun onto the card: keep its upper band free, plus what the user asked for.
        band = sum(c.high_bytes - c.bytes for c in est.components if not c.in_budget)
        reason = ""
        if not ok:
            lim = est.pessimistic or est
            reason = "; ".join(est.reasons) or (
                f"room for {lim.max_concurrency:.1f} sequences of {inst.context_tokens} tokens, "
                f"{inst.concurrency} guaranteed"
            )
        return Demand(
            inst.name,
            card.gpu_name,
            tp,
            ok,
            w,
            kv,
            act,
            overhead,
            inst.margin_bytes + band,
            knobs,
            float(est.max_concurrency),
            reason,
        )


def quant_spec(method: str) -> Any:
    """A pre-quantized checkpoint's storage, for 'use a 4-bit checkpoint' advice and YAML."""
    from vramlab.capacity.spec import QuantSpec
    from vramlab.errors import ConfigError

    table = {
        "awq": QuantSpec("awq", 4, group_size=128),
        "gptq": QuantSpec("gptq", 4, group_size=128),
        "fp8": QuantSpec("fp8", 8, has_zeros=False),
        "int8": QuantSpec("compressed-tensors", 8, has_zeros=False),
    }
    if method not in table:
        raise ConfigError(f"unknown quantization {method!r}; one of {', '.join(table)}")
    return table[method]


def best_option(inst: Instance, card: Card, demand_fn: DemandFn, node_size: int) -> Demand | None:
    """The smallest TP at which the instance fits on cards of this kind, alone."""
    for tp in inst.tp_options:
        if tp > node_size:
            break
        d = demand_fn(inst, card, tp)
        if d.fits and d.total_bytes <= card.memory_bytes:
            return d
    return None
