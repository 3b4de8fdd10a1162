"""The plan travels with the run: the capacity model's estimate for the target's own settings,
computed once the target is up, by the runner for every kind of run (run/runner.py), and the
start-up memory the target's log printed, both stored as events so every report can set predicted
beside measured. A kind says what it knows about its target (``RunKind.capacity_facts``, through
``target_facts``: one reading of `target.sim` for experiments and drills alike).

What the estimate needs is the model, the engine and the card (or its memory). A sim target knows
all three; a real target names them in the plan's `capacity:` block (and `target.kind`). Where one
is missing, one note says which and how to give it; the run goes on without a plan.

The events (their `data` is the JSON contract in docs/store-and-reports.md):
- ``capacity_plan``: ``{facts: {model, engine, gpu, gpu_memory_gib, settings}, estimate: <plan --json>}``
- ``startup_memory``: ``{source, observation}``: check-log's parse of the target's start-up log
- ``note`` with ``{by: "capacity plan"}``: why there is no plan (`records.capacity_plan` reads all three)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from vramlab.engines import served_engines
from vramlab.plandoc import CapacityFacts, SimSettings
from vramlab.records import emit as E
from vramlab.records.capacity_plan import CAPACITY_PLAN_NOTE, PlanFactsRecord
from vramlab.records.emit import Draft

if TYPE_CHECKING:
    from vramlab.capacity.gpus import GPU
    from vramlab.capacity.settings import EngineSettings
    from vramlab.capacity.spec import ModelSpec


@dataclass(frozen=True)
class PlanFacts:
    """What the capacity model needs about a target, and where its start-up log is."""

    model: str | None
    engine: str | None
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    engine_version: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    log_file: str | None = None
    where: str = "capacity"  # the plan block a user fills in (named in the notes)

    def missing(self) -> str | None:
        """One sentence: the first fact the plan cannot be made without, and how to give it."""
        if not self.model:
            return (
                f"the model is not known; give {self.where}.model (a catalog name, config.json or directory)"
            )
        planned = served_engines()
        if self.engine not in planned:
            got = f" (target kind {self.engine!r})" if self.engine else ""
            return f"the engine is not known{got}; give {self.where}.engine (one of {', '.join(planned)})"
        if not self.gpu and not self.gpu_memory_gib:
            return (
                f"the card is not known; give {self.where}.gpu (a catalog name, see `vramlab gpus`) or "
                f"{self.where}.gpu_memory_gib in the plan, or --gpu / --gpu-memory-gib"
            )
        return None

    def record(self) -> PlanFactsRecord:
        """The facts as stored with the plan (`capacity_plan` event's ``facts``)."""
        return PlanFactsRecord(
            self.model, self.engine, self.gpu, self.gpu_memory_gib, self.engine_version, self.settings
        )

    def with_card(self, gpu: str | None, gpu_memory_gib: float | None) -> PlanFacts:
        """The card `--gpu` / `--gpu-memory-gib` name, where the plan names none."""
        return replace(self, gpu=self.gpu or gpu, gpu_memory_gib=self.gpu_memory_gib or gpu_memory_gib)


def target_facts(
    model: str | None,
    engine: str | None,
    sim: SimSettings | None,
    capacity: CapacityFacts | None,
    log_file: str | None,
) -> PlanFacts:
    """A target's facts, for every kind of run: its sim's settings when vramlab starts the sim
    (sim_settings, the one reading of `target.sim`), else the plan's `capacity:` block over the
    target's model and engine."""
    if sim is not None:
        settings = sim_settings(sim)
        version = settings.pop("engine_version", None)
        return PlanFacts(sim.model, sim.engine, sim.gpu, None, version, settings, log_file)
    if capacity is None:
        return PlanFacts(model, engine, log_file=log_file)
    return PlanFacts(
        capacity.model or model,
        capacity.engine or engine,
        capacity.gpu,
        capacity.gpu_memory_gib,
        capacity.engine_version,
        dict(capacity.settings),
        log_file,
    )


# The `vramlab sim serve` flags among `target.sim.extra_args` that are engine settings, in the
# engine's own names (`vramlab sim serve` takes vLLM's and SGLang's: cli/sim.py), by their `vramlab
# plan` names: the same settings the sim sizes its memory with, so the stored plan is the sim's own.
_SIM_FLAGS = {
    "--max-num-batched-tokens": ("max_num_batched_tokens", int),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-running-requests": ("max_num_seqs", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--mem-fraction-static": ("mem_fraction_static", float),
    "--max-model-len": ("max_model_len", int),
    "--context-length": ("max_model_len", int),
    "--tp-size": ("tensor_parallel_size", int),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--engine-version": ("engine_version", str),
    "-tp": ("tensor_parallel_size", int),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
}


def sim_settings(sim: SimSettings) -> dict[str, Any]:
    """The engine settings a `target.sim` starts its sim with (by `vramlab plan` name; its
    `--engine-version` as ``engine_version``), for an experiment's sim and a drill's alike."""
    out: dict[str, Any] = {
        k: v
        for k, v in (
            ("gpu_memory_utilization", sim.gpu_memory_utilization),
            ("max_model_len", sim.max_model_len),
            ("max_num_seqs", sim.max_num_seqs),
        )
        if v is not None
    }
    args = sim.extra_args
    for flag, value in zip(args, args[1:], strict=False):
        if flag in _SIM_FLAGS:
            name, kind = _SIM_FLAGS[flag]
            try:
                out[name] = kind(value)
            except ValueError:  # the sim refuses it too: say so before anything starts
                from vramlab.errors import ConfigError

                want = "a whole number" if kind is int else "a number"
                raise ConfigError(f"target.sim.extra_args: {flag} {value!r} is not {want}") from None
    return out


def resolve_facts(facts: PlanFacts) -> tuple[ModelSpec, GPU, EngineSettings]:
    """(ModelSpec, GPU, EngineSettings) for these facts (ConfigError when a fact is refused)."""
    from vramlab.capacity import custom_gpu, get_gpu
    from vramlab.capacity.gpus import HOST_NAMES, host_device
    from vramlab.capacity.settings import EngineSettings
    from vramlab.capacity.validation import check_settings
    from vramlab.errors import ConfigError
    from vramlab.sources import resolve_model
    from vramlab.sources.host import host_memory_gib

    known = set(EngineSettings.__dataclass_fields__) - {"engine", "engine_version"}
    bad = sorted(set(facts.settings) - known)
    if bad:
        raise ConfigError(
            f"{facts.where}.settings: unknown setting(s) {', '.join(bad)} (use the names of "
            "`vramlab plan`'s options with underscores, e.g. max_model_len)"
        )
    settings = check_settings(
        EngineSettings(engine=facts.engine or "vllm", engine_version=facts.engine_version, **facts.settings)
    )
    if facts.gpu and facts.gpu.strip().lower() in HOST_NAMES:  # a CPU engine: gpu_memory_gib is the host's
        card = host_device(facts.gpu_memory_gib or host_memory_gib() or 0.0)
    elif facts.gpu and facts.gpu_memory_gib:
        card = custom_gpu(facts.gpu_memory_gib, like=get_gpu(facts.gpu))
    elif facts.gpu:
        card = get_gpu(facts.gpu)
    else:
        card = custom_gpu(float(facts.gpu_memory_gib or 0))
    if facts.model is None:
        raise ConfigError("no model")
    return resolve_model(facts.model, offline=True), card, settings


def estimate_json(facts: PlanFacts, calibration: str | None = None) -> dict[str, Any]:
    """`vramlab plan --json` for these facts (ConfigError when a fact is refused)."""
    from vramlab.capacity.planning import make_plan

    spec, card, settings = resolve_facts(facts)
    constants = None
    if calibration:
        from vramlab.capacity import Constants
        from vramlab.capacity.calibration import apply_profile
        from vramlab.sources.profile import load_profile

        constants = apply_profile(
            Constants.defaults(), load_profile(calibration), settings.engine, facts.engine_version
        )
    return make_plan(spec, card, settings, constants).to_json()


def start_events(facts: PlanFacts) -> list[Draft]:
    """The capacity plan (or one note why not) and the start-up log's memory lines (when readable)."""
    from vramlab.errors import VramlabError

    out: list[Draft] = []
    why = facts.missing()
    if why is not None:
        out.append(E.NOTE(f"capacity plan: not computed: {why}", {"by": CAPACITY_PLAN_NOTE}))
    else:
        try:
            est = estimate_json(facts)
        except (VramlabError, ImportError, NotImplementedError) as exc:
            out.append(E.NOTE(f"capacity plan: not computed: {exc}"[:300], {"by": CAPACITY_PLAN_NOTE}))
        else:
            from vramlab.units import size

            out.append(
                E.CAPACITY_PLAN(
                    f"capacity plan for {est['model']} on {est['gpu']} ({est['engine']} {est['engine_version']}): "
                    f"weights {size(est['weights_bytes'])}, KV pool {size(est['kv_cache_bytes'])}, "
                    f"{size(est['used_bytes'])} in use at the peak (GiB = 2^30 bytes)",
                    {"facts": facts.record().to_json(), "estimate": est},
                )
            )
    out.extend(startup_events(facts.log_file, facts.engine))
    return out


def startup_events(log_file: str | None, engine: str | None = None) -> list[Draft]:
    """check-log's parser on the target's start-up log: the last complete start-up's figures."""
    if not log_file:
        return []
    from vramlab.errors import VramlabError
    from vramlab.logs.detect import PARSERS, parse_log

    try:
        parsed = parse_log(log_file, engine if engine in PARSERS else None)
    except VramlabError as exc:
        return [E.NOTE(f"start-up log {log_file}: no memory figures read ({exc})"[:300])]
    obs = [o for o in parsed.observations if o.rank in (None, 0)] or list(parsed.observations)
    if not obs and parsed.engine == "transformers":  # from_pretrained, then a cache per request
        return [
            E.NOTE(
                f"start-up log {log_file} (transformers): no memory figure printed; transformers serve "
                "sizes no KV cache at start-up"
            )
        ]
    if not obs:
        return [E.NOTE(f"start-up log {log_file}: no complete start-up yet (no KV cache line)")]
    last = max(obs, key=lambda o: o.startup or 0)
    data = last.model_dump(mode="json", exclude={"source_lines", "notes"})
    from vramlab.units import size

    parts = [
        f"{label} {size(getattr(last, k))}"
        for k, label in (("weights_bytes", "weights"), ("kv_cache_bytes", "KV cache"))
        if getattr(last, k) is not None
    ]
    if last.kv_cache_tokens is not None:
        parts.append(f"{last.kv_cache_tokens:,} KV tokens")
    return [
        E.STARTUP_MEMORY(
            f"start-up log ({parsed.engine}): " + (", ".join(parts) or "no memory figure"),
            {"source": f"start-up log {log_file}", "observation": data},
        )
    ]
