"""The one registry of inference engines: what vramlab knows about each engine it names.

Every list of engine names in vramlab is read from here: plan validation (`target.sim.engine`, an
experiment's `target.kind`, a fleet's `engine`), the sim, `vramlab plan` and the run's capacity
plan, check-log, the alert rules and the reports. An engine absent here is unknown everywhere; a
capability it lacks (the sim cannot play Ollama) is refused where the plan is validated.

Per engine:
- ``label``: how its own project writes its name (in sentences, tables and eras);
- ``aliases``: other spellings a user or a log may give (check-log's ``--engine``);
- ``default_port``: where its server listens unless told otherwise (vLLM `vllm serve --port`,
  8000: vllm/entrypoints/openai/cli_args.py; SGLang `--port`, 30000: sglang/srt/server_args.py;
  TGI `text-generation-launcher --port`, 3000: its basic_tutorials/launcher.md; llama.cpp
  `llama-server --port`, 8080: tools/server/README.md; Ollama 11434: envconfig's OLLAMA_HOST
  default; transformers `transformers serve --port`, 8000: commands/serving.py);
- ``log_parser``: the `vramlab.logs` module that reads its start-up log;
- ``metrics``: its Prometheus names for the signals the samplers read, by vramlab's name for the
  signal (observe/prom_text.py; the sources are listed there), first spelling first;
- ``sim``: `vramlab sim` can play it (the sim's engines have their own log texts, metric names
  and failure wordings);
- ``plan_policy``: the `vramlab.capacity.engines` module that plans its memory (`vramlab plan`);
  ``host_policy``: the one that plans its CPU build on the host (`--gpu cpu`), where it has one;
- ``serve_command``: how one instance is started for one model (`vramlab pack`'s commands). An
  engine without one (Ollama: one daemon loads and unloads models per request, sized by the
  request's and the Modelfile's options) gets no capacity plan from a run's target settings and
  is not packed.

Pure: no vramlab import, no I/O, so every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

# The names a plan may give (pydantic and mypy check these two Literals; the registry below
# holds one entry per name, and the import-time check keeps the three the same).
EngineName = Literal["vllm", "sglang", "tgi", "llama.cpp", "transformers", "ollama"]
SimEngine = Literal["vllm", "sglang", "tgi", "llama.cpp"]


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    default_port: int
    log_parser: str
    plan_policy: str
    aliases: tuple[str, ...] = ()
    metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sim: bool = False
    serve_command: str | None = None
    host_policy: str | None = None


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "vllm",
            "vLLM",
            8000,
            "vramlab.logs.vllm",
            "vramlab.capacity.engines.vllm_auto",  # vllm.py's policy, with --max-model-len auto
            metrics={
                "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                "num_requests_running": ("vllm:num_requests_running",),
                "num_requests_waiting": ("vllm:num_requests_waiting",),
                "num_preemptions_total": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
                "prompt_tokens_total": ("vllm:prompt_tokens",),
                "generation_tokens_total": ("vllm:generation_tokens",),
                # the prefix cache in tokens: vLLM V1's counters (renamed from gpu_prefix_cache_* in
                # 0.9, vllm/v1/metrics/loggers.py); V0's block hit rate
                "prefix_cache_queries_total": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
                "prefix_cache_hits_total": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
                "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
            },
            sim=True,
            serve_command="vllm serve",
            host_policy="vramlab.capacity.engines.vllm_cpu",
        ),
        Engine(
            "sglang",
            "SGLang",
            30000,
            "vramlab.logs.sglang",
            "vramlab.capacity.engines.sglang",
            metrics={
                "kv_cache_usage_perc": ("sglang:token_usage",),
                "num_requests_running": ("sglang:num_running_reqs",),
                "num_requests_waiting": ("sglang:num_queue_reqs",),
                "prompt_tokens_total": ("sglang:prompt_tokens",),
                "generation_tokens_total": ("sglang:generation_tokens",),
                "kv_cache_tokens": ("sglang:num_used_tokens",),
                "kv_cache_pool_tokens": ("sglang:max_total_num_tokens",),
                # the radix cache's hit rate (sglang/srt/metrics/collector.py)
                "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
            },
            sim=True,
            serve_command="python -m sglang.launch_server --model-path",
        ),
        Engine(
            "tgi",
            "TGI",
            3000,
            "vramlab.logs.tgi",
            "vramlab.capacity.engines.tgi",
            aliases=("text-generation-inference",),
            metrics={
                "num_requests_running": ("tgi_batch_current_size",),
                "num_requests_waiting": ("tgi_queue_size",),
                "request_failures_total": ("tgi_request_failure",),
            },
            sim=True,
            serve_command="text-generation-launcher --model-id",
        ),
        Engine(
            "llama.cpp",
            "llama.cpp",
            8080,
            "vramlab.logs.llamacpp",
            "vramlab.capacity.engines.llamacpp",
            aliases=("llamacpp", "llama-cpp"),
            metrics={
                "kv_cache_usage_perc": ("llamacpp:kv_cache_usage_ratio",),
                "num_requests_running": ("llamacpp:requests_processing",),
                "num_requests_waiting": ("llamacpp:requests_deferred",),
                "prompt_tokens_total": ("llamacpp:prompt_tokens",),
                "generation_tokens_total": ("llamacpp:tokens_predicted",),
                "kv_cache_tokens": ("llamacpp:kv_cache_tokens",),
            },
            sim=True,
            serve_command="llama-server -m",
            host_policy="vramlab.capacity.engines.llamacpp_cpu",
        ),
        Engine(
            "transformers",
            "transformers",
            8000,
            "vramlab.logs.transformers",
            "vramlab.capacity.engines.transformers",
            aliases=("transformers-serve", "hf-transformers"),
            serve_command="transformers serve",  # 5.x: no `python -m transformers`
            host_policy="vramlab.capacity.engines.transformers",
        ),
        Engine("ollama", "Ollama", 11434, "vramlab.logs.ollama", "vramlab.capacity.engines.ollama"),
    )
}

if set(get_args(EngineName)) != set(ENGINES) or set(get_args(SimEngine)) != {
    e.name for e in ENGINES.values() if e.sim
}:  # pragma: no cover - a registry edited without its Literals
    raise AssertionError("vramlab.engines: EngineName / SimEngine differ from the registry's entries")


def names() -> tuple[str, ...]:
    """Every engine, in the registry's order."""
    return tuple(ENGINES)


def sim_engines() -> tuple[str, ...]:
    """The engines `vramlab sim` can play."""
    return tuple(e.name for e in ENGINES.values() if e.sim)


def served_engines() -> tuple[str, ...]:
    """The engines started one instance per model (a run's capacity plan, `vramlab pack`)."""
    return tuple(e.name for e in ENGINES.values() if e.serve_command is not None)


def canonical(name: str) -> str | None:
    """The registry's name for *name* or one of its aliases (any case); None when unknown."""
    key = name.strip().lower()
    for e in ENGINES.values():
        if key == e.name or key in e.aliases:
            return e.name
    return None


def label(name: str) -> str:
    """How the engine's project writes its name; an unknown name as given."""
    e = ENGINES.get(name)
    return e.label if e is not None else name


def aliases() -> dict[str, str]:
    """Every alias, to the engine it names."""
    return {a: e.name for e in ENGINES.values() for a in e.aliases}


__all__ = [
    "ENGINES",
    "Engine",
    "EngineName",
    "SimEngine",
    "aliases",
    "canonical",
    "label",
    "names",
    "served_engines",
    "sim_engines",
]
