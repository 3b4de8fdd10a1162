"""The fleet and models files of `vramlab pack`: schema, line-numbered errors, plain data out.

The YAML is validated with pydantic; an error names the file and the line it came from, so a
user with forty models in a file is pointed at the right one. What comes out is frozen
dataclasses (`Fleet`, `Card`, `Instance`, `Policy`) that the pure placement core works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from vramlab.engines import served_engines
from vramlab.errors import ConfigError
from vramlab.planfile import read_yaml, validate

ENGINES = served_engines()  # started one instance per model (vramlab.engines)
POLICIES = ("lru", "priority", "keep-alive", "sleep-1", "sleep-2")
TP_CHOICES = (1, 2, 4, 8)
DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's OLLAMA_KEEP_ALIVE default, 5m


# --- plain data the core works on --------------------------------------------------------------
@dataclass(frozen=True)
class Card:
    index: int  # position in the fleet, 0-based; stable ids for tables and JSON
    node: str
    gpu_name: str
    memory_bytes: int
    pcie_gbps: float  # host <-> device copy bandwidth, GB/s (sleep level 1 wake-up)

    @property
    def label(self) -> str:
        return f"{self.node}/gpu{self.local_index}"

    local_index: int = 0


@dataclass(frozen=True)
class Fleet:
    cards: tuple[Card, ...]

    def node_cards(self, node: str) -> tuple[Card, ...]:
        return tuple(c for c in self.cards if c.node == node)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.node for c in self.cards))

    def with_extra_card(self, node: str) -> Fleet:
        """The fleet plus one more card like the node's first (for 'one more card' advice)."""
        like = self.node_cards(node)[0]
        extra = Card(
            len(self.cards),
            node,
            like.gpu_name,
            like.memory_bytes,
            like.pcie_gbps,
            local_index=len(self.node_cards(node)),
        )
        return Fleet(self.cards + (extra,))


@dataclass(frozen=True)
class Instance:
    """One engine process serving one model (possibly over TP cards)."""

    name: str
    model: str
    engine: str = "vllm"
    settings: tuple[tuple[str, Any], ...] = ()  # extra EngineSettings fields, sorted pairs
    concurrency: int = 1  # guaranteed concurrent sequences ...
    context_tokens: int = 4096  # ... each of this many tokens (max_model_len)
    tp_options: tuple[int, ...] = (1, 2, 4, 8)
    rate_rps: float | None = None
    slo_ms: float | None = None  # latency SLO a cold start is compared with
    priority: int = 0  # higher wins
    weights_source: str = "local"
    load_gbps: float = 2.0  # weight-load bandwidth from the source, GB/s
    engine_start_s: float = 20.0  # process start, CUDA context, graphs: beyond the weight copy
    residency: Literal["resident", "on-demand", "auto"] = "auto"
    margin_bytes: int = 0  # extra safety margin the user asked for, per GPU
    quantization: str | None = None  # a pre-quantized checkpoint (awq, gptq): weights change
    prefill_tokens_per_s: float | None = None  # service-time model overrides for the simulation
    decode_tokens_per_s: float | None = None

    def settings_dict(self) -> dict[str, Any]:
        return dict(self.settings)

    def with_(self, **changes: Any) -> Instance:
        from dataclasses import replace

        return replace(self, **changes)


@dataclass(frozen=True)
class Policy:
    eviction: str = "lru"
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S  # < 0: never expire (Ollama -1); 0: unload at once
    exact_limit: int = 8  # 'auto' search is exact up to this many instances


@dataclass(frozen=True)
class Inputs:
    fleet: Fleet
    instances: tuple[Instance, ...]
    policy: Policy = field(default_factory=Policy)


def check_keep_alive(value: float) -> float:
    """Seconds >= 0, or -1 for "never unload" (Ollama's keep_alive: -1); other negatives are a typo."""
    import math

    if not math.isfinite(value) or (value < 0 and value != -1):
        raise ValueError(f"idle seconds before unloading must be >= 0, or -1 for never, got {value:g}")
    return value


# --- schema ---------------------------------------------------------------------------------------
def _schemas() -> tuple[Any, Any]:
    """Pydantic classes, built on first use so importing this module stays cheap."""
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class _Strict(BaseModel):
        # strict: "5" or true where a number goes is refused by name, not read as 5 or 1; no .inf/.nan
        model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    class NodeIn(_Strict):
        name: str | None = None
        gpu: str
        count: int = Field(1, ge=1, le=64)
        memory_gib: float | None = Field(None, gt=0)  # override the catalog's usable memory
        pcie_gbps: float = Field(25.0, gt=0)  # PCIe 4.0 x16 in practice; 50 for 5.0

    class FleetIn(_Strict):
        nodes: list[NodeIn] | None = None
        gpu: str | None = None  # the one-card (or one-node) shorthand
        count: int = Field(1, ge=1, le=64)
        memory_gib: float | None = Field(None, gt=0)
        pcie_gbps: float = Field(25.0, gt=0)

    class TrafficIn(_Strict):
        rate_rps: float | None = Field(None, ge=0)
        trace: bool = False  # traffic comes from the --simulate trace

    class SloIn(_Strict):
        latency_ms: float = Field(gt=0)

    class WeightsIn(_Strict):
        source: str = "local"
        load_gbps: float = Field(2.0, gt=0)

    class ModelIn(_Strict):
        name: str | None = None
        model: str
        engine: str = "vllm"
        settings: dict[str, Any] = Field(default_factory=dict)
        concurrency: int = Field(1, ge=1)
        context_tokens: int = Field(4096, ge=16)
        tp: Literal["auto"] | int | list[int] = "auto"
        traffic: TrafficIn = Field(default_factory=lambda: TrafficIn())
        slo: SloIn | None = None
        priority: int = 0
        weights: WeightsIn = Field(default_factory=lambda: WeightsIn())
        engine_start_s: float = Field(20.0, ge=0)
        residency: Literal["resident", "on-demand", "auto"] = "auto"
        margin_gib: float = Field(0.0, ge=0)
        quantization: str | None = None
        prefill_tokens_per_s: float | None = Field(None, gt=0)
        decode_tokens_per_s: float | None = Field(None, gt=0)

        @field_validator("engine")
        @classmethod
        def _engine(cls, v: str) -> str:
            if v not in ENGINES:
                raise ValueError(f"unknown engine {v!r}; one of {', '.join(ENGINES)}")
            return v

        @field_validator("tp")
        @classmethod
        def _tp(cls, v: Any) -> Any:
            opts = [v] if isinstance(v, int) else v if isinstance(v, list) else []
            bad = [t for t in opts if t not in TP_CHOICES]
            if bad or (isinstance(v, list) and not v):
                raise ValueError(f"tensor parallel size must be one of {TP_CHOICES} (got {v!r})")
            return v

        @field_validator("settings")
        @classmethod
        def _settings(cls, v: dict[str, Any]) -> dict[str, Any]:
            from vramlab.capacity.settings import EngineSettings
            from vramlab.errors import near_matches

            known = {f.name for f in fields(EngineSettings)}
            owned = {
                "engine",
                "max_model_len",
                "max_num_seqs",
                "tensor_parallel_size",
                "other_processes_bytes",
                "ctx_size",
                "parallel",
            }
            for key in v:
                if key in owned:
                    raise ValueError(f"{key!r} is set by pack (from concurrency, context_tokens, tp)")
                if key not in known:
                    hint = near_matches(key, sorted(known - owned))
                    raise ValueError(
                        f"unknown engine setting {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                    )
            return v

    class PolicyIn(_Strict):
        eviction: str = "lru"
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S

        @field_validator("keep_alive_s")
        @classmethod
        def _keep_alive(cls, v: float) -> float:
            return check_keep_alive(v)

        @field_validator("eviction")
        @classmethod
        def _eviction(cls, v: str) -> str:
            if v not in POLICIES:
                raise ValueError(f"unknown eviction policy {v!r}; one of {', '.join(POLICIES)}")
            return v

    class ModelsIn(_Strict):
        defaults: dict[str, Any] = Field(default_factory=dict)
        policy: PolicyIn = Field(default_factory=PolicyIn)
        models: list[ModelIn] = Field(min_length=1)

    return FleetIn, ModelsIn


def load_fleet(path: str | Path) -> Fleet:
    from vramlab.capacity.gpus import get_gpu
    from vramlab.units import GIB

    path = Path(path)
    fleet_cls, _ = _schemas()
    src = read_yaml(path, "fleet")
    doc = validate(fleet_cls, src, kind="a fleet file", keys="gpu:, count: or nodes:")
    if doc.nodes and doc.gpu:
        raise ConfigError(
            f"{src.where(('gpu',))}: give either 'nodes' or the one-node shorthand 'gpu', not both"
        )
    if not doc.nodes and not doc.gpu:
        raise ConfigError(f"{src.where(())}: no cards: give 'gpu' (and 'count') or a list of 'nodes'")
    nodes = doc.nodes or [doc]
    cards: list[Card] = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        where = src.where(("nodes", i, "gpu") if doc.nodes else ("gpu",))
        try:
            gpu = get_gpu(node.gpu)
        except Exception as exc:
            raise ConfigError(f"{where}: {exc}") from None
        name = getattr(node, "name", None) or f"node{i}"
        if name in seen:
            raise ConfigError(f"{where}: node name {name!r} is used twice")
        seen.add(name)
        mem = int(node.memory_gib * GIB) if node.memory_gib else gpu.memory_bytes
        for j in range(node.count):
            cards.append(Card(len(cards), name, gpu.name, mem, node.pcie_gbps, local_index=j))
    return Fleet(tuple(cards))


def load_models(path: str | Path) -> tuple[tuple[Instance, ...], Policy]:
    from vramlab.units import GIB

    path = Path(path)
    _, models_cls = _schemas()
    src = read_yaml(path, "models")
    data = src.data
    # `defaults:` fills every model's missing keys before validation, so errors still point at lines.
    if (
        isinstance(data, dict)
        and isinstance(data.get("defaults"), dict)
        and isinstance(data.get("models"), list)
    ):
        for m in data["models"]:
            if isinstance(m, dict):
                for k, v in data["defaults"].items():
                    m.setdefault(k, v)
    doc = validate(models_cls, src, kind="a models file", keys="models:, defaults:, policy:")
    out: list[Instance] = []
    names: set[str] = set()
    for i, m in enumerate(doc.models):
        name = m.name or m.model
        if name in names:
            raise ConfigError(
                f"{src.where(('models', i))}: instance name {name!r} is used "
                "twice; give each a distinct 'name'"
            )
        names.add(name)
        tp = TP_CHOICES if m.tp == "auto" else (m.tp,) if isinstance(m.tp, int) else tuple(sorted(set(m.tp)))
        out.append(
            Instance(
                name=name,
                model=m.model,
                engine=m.engine,
                settings=tuple(sorted(m.settings.items())),
                concurrency=m.concurrency,
                context_tokens=m.context_tokens,
                tp_options=tp,
                rate_rps=m.traffic.rate_rps,
                slo_ms=m.slo.latency_ms if m.slo else None,
                priority=m.priority,
                weights_source=m.weights.source,
                load_gbps=m.weights.load_gbps,
                engine_start_s=m.engine_start_s,
                residency=m.residency,
                margin_bytes=int(m.margin_gib * GIB),
                quantization=m.quantization,
                prefill_tokens_per_s=m.prefill_tokens_per_s,
                decode_tokens_per_s=m.decode_tokens_per_s,
            )
        )
    policy = Policy(eviction=doc.policy.eviction, keep_alive_s=doc.policy.keep_alive_s)
    return tuple(out), policy


def load_inputs(fleet_path: str | Path, models_path: str | Path) -> Inputs:
    instances, policy = load_models(models_path)
    return Inputs(load_fleet(fleet_path), instances, policy)
