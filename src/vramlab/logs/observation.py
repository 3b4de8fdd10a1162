"""One measured start-up of a serving engine, and the JSONL file that holds many of them.

Field names are those of `vramlab plan --json` (`weights_bytes`, `kv_cache_bytes`, ...), per
GPU, bytes as integers. A parser fills what the log printed and leaves the rest `None`;
nothing is filled in from defaults. Users can write their own lines (see
docs/logs-and-calibration.md); experiments append theirs with `append_observations`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vramlab.errors import ConfigError
from vramlab.units import GIB

# The settings keys an observation may carry: `EngineSettings` field names.
SETTINGS_KEYS = (
    "engine_version",
    "vllm_engine",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "enforce_eager",
    "block_size",
    "kv_cache_memory_bytes",
    "num_gpu_blocks_override",
    "mem_fraction_static",
    "chunked_prefill_size",
    "cuda_graph_max_bs",
    "max_batch_prefill_tokens",
    "ctx_size",
    "parallel",
    "n_ubatch",
    "flash_attn",
    "api_server",
    "flashinfer_sampler",
    "gpu_p2p",
    "limit_mm_per_prompt",
    "split_mode",
    "main_gpu",
    "n_cpu_moe",
    "cache_type_v",
    "no_kv_offload",
    "mmap",
)

# Component fields compared with a prediction, in the order the tables print them.
COMPONENT_FIELDS = (
    "weights_bytes",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "max_concurrency",
)


class SourceLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    line: int = Field(description="1-based line number in the source file (0 when not known)")
    text: str


class Observation(BaseModel):
    """What one engine start-up decided, per GPU (one per TP rank when the log shows several)."""

    model_config = ConfigDict(extra="forbid")

    engine: str
    engine_version: str | None = None
    model: str | None = None
    gpu: str | None = None
    rank: int | None = None
    startup: int | None = None  # which start-up of the log (0, 1, ...): a restart is a new one
    basis: Literal["measured", "engine-estimate"] = "measured"
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None  # SGLang: K plus V
    kv_cache_tokens: int | None = None
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None  # vLLM V1: the non-torch increase during profiling
    init_non_torch_bytes: int | None = None  # vLLM V1: CUDA context (+ NCCL) before profiling
    cuda_graph_bytes: int | None = None
    cuda_graph_estimate_bytes: int | None = None
    non_kv_cache_bytes: int | None = None  # vLLM V1 'Total non KV cache memory'
    gpu_blocks: int | None = None
    block_size: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None
    total_gpu_memory_bytes: int | None = None
    free_gpu_memory_bytes: int | None = None  # free on the device before the engine loaded
    budget_bytes: int | None = None  # what the engine allowed itself (total x utilization)
    gpu_memory_utilization: float | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None  # file path, URL or dataset row the figures come from
    source_lines: list[SourceLine] = Field(default_factory=list)
    complete: bool = True  # False when the log ends before the engine sized its KV cache
    notes: list[str] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)

    def measured(self) -> dict[str, float]:
        """The component figures this observation has, by plan-JSON field name."""
        return {k: getattr(self, k) for k in COMPONENT_FIELDS if getattr(self, k) is not None}


def read_observations(path: str | Path) -> list[Observation]:
    """Read a JSONL file: one observation per line; blank lines and '#' comments are skipped.

    A line in the shape of vramlab's own data set (`observed_memory.jsonl`, GiB fields) is
    converted. A bad line stops with its line number: a silently dropped measurement would
    bias a calibration.
    """
    from vramlab.infile import DATA_BYTES, read_text

    p = Path(path)
    text = read_text(p, "measurement", DATA_BYTES, expect="expected JSON lines of observations")
    out: list[Observation] = []
    for i, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            data = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}:{i}: expected a JSON object")
        try:
            obs = (
                from_dataset_row(data)
                if "row_id" in data and "weights_gib" in data
                else Observation.model_validate(data)
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"{p}:{i}: {where}: {first['msg']}") from None
        if obs.source is None:
            obs = obs.model_copy(update={"source": f"{p}:{i}"})
        out.append(obs)
    return out


def dump_observation(obs: Observation) -> str:
    return json.dumps(obs.model_dump(mode="json", exclude_defaults=True), sort_keys=False)


def write_observations(path: str | Path, observations: Iterable[Observation]) -> int:
    """Write (replace) a JSONL file. Returns the number of lines written."""
    lines = [dump_observation(o) for o in observations]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def append_observations(path: str | Path, observations: Iterable[Observation]) -> int:
    """Append to a JSONL file (experiments add their measurements this way)."""
    n = 0
    with open(path, "a", encoding="utf-8") as fh:
        for o in observations:
            fh.write(dump_observation(o) + "\n")
            n += 1
    return n


def _g(row: dict[str, Any], key: str) -> int | None:
    v = row.get(key)
    return None if v is None else int(round(float(v) * GIB))


_RELEASE = re.compile(r"(?<![\w.])[vb]?[0-9]+\.[0-9][0-9a-z.+]*|(?<![\w.])b[0-9]{3,}(?![0-9a-z])")


def from_dataset_row(row: dict[str, Any]) -> Observation:
    """A row of `benchmarks/data/observed_memory.jsonl` (GiB as printed) as an Observation."""
    extra = dict(row.get("extra") or {})
    version = row.get("engine_version") or None
    era = None
    if version and ("(" in version or version.startswith("[")):
        # '0.8.5.post1 (V0 engine)', or a bracketed note when the log did not print it:
        # "[V0 engine, ~0.7.3: 'worker.py:267' ...; not printed]" -> 0.7.3, V0 (as benchmarks/accuracy.py reads it)
        era = "v0" if "V0" in version else "v1" if "V1" in version else None
        first = _RELEASE.search(version)
        version = first.group(0) if first else None
    settings: dict[str, Any] = {}
    for src, dst in (
        ("tensor_parallel", "tensor_parallel_size"),
        ("pipeline_parallel", "pipeline_parallel_size"),
        ("max_model_len", "max_model_len"),
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("enforce_eager", "enforce_eager"),
        ("block_size", "block_size"),
        ("kv_cache_dtype", "kv_cache_dtype"),
        ("quantization", "quantization"),
        ("gpu_memory_utilization", "gpu_memory_utilization"),
    ):
        if row.get(src) is not None:
            settings[dst] = row[src]
    if row.get("dtype"):
        settings["dtype"] = str(row["dtype"]).replace("torch.", "")
    if era:
        settings["vllm_engine"] = era
    if str(row.get("collection_group", "")).startswith("unsloth"):
        settings["api_server"] = False  # vLLM's LLM class inside a trainer, not `vllm serve`
    exact_util = extra.get("unsloth_actual_gpu_utilization_pct")
    if exact_util is not None:  # V0 prints util to 2 d.p.; Unsloth logged the exact value
        settings["gpu_memory_utilization"] = round(float(exact_util) / 100, 6)
    if row.get("engine") == "sglang" and row.get("gpu_memory_utilization") is not None:
        settings.pop("gpu_memory_utilization")
        settings["mem_fraction_static"] = row["gpu_memory_utilization"]
    lines = [SourceLine(line=0, text=t) for t in row.get("raw_log_lines") or []]
    weights = _g(row, "weights_gib")
    if weights is None and row.get("weights_load_line") is not None:
        weights = _g(row, "weights_load_line")
    return Observation(
        engine=row.get("engine") or "vllm",
        engine_version=version,
        model=row.get("model_hf_id") or row.get("model"),
        gpu=row.get("gpu_model"),
        weights_bytes=weights,
        kv_cache_bytes=_g(row, "kv_cache_gib"),
        kv_cache_tokens=row.get("kv_cache_tokens"),
        activation_peak_bytes=_g(row, "activation_peak_gib"),
        non_torch_bytes=_g(row, "non_torch_gib"),
        init_non_torch_bytes=_g(extra, "init_non_torch_gib"),
        cuda_graph_bytes=_g(row, "cuda_graph_gib"),
        cuda_graph_estimate_bytes=_g(extra, "cuda_graph_estimated_gib"),
        non_kv_cache_bytes=_g(extra, "total_non_kv_gib"),
        gpu_blocks=row.get("gpu_blocks"),
        block_size=row.get("block_size"),
        max_concurrency=row.get("max_concurrency"),
        max_model_len=row.get("max_model_len") or row.get("max_concurrency_tokens_per_request"),
        total_gpu_memory_bytes=_g(row, "total_gpu_memory_gib"),
        gpu_memory_utilization=settings.get("gpu_memory_utilization"),
        settings=settings,
        source=f"{row.get('row_id')}: {row.get('source')}",
        source_lines=lines,
        notes=[row["note"]] if row.get("note") else [],
        extra={"row_id": row.get("row_id"), "collection_group": row.get("collection_group")},
    )
