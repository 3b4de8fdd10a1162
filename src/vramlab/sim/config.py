"""What one sim server is asked to be: the engine, its settings, the card, and the knobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from vramlab.engines import sim_engines
from vramlab.errors import ConfigError

if TYPE_CHECKING:
    from vramlab.capacity.estimate import Estimate

SIM_ENGINES = sim_engines()  # the engines the sim plays (vramlab.engines)
FAULT_KINDS = ("hang", "slow", "crash", "oom")


@dataclass(frozen=True)
class Fault:
    """A fault armed at start-up: *kind* after *after_s* seconds of serving (sim time is not scaled)."""

    kind: str
    after_s: float = 0.0
    factor: float = 10.0  # for "slow": steps take this many times longer

    @classmethod
    def parse(cls, text: str) -> Fault:
        """'hang', 'crash@2.5', 'slow@1:20' (kind[@after_s][:factor])."""
        kind, _, rest = text.partition("@")
        after, _, factor = rest.partition(":")
        if kind not in FAULT_KINDS:
            raise ConfigError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        try:
            return cls(kind, float(after or 0), float(factor or 10))
        except ValueError:
            raise ConfigError(f"bad fault {text!r}; write KIND[@AFTER_S][:FACTOR], e.g. crash@5") from None


@dataclass(frozen=True)
class SimConfig:
    model: str = "llama-3.1-8b-instruct"
    gpu: str = "h100-80gb"
    engine: str = "vllm"
    engine_version: str | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    device: str | None = None  # ledger file; None = a private card in a temp dir
    speed: float = 1.0  # sim time runs this many times faster than the roofline says
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    allow_fault_injection: bool = False
    log_file: str | None = None
    max_concurrent_requests: int = 128  # TGI's --max-concurrent-requests (429 beyond it)
    load_gbps: float = 2.0  # weight loading bandwidth
    served_model_name: str | None = None
    watchdog_s: float = 5.0  # vLLM's VLLM_WATCHDOG_TIME_S: from engine death to exit (wall clock, not scaled)
    log_stats_interval_s: float = 5.0  # the engine's periodic stats line (wall clock)
    start_barrier: str | None = None  # FILE:N: meet N sims at the start-up checkpoints (sim/barrier.py)
    # prefix caching (sim/prefix_cache.py); None: the engine's default (prefix_caching_default)
    prefix_caching: bool | None = None
    # usage.prompt_tokens_details.cached_tokens in answers (vLLM's --enable-prompt-tokens-details;
    # llama-server always sends it)
    prompt_tokens_details: bool = False
    estimate: Estimate | None = field(default=None, compare=False)  # serve this instead of computing

    def __post_init__(self) -> None:
        if self.engine not in SIM_ENGINES:
            from vramlab.errors import unknown

            raise unknown("engine", self.engine, list(SIM_ENGINES))
        import math

        # `not x > 0` rather than `x <= 0`: NaN fails every comparison and must be refused too.
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ConfigError(f"--speed must be a positive finite number, got {self.speed}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0 (any free port) to 65535, got {self.port}")
        for name in ("watchdog_s", "log_stats_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive finite number, got {value}")

    def with_(self, **changes: object) -> SimConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def version(self) -> tuple[int, ...]:
        from vramlab.capacity.settings import DEFAULT_VERSIONS, parse_version

        return parse_version(self.engine_version or DEFAULT_VERSIONS[self.engine])

    @property
    def prefix_caching_on(self) -> bool:
        """Prefix caching as the engine has it unless told: on in vLLM's V1 engine (0.8 and later:
        ``enable_prefix_caching`` defaults to True there), SGLang's radix cache (unless
        --disable-radix-cache) and TGI 3 (its v3 release notes: prefix caching on by default); off in
        vLLM's V0 and in llama.cpp, whose per-slot prompt cache the sim does not model."""
        if self.prefix_caching is not None:
            return self.prefix_caching
        if self.engine == "vllm":
            return self.version >= (0, 8)
        if self.engine == "tgi":
            return self.version >= (3,)
        return self.engine == "sglang"

    @property
    def version_text(self) -> str:
        from vramlab.capacity.settings import DEFAULT_VERSIONS

        return self.engine_version or DEFAULT_VERSIONS[self.engine]


def compute_estimate(cfg: SimConfig) -> Estimate:
    """The capacity model's answer for this config (or the one the config carries)."""
    if cfg.estimate is not None:
        return cfg.estimate
    try:
        from vramlab.capacity import estimate
        from vramlab.capacity.settings import EngineSettings
        from vramlab.sources import resolve_model
    except ImportError as exc:
        raise ConfigError(f"the capacity model is not available ({exc}); pass --plan FILE") from None
    from vramlab.capacity.gpus import get_gpu

    settings = EngineSettings(
        engine=cfg.engine,
        engine_version=cfg.engine_version,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        kv_cache_dtype=cfg.kv_cache_dtype,
        tensor_parallel_size=cfg.tensor_parallel_size,
    )
    spec = resolve_model(cfg.model)
    try:
        return estimate(spec, get_gpu(cfg.gpu), settings)
    except ImportError as exc:  # an engine policy not written yet
        raise ConfigError(
            f"the capacity model has no {cfg.engine} policy yet ({exc}); pass --plan FILE"
        ) from None


def estimate_from_json(data: dict[str, Any]) -> Estimate:
    """Rebuild an `Estimate` from `vramlab plan --json` output (capacity/estimate_json.py)."""
    from vramlab.capacity.estimate_json import estimate_from_json as rebuild

    return rebuild(data)
