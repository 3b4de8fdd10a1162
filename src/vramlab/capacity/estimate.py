"""The result of the capacity model: components with bands and provenance, and the limits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Where a figure comes from, from most to least certain.
EXACT = "exact"  # read from weight-file headers or computed from exact shapes
FORMULA = "formula"  # computed from the architecture
ENGINE = "engine-policy"  # the engine's own budgeting rule
DEFAULT = "default"  # a default constant with a band
CALIBRATED = "calibrated"  # a constant fitted to the user's measurements
PROVENANCES = (EXACT, FORMULA, ENGINE, DEFAULT, CALIBRATED)


@dataclass(frozen=True)
class Component:
    """One slice of a GPU's memory, per GPU, with its error band."""

    name: str
    bytes: int
    low_bytes: int
    high_bytes: int
    provenance: str
    note: str = ""  # where the error comes from
    in_budget: bool = True  # the engine subtracts it before sizing the KV pool

    def __post_init__(self) -> None:
        if not self.low_bytes <= self.bytes <= self.high_bytes:
            raise ValueError(f"{self.name}: band {self.low_bytes}..{self.high_bytes} excludes {self.bytes}")


def band(
    name: str,
    value: float,
    rel_low: float,
    rel_high: float,
    provenance: str,
    note: str = "",
    in_budget: bool = True,
    abs_low: float = 0.0,
    abs_high: float = 0.0,
) -> Component:
    """A component whose band is value x (1 - rel_low) - abs_low .. value x (1 + rel_high) + abs_high."""
    v = int(round(value))
    lo = max(0, int(v * (1 - rel_low) - abs_low))
    hi = int(v * (1 + rel_high) + abs_high)
    return Component(name, v, min(lo, v), max(hi, v), provenance, note, in_budget)


@dataclass(frozen=True)
class Limits:
    """What the pool admits, at one point of the band (expected, pessimistic)."""

    kv_cache_bytes: int
    kv_cache_tokens: int
    num_blocks: int
    max_concurrency: float


@dataclass(frozen=True)
class Estimate:
    model: str
    gpu: str
    engine: str
    engine_version: str
    gpu_memory_bytes: int  # per GPU, as the framework reports it
    settings: dict[str, Any]  # resolved settings: defaults filled in as the engine would
    components: tuple[Component, ...]
    kv_bytes_per_token: int  # per GPU (after TP split), all local layers
    block_size: int
    num_blocks: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    budget_bytes: int  # what the engine lets itself use (util x total, fraction x total...)
    used_bytes: int  # what the process holds per GPU at steady state
    headroom_bytes: int  # card memory left over
    fits: bool
    reasons: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    pessimistic: Limits | None = None
    optimistic: Limits | None = None
    per_sequence_state_bytes: int = 0  # Mamba/linear-attention state per sequence
    extra: dict[str, Any] = field(default_factory=dict)
    # The budget less everything else, signed: what vLLM prints as "Available KV cache memory" even when it
    # is negative and the start-up fails ("No available memory for the cache blocks"); kv_cache_bytes is
    # this, floored at 0.
    kv_available_bytes: int = 0

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def _bytes(self, name: str) -> int:
        c = self.component(name)
        return c.bytes if c else 0

    @property
    def weights_bytes(self) -> int:
        return self._bytes("weights")

    @property
    def activation_peak_bytes(self) -> int:
        return self._bytes("activation_peak")

    @property
    def non_torch_bytes(self) -> int:
        return self._bytes("non_torch")

    @property
    def cuda_graph_bytes(self) -> int:
        return self._bytes("cuda_graphs")

    def to_json(self) -> dict[str, Any]:
        """The documented `plan --json` object (docs/plan-json.md)."""
        out: dict[str, Any] = {
            "model": self.model,
            "gpu": self.gpu,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_available_bytes": self.kv_available_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "activation_peak_bytes": self.activation_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_concurrency": round(self.max_concurrency, 2),
            "max_model_len": self.max_model_len,
            "budget_bytes": self.budget_bytes,
            "used_bytes": self.used_bytes,
            "headroom_bytes": self.headroom_bytes,
            "per_sequence_state_bytes": self.per_sequence_state_bytes,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "suggestions": list(self.suggestions),
            "notes": list(self.notes),
            "settings": self.settings,
            "components": [asdict(c) for c in self.components],
        }
        for key, lim in (("pessimistic", self.pessimistic), ("optimistic", self.optimistic)):
            if lim is not None:
                out[key] = asdict(lim) | {"max_concurrency": round(lim.max_concurrency, 2)}
        out.update(self.extra)
        return out
