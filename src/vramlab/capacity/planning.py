"""What `vramlab plan` answers, as plain functions: one plan, and sweeps over settings."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, fields
from typing import Any

from vramlab.capacity.constants import Constants
from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import GPU
from vramlab.capacity.model import estimate, max_len_that_fits, safe_at_planned_length, safe_operating_point
from vramlab.capacity.prefix import PrefixSharing, prefix_sharing
from vramlab.capacity.settings import EngineSettings
from vramlab.capacity.spec import ModelSpec
from vramlab.capacity.validation import check_settings
from vramlab.capacity.verdict import Verdict, decide, host_share, safe_holds
from vramlab.errors import ConfigError, VramlabError

# --sweep keys (engine flag spelling) -> EngineSettings fields.
SWEEP_KEYS = {
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "tensor-parallel-size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "pp": "pipeline_parallel_size",
    "kv-cache-dtype": "kv_cache_dtype",
    "quantization": "quantization",
    "dtype": "dtype",
    "block-size": "block_size",
    "mem-fraction-static": "mem_fraction_static",
    "ctx-size": "ctx_size",
    "parallel": "parallel",
    "max-batch-prefill-tokens": "max_batch_prefill_tokens",
    "n-gpu-layers": "n_gpu_layers",  # llama.cpp -ngl / Ollama num_gpu
    "ngl": "n_gpu_layers",
    "n-cpu-moe": "n_cpu_moe",
    "engine-version": "engine_version",  # each row after the first names the release rules that changed
}
_INT_FIELDS = {f.name for f in fields(EngineSettings) if f.type in ("int", "int | None")}
_FLOAT_FIELDS = {"gpu_memory_utilization", "mem_fraction_static"}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*$")
_BYTES = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(b|kb|kib|mb|mib|gb|gib|tb|tib)?\s*$", re.IGNORECASE)


MAX_COUNT = 1 << 40  # tokens or sequences far beyond any engine's; larger is a typo


def parse_count(text: str) -> int:
    """'8192', '8k' (8192), '128K' (131072), '1m' (1048576): token counts as engines write them."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"not a count: {text!r} (examples: 8192, 8k, 128k)")
    value, unit = float(m.group(1)), m.group(2).lower()
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[unit]
    if not value * scale <= MAX_COUNT:  # also a 400-digit number, whose float is inf
        raise ConfigError(
            f"not a count vramlab plans: {text[:20]!r}{'...' if len(text) > 20 else ''} (at most 2^40)"
        )
    return int(value * scale)


def parse_bytes(text: str) -> int:
    """'20GiB', '20 GB', '512MiB', '1073741824' -> bytes (GB and GiB both mean 2^30, as vLLM reads them)."""
    m = _BYTES.match(str(text))
    if not m:
        raise ConfigError(f"not a size: {text!r} (examples: 20GiB, 512MiB, 1073741824)")
    unit = (m.group(2) or "b").lower()
    scale = {
        "b": 1,
        "kb": 1 << 10,
        "kib": 1 << 10,
        "mb": 1 << 20,
        "mib": 1 << 20,
        "gb": 1 << 30,
        "gib": 1 << 30,
        "tb": 1 << 40,
        "tib": 1 << 40,
    }[unit]
    return int(float(m.group(1)) * scale)


MM_MODALITIES = ("image", "video", "audio")


def parse_mm_limits(text: str) -> tuple[tuple[str, int], ...]:
    """vLLM's --limit-mm-per-prompt: JSON ('{"image": 2, "video": 0}') or 'image=2,video=0'."""
    import json

    raw = str(text).strip()
    pairs: list[tuple[str, object]]
    if raw.startswith("{"):
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'--limit-mm-per-prompt: not JSON: {exc.msg} (example: \'{{"image": 2, "video": 0}}\')'
            ) from None
        if not isinstance(loaded, dict):
            raise ConfigError("--limit-mm-per-prompt: expected an object of modality: count")
        pairs = list(loaded.items())
    else:
        pairs = []
        for part in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, text = part.partition("=")
            if not sep:
                raise ConfigError(
                    f"--limit-mm-per-prompt: expected MODALITY=COUNT, got {part!r} (example: image=2,video=0)"
                )
            pairs.append((key.strip(), text.strip()))
    out: dict[str, int] = {}
    for key, given in pairs:
        value: object = given
        if key not in MM_MODALITIES:
            raise ConfigError(f"--limit-mm-per-prompt: unknown modality {key!r} (image, video, audio)")
        if isinstance(given, dict):  # 0.11+ also takes {"video": {"count": 1, "num_frames": 32}}
            value = given.get("count", 1)
        try:
            count = int(str(value))
        except ValueError:
            raise ConfigError(f"--limit-mm-per-prompt: {key}: not a whole number: {value!r}") from None
        if count < 0:
            raise ConfigError(f"--limit-mm-per-prompt: {key}: must be >= 0, got {count}")
        out[key] = count
    if not out:
        raise ConfigError("--limit-mm-per-prompt: no modality given (example: image=2,video=0)")
    return tuple(sorted(out.items()))


def parse_value(field_name: str, text: str) -> Any:
    if field_name in _FLOAT_FIELDS:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{field_name}: not a number: {text!r}") from None
    if field_name in _INT_FIELDS:
        return parse_count(text)
    return text


def parse_sweep(spec: str) -> tuple[str, list[Any]]:
    """'max-model-len=2k,8k,32k' -> ('max_model_len', [2048, 8192, 32768])."""
    if "=" not in spec:
        raise ConfigError(f"--sweep {spec!r}: expected KEY=V1,V2,... (keys: {', '.join(sorted(SWEEP_KEYS))})")
    key, values = spec.split("=", 1)
    key = key.strip().lstrip("-").replace("_", "-")
    if key not in SWEEP_KEYS:
        from vramlab.errors import near_matches

        hint = near_matches(key, list(SWEEP_KEYS))
        raise ConfigError(
            f"--sweep: unknown key {key!r}" + (f"; did you mean {', '.join(hint)}?" if hint else "")
        )
    name = SWEEP_KEYS[key]
    items = [v for v in values.split(",") if v.strip()]
    if not items:
        raise ConfigError(f"--sweep {key}: no values")
    return name, [parse_value(name, v.strip()) for v in items]


@dataclass(frozen=True)
class Plan:
    estimate: Estimate
    safe: dict[str, Any]
    verdict: Verdict
    max_model_len_at_concurrency: int | None = None
    concurrency: int | None = None
    calibration: str | None = None
    prefix: PrefixSharing | None = None  # --prefix-shared-tokens: the users a shared prefix adds

    def to_json(self) -> dict[str, Any]:
        out = self.estimate.to_json()
        out["verdict"] = self.verdict.kind
        out["verdict_detail"] = self.verdict.to_json()
        out["safe_operating_point"] = self.safe
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
            out["max_model_len_at_concurrency"] = self.max_model_len_at_concurrency
        if self.prefix is not None:
            out["prefix_sharing"] = self.prefix.to_json()
        out["calibration"] = self.calibration
        return out


def make_plan(
    model: ModelSpec,
    gpu: GPU,
    settings: EngineSettings,
    constants: Constants | None = None,
    margin: float = 0.10,
    concurrency: int | None = None,
    prefix_shared_tokens: int | None = None,
    request_tokens: int | None = None,
) -> Plan:
    est = estimate(model, gpu, settings, constants)
    safe = safe_operating_point(model, gpu, settings, constants, margin, concurrency)
    host = host_share(est, settings, model.num_experts, model.num_experts_per_tok)
    changes: tuple[str, ...] = ()
    if est.fits and host is None and not safe_holds(est, safe):
        from vramlab.capacity.suggestions import safe_suggestions

        changes = tuple(safe_suggestions(model, gpu, settings, constants, est, margin))
    longest = None
    if concurrency is not None:
        if concurrency < 1:
            raise ConfigError(f"--concurrency must be at least 1, got {concurrency}")
        longest = max_len_that_fits(model, gpu, settings, constants, concurrency)
    prefix = None
    if prefix_shared_tokens is not None:
        if prefix_shared_tokens < 0 or (request_tokens is not None and request_tokens < 1):
            raise ConfigError("--prefix-shared-tokens must be >= 0 and --request-tokens at least 1")
        prefix = prefix_sharing(est, prefix_shared_tokens, request_tokens)
    return Plan(
        est,
        safe,
        decide(est, safe, host, changes),
        longest,
        concurrency,
        constants.profile if constants and constants.profile != "defaults" else None,
        prefix,
    )


@dataclass
class SweepResult:
    axes: list[tuple[str, list[Any]]]
    rows: list[dict[str, Any]] = field(default_factory=list)


def sweep(
    model: ModelSpec,
    gpu: GPU,
    base: EngineSettings,
    axes: list[tuple[str, list[Any]]],
    constants: Constants | None = None,
) -> SweepResult:
    """Every combination of the axes; a combination the engine would refuse is a row with its error."""
    names = [name for name, _ in axes]
    if len(set(names)) != len(names):
        raise ConfigError("--sweep: each key may be swept once")
    for name, values in axes:  # a value no engine would take is bad input, not a row that does not fit
        for value in values:
            check_settings(base.with_(**{name: value}))
    out = SweepResult(axes)
    for combo in itertools.product(*(values for _, values in axes)):
        point = dict(zip(names, combo, strict=True))
        row: dict[str, Any] = dict(point)
        try:
            est = estimate(model, gpu, base.with_(**point), constants, with_suggestions=False)
        except VramlabError as exc:
            row.update(fits=False, verdict="does_not_fit", error=str(exc))
            out.rows.append(row)
            continue
        host = host_share(est, base.with_(**point), model.num_experts, model.num_experts_per_tok)
        safe = safe_at_planned_length(model, gpu, base.with_(**point), constants) if est.fits else {}
        row.update(
            verdict=decide(est, safe or {"margin": 0.10, "max_concurrency": 0}, host).kind,
            kv_cache_bytes=est.kv_cache_bytes,
            kv_cache_tokens=est.kv_cache_tokens,
            max_concurrency=round(est.max_concurrency, 2),
            headroom_bytes=est.headroom_bytes,
            weights_bytes=est.weights_bytes,
            fits=est.fits,
            error=est.reasons[0] if est.reasons else None,
        )
        out.rows.append(row)
    if "engine_version" in names:
        annotate_release_rules(out, base.engine)
    return out


def annotate_release_rules(result: SweepResult, engine: str) -> None:
    """Each row of a sweep over engine-version gets `rules_changed`: the release rules (capacity/rules.py) that
    differ from the row of the previous release with the same other settings."""
    from vramlab.capacity.rules import crossed

    names = [name for name, _ in result.axes]
    versions = dict(result.axes)["engine_version"]
    index = {tuple(row[n] for n in names): row for row in result.rows}
    for row in result.rows:
        position = versions.index(row["engine_version"])
        if position == 0:
            continue
        before = tuple(versions[position - 1] if n == "engine_version" else row[n] for n in names)
        previous = index[before]["engine_version"]
        row["rules_changed"] = [
            rule.name for rule in crossed(engine, str(previous), str(row["engine_version"]))
        ]
