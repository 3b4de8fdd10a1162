"""The one plan document: its kinds, its one vocabulary, the old names it still reads, and the
sections every kind shares (docs/experiments.md, "One plan document").

    kind: experiment     `vramlab run`    fixed inputs, one changed variable, rounds (experiment/plan.py)
    kind: drill          `vramlab drill`  a ramp to failure, detection, recovery (drill/plan.py)
    kind: colocation     `vramlab drill`  a drill whose target shares its card with other engines

One name per idea in every kind: `stop_conditions`, `load.retry`, a ramp's `ceiling`,
`target.metrics_url` (a URL, or a path on the target's root), `target.sim` (`SimSettings`). The
names the two older dialects used still load; `upgrade` moves each to its new place and words one
note per old name ("stop -> stop_conditions"), which the runners store with the run.

Pure: pydantic models and dict rewriting, no I/O, so the report reads a stored plan through these
same sections (with the same upgrade) instead of by raw keys with repeated defaults.
"""

from __future__ import annotations

import copy
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from vramlab.engines import SimEngine

Kind = Literal["experiment", "drill", "colocation"]
KINDS: dict[str, str] = {"experiment": "vramlab run", "drill": "vramlab drill", "colocation": "vramlab drill"}

# (kinds it applies to, old path, new path): the older dialects' names and where they live now.
RENAMES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("drill", "colocation"), ("stop",), ("stop_conditions",)),
    (("drill", "colocation"), ("clients",), ("load", "retry")),
    (("drill", "colocation"), ("target", "metrics_path"), ("target", "metrics_url")),
    (("experiment",), ("change", "ramp", "max"), ("change", "ramp", "ceiling")),
)


class DocumentError(ValueError):
    """A problem with the document as a whole; `at` is the path it is about."""

    def __init__(self, at: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.at = at


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def document_kind(data: dict[str, Any], accepts: tuple[str, ...]) -> str:
    """The document's kind, checked against what the command *accepts* (its first is the default
    when `kind:` is missing: a document from before `kind:` existed; a colocation: section makes a
    drill a colocation drill)."""
    kind = data.get("kind")
    if kind is None:
        return "colocation" if accepts[0] != "experiment" and "colocation" in data else accepts[0]
    if not isinstance(kind, str) or kind not in KINDS:
        raise DocumentError(("kind",), f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind not in accepts:
        article = "an" if kind[0] in "aeiou" else "a"
        raise DocumentError(
            ("kind",), f"this is {article} {kind} plan; run it with `{KINDS[kind]} PLAN.yaml`"
        )
    return str(kind)


def upgrade(data: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[str]]:
    """*data* in the one vocabulary (a copy; *data* is not changed) and one note per old name it used."""
    out = copy.deepcopy(data)
    notes: list[str] = []
    if "kind" not in out:
        notes.append(f"kind: (missing) -> kind: {kind}; a plan names its kind now")
        out = {"kind": kind, **out}
    for kinds, old, new in RENAMES:
        if kind not in kinds:
            continue
        parent = _at(out, old[:-1])
        if parent is None or old[-1] not in parent:
            continue
        value = parent.pop(old[-1])
        dest = _at(out, new[:-1], create=True)
        if dest is None:
            raise DocumentError(
                new[:-1], f"must be a mapping to hold {_dotted(new)} (the old {_dotted(old)})"
            )
        if new[-1] in dest:
            raise DocumentError(
                new, f"given twice: as {_dotted(new)} and by its old name {_dotted(old)}; keep {_dotted(new)}"
            )
        dest[new[-1]] = value
        notes.append(f"{_dotted(old)} -> {_dotted(new)} (the old name still loads; rename it)")
    return out, notes


def _at(data: dict[str, Any], path: tuple[str, ...], create: bool = False) -> dict[str, Any] | None:
    node: Any = data
    for key in path:
        if not isinstance(node, dict):
            return None
        if key not in node and create:
            node[key] = {}
        node = node.get(key)
    return node if isinstance(node, dict) else None


def stored_plan(plan: dict[str, Any], run_kind: str) -> dict[str, Any]:
    """A plan as a run stored it, in the one vocabulary: runs stored before `kind:` and the new
    names read the same as new ones. A drill run's kind is its plan's (drill or colocation)."""
    if not isinstance(plan, dict):
        return {}
    kind = plan.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        kind = ("colocation" if plan.get("colocation") else "drill") if run_kind == "drill" else "experiment"
    try:
        return upgrade(plan, str(kind))[0]
    except DocumentError:
        return plan  # a stored plan that names a field twice: read as stored


D = TypeVar("D", bound="PlanDocument")


class PlanDocument(BaseModel):
    """What every kind's plan model has: the notes its loading wrote about old names (never dumped)."""

    _old_names: tuple[str, ...] = PrivateAttr(default=())

    def old_name_notes(self) -> list[str]:
        """One line per old field name the document used ("stop -> stop_conditions ...")."""
        return list(self._old_names)

    def with_notes_of(self: D, other: PlanDocument) -> D:
        """This plan carrying *other*'s notes (a plan re-validated from the first one's dump)."""
        self._old_names = other._old_names
        return self


# ---------------------------------------------------------------------------------------------
# Sections every kind shares


class PlanSection(BaseModel):
    # frozen + forbid: a plan is a document; a typo must fail loudly, and nobody may edit it after loading.
    # allow_inf_nan=False: `.inf` or `.nan` is refused with the field's name, not run until the wall clock.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SimSettings(PlanSection):
    """`target.sim`: the rehearsal server (`vramlab sim serve`) vramlab starts for the run or drill
    and stops afterwards. An experiment fills `model` from target.model (the model its requests name)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    model: str = "llama-3.1-8b-instruct"  # the sim's own default (`vramlab sim serve --model`)
    gpu: str = "h100-80gb"
    engine: SimEngine = "vllm"  # the engines the sim plays (vramlab.engines): Ollama is refused here
    speed: float = Field(50.0, gt=0)  # simulated GPU time runs this many times faster
    seed: int = 0
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_model_len: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    watchdog_s: float | None = Field(
        None, gt=0
    )  # vLLM exits ~5 s after engine death; a rehearsal may shorten it
    device: str | None = None  # drills: the ledger file; default: one in the drill's work dir
    extra_args: list[str] = Field(default_factory=list)

    def argv(self) -> list[str]:
        out = [
            "--model",
            self.model,
            "--gpu",
            self.gpu,
            "--engine",
            self.engine,
            "--speed",
            f"{self.speed:g}",
            "--seed",
            str(self.seed),
        ]
        for flag, v in (
            ("--gpu-memory-utilization", self.gpu_memory_utilization),
            ("--max-model-len", self.max_model_len),
            ("--max-num-seqs", self.max_num_seqs),
            ("--watchdog-s", self.watchdog_s),
        ):
            if v is not None:
                out += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
        return out + list(self.extra_args)


def sim_with_model(sim: Any, model: str | None) -> Any:
    """A `target.sim` mapping with its model filled from target.model (for a validator, before parsing)."""
    if isinstance(sim, dict) and sim.get("model") is None and model is not None:
        return {**sim, "model": model}
    return sim


class CapacityFacts(PlanSection):
    """`capacity:` what the capacity model needs about a real target (a sim target knows its own):
    the card (or its memory), and the engine settings the target was started with. The model and
    the engine default to the target's (an experiment's target.kind, a drill's target.engine)."""

    gpu: str | None = Field(default=None, description="catalog card name (`vramlab gpus`)")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=1 << 20, description="usable memory per GPU")
    model: str | None = Field(
        default=None, description="catalog name, config.json or directory (default target.model)"
    )
    engine: str | None = Field(
        default=None, description="vllm, sglang, tgi, llama.cpp, transformers (default target.kind)"
    )
    engine_version: str | None = None
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="engine settings by `vramlab plan` name, e.g. max_model_len, gpu_memory_utilization",
    )


class Retry(PlanSection):
    """`load.retry`: what the load's clients do after a failed request."""

    policy: Literal["none", "immediate", "exponential"] = "none"
    max_attempts: int = Field(default=3, ge=1, le=20)
    base_s: float = Field(default=0.5, ge=0)
    max_s: float = Field(default=10.0, gt=0)
    jitter: float = Field(default=1.0, ge=0, le=1, description="fraction of each delay drawn at random")


class StopConditions(PlanSection):
    """`stop_conditions`: always armed, each checked continuously over a sliding window. A stop
    that fires is named by its field everywhere (events, findings, `--json`): p95_ms, not p95."""

    error_rate: float | None = Field(default=0.5, gt=0, le=1)
    p95_ms: float | None = Field(default=None, gt=0, description="end-to-end P95 from the scheduled send")
    kv_usage: float | None = Field(default=None, gt=0, le=1)
    gpu_memory_share: float | None = Field(default=None, gt=0, le=1)
    oom_seen: bool = True
    wall_clock_s: float | None = Field(
        default=None, gt=0, description="default: twice the planned time + 60 s"
    )
    window_s: float = Field(default=10.0, gt=0)
    min_requests: int = Field(default=10, ge=1)


class RollbackCommand(PlanSection):
    run: str = Field(min_length=1)
    timeout_s: float = Field(default=30.0, gt=0)


def rollback_strings(v: Any) -> Any:
    """`rollback:` items may be bare strings (the common case) beside {run, timeout_s}."""
    if isinstance(v, list):
        return [{"run": x} if isinstance(x, str) else x for x in v]
    return v


class RecoverySpec(BaseModel):
    """A drill's `recovery`: auto | scripted | manual, and how long to wait for it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    mode: Literal["auto", "scripted", "manual"] = "auto"
    command: str | None = None  # scripted: run after `delay_s`
    delay_s: float = Field(0.0, ge=0)  # operator delay before the scripted command
    restart_delay_s: float = Field(0.5, ge=0)  # auto: how long the supervisor waits before restarting
    liveness_grace_s: float = Field(5.0, ge=0)  # auto: health failing this long on a live process -> restart
    # auto: how long a (re)start may load before its health counts; default: from the first start's
    # measured load time (twice it, plus the grace), so a supervisor never kills a loading start
    startup_s: float | None = Field(None, ge=0)
    limit_s: float = Field(60.0, gt=0)  # not serving again within this: "not recovered"
    observe_s: float = Field(5.0, ge=0)  # after recovery: watch for a second OOM and the retry storm
    p95_tolerance: float = Field(0.5, ge=0)  # P95 back within (1 + tolerance) x baseline counts as recovered
    undo_ramp: bool = True  # recover at the baseline load; false keeps the failing step's load on

    @model_validator(mode="after")
    def _check(self) -> RecoverySpec:
        if self.mode == "scripted" and not self.command:
            raise ValueError("recovery.mode scripted needs recovery.command")
        return self


def metrics_endpoint(metrics_url: str | None, root: str) -> str:
    """`target.metrics_url` resolved: a full URL as given, a path on the target's *root*, default /metrics."""
    if metrics_url and "://" in metrics_url:
        return metrics_url
    return root.rstrip("/") + (metrics_url or "/metrics")


__all__ = [
    "CapacityFacts",
    "KINDS",
    "RENAMES",
    "DocumentError",
    "Kind",
    "PlanDocument",
    "RecoverySpec",
    "Retry",
    "PlanSection",
    "RollbackCommand",
    "SimSettings",
    "StopConditions",
    "document_kind",
    "metrics_endpoint",
    "rollback_strings",
    "sim_with_model",
    "stored_plan",
    "upgrade",
]
