#!/usr/bin/env python3
"""Score the capacity model on real start-up measurements, beside two baselines.

    python benchmarks/accuracy.py                      # benchmarks/data (the development split)
    python benchmarks/accuracy.py --data DIR --rows    # another split, with a per-row table
    python benchmarks/accuracy.py --json

DIR holds `observed_memory.jsonl` (one measurement per line, fields in its README) and
`model_configs.json` (hf id -> config.json fields). Rows whose model or card cannot be resolved
are counted and listed, never silently dropped. Nothing here is tuned per row: every row goes
through the same `vramlab.capacity.estimate` a user's `vramlab plan` calls.

Baselines, scored on the same rows in the same run:
- naive: KV = utilization x nominal card size - weights; tokens at 2 x layers x kv_heads x head_dim x 2 B.
- weights+KV: KV = utilization x framework-visible memory - weights (no activation, non-torch or
  graphs); per-token bytes GQA-aware but blind to MLA, sliding windows and TP replication.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vramlab.capacity import GIB, Constants, EngineSettings, custom_gpu, estimate, get_gpu  # noqa: E402
from vramlab.capacity.spec import ModelSpec  # noqa: E402
from vramlab.errors import VramlabError  # noqa: E402
from vramlab.sources.hf_config import spec_from_config  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import local_engines  # noqa: E402  (benchmarks/local_engines.py: llama.cpp placement and Ollama rows)
from accuracy_table import (  # noqa: E402
    first_look,
    first_look_batches,
    held_out_capacity,
    never_seen_now,
    print_batches,
    readme_block,
    table,
)
from bands import band_coverage, band_coverage_all, band_score, print_bands  # noqa: E402  (band_score: tests call it here)

METRICS = ("weights", "kv_cache_gib", "kv_cache_tokens", "max_concurrency")


DATA_DIR = ROOT / "benchmarks" / "data"
# each never-seen row's KV capacity error at its batch's first look (accuracy_table.py)
FIRST_LOOK = ROOT / "benchmarks" / "results" / "first-look.jsonl"


def default_data_dir() -> Path:
    """The measurements shipped in the repository (benchmarks/data, sources in its README)."""
    return DATA_DIR


def quant_from_row(row: dict[str, Any], spec: ModelSpec) -> str | None:
    """The engine's quantization for a row; the scheme from the checkpoint name when the config lacks it."""
    q = (row.get("quantization") or "").lower() or None
    if q is None or spec.quant is not None or q == "bitsandbytes":
        return q  # bitsandbytes names its own storage: a "bnb-4bit" checkpoint name is not a w4a16 scheme
    name = (row.get("model") or row.get("model_hf_id") or "").lower()
    if "w4a16" in name or "int4" in name or "4bit" in name or "awq" in name:
        return "w4a16" if "awq" not in name else "awq"
    if "w8a8" in name or "int8" in name:
        return "w8a8"
    if "fp8" in name:
        return "fp8"
    if q in ("gptq_marlin", "gptq"):
        return "gptq"
    return q


def model_for(row: dict[str, Any], configs: dict[str, Any]) -> ModelSpec | str:
    """What `vramlab plan --model HF_ID --offline` would use: the bundled catalog when it knows the id,
    else the config shipped with the data (partial copies included)."""
    hf_id = row.get("model_hf_id") or row.get("model")
    cfg = configs.get(hf_id)
    errors = []
    try:
        from vramlab.sources import resolve_model

        try:
            return resolve_model(str(hf_id), offline=True)
        except VramlabError as exc:
            errors.append(str(exc))
    except ImportError:
        pass
    if isinstance(cfg, dict) and cfg.get("source") is not None:
        if isinstance(cfg.get("quantization_config"), str):  # the data set's note of a GGUF file's type,
            cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}  # not a config.json object
        try:
            return spec_from_config(cfg, hf_id, str(cfg.get("source")), hf_id=hf_id)
        except VramlabError as exc:
            errors.append(str(exc))
    return "; ".join(errors) or "no config"


def gpu_for(row: dict[str, Any]):
    """The card as the user's log shows it: the printed total when there is one (a T4 shows 14.56 or
    14.74 GiB depending on the driver), with the catalog card's architecture."""
    own = local_engines.gpu(row)
    if own is not None:
        return own
    name, total = row.get("gpu_model"), row.get("total_gpu_memory_gib")
    name = name or (row.get("extra") or {}).get("like_gpu")  # an unnamed card of a known class (ROCm 64 GB)
    like = None
    if name:
        try:
            like = get_gpu(name)
        except VramlabError:
            like = None
    if total:
        return custom_gpu(float(total), like=like)
    if like is None and row.get("engine") == "llama.cpp" and row.get("llamacpp_kv_buffer_mib"):
        # llama.cpp sizes its model, KV and compute buffers from the model and the context, not from the
        # card: a log that does not name its card is still scored on them (against a nominal 80 GiB card).
        return custom_gpu(80.0)
    return like


# "0.8.5.post1 (V0 engine)", "[~0.4.3, March 2025 ...]", "b5622": the first release number a row writes.
RELEASE = re.compile(r"(?<![\w.])[vb]?[0-9]+\.[0-9][0-9a-z.+]*|(?<![\w.])b[0-9]{3,}(?![0-9a-z])")
SAME_AS = re.compile(r"\bas (r[0-9]+)\b")


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an observed_memory.jsonl, each row that writes its release as another row's ("version not
    printed; as r242") given that row's release text: two start-ups of one source run one release, and a row
    left without a number would be planned at today's default release (vLLM's utilization default is 0.9
    before 0.20 and 0.92 from it: 0.89 GiB of pool on an L40S)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_id = {r["row_id"]: r for r in rows}
    for row in rows:
        text = str(row.get("engine_version") or "")
        same = SAME_AS.search(text)
        ref = by_id.get(same.group(1)) if same and not RELEASE.search(text) else None
        if ref is not None and RELEASE.search(str(ref.get("engine_version") or "")):
            row["engine_version"] = f"{text} = {ref['engine_version']}"
    return rows


def settings_for(row: dict[str, Any], spec: ModelSpec) -> EngineSettings:
    version_text = str(row.get("engine_version") or "")
    version = RELEASE.search(version_text)
    mode = "v0" if "V0" in version_text else ("v1" if "V1" in version_text else None)
    dtype = str(row.get("dtype") or "auto").replace("torch.", "")
    in_trainer = row.get("collection_group", "").startswith("unsloth") or bool(
        (row.get("extra") or {}).get("in_trainer")
    )
    api_server = not in_trainer and (row.get("extra") or {}).get("api_server", True) is not False
    kwargs: dict[str, Any] = dict(
        engine=row.get("engine") or "vllm",
        engine_version=version.group(0) if version else None,
        vllm_engine=mode,
        gpu_memory_utilization=row.get("gpu_memory_utilization"),
        max_model_len=row.get("max_model_len"),
        max_num_seqs=row.get("max_num_seqs"),
        max_num_batched_tokens=row.get("max_num_batched_tokens"),
        tensor_parallel_size=int(row.get("tensor_parallel") or 1),
        pipeline_parallel_size=int(row.get("pipeline_parallel") or 1),
        dtype=dtype,
        kv_cache_dtype=row.get("kv_cache_dtype") or "auto",
        quantization=quant_from_row(row, spec),
        enforce_eager=bool(row.get("enforce_eager")),
        block_size=row.get("block_size"),
        api_server=api_server,
        in_trainer=in_trainer,
        # the log's "Using FlashInfer for top-p & top-k sampling" / "Falling back to the PyTorch-native ..." line
        flashinfer_sampler=(row.get("extra") or {}).get("flashinfer_sampler"),
        # the log's "Custom allreduce is disabled because ... lacks GPU P2P capability" / "... spans across nodes"
        gpu_p2p=(row.get("extra") or {}).get("gpu_p2p"),
    )
    # the log's non-default args {'limit_mm_per_prompt': {'image': 2}} (extra.vision.limit_mm_per_prompt)
    mm_limits = ((row.get("extra") or {}).get("vision") or {}).get("limit_mm_per_prompt")
    if isinstance(mm_limits, dict):
        kwargs["limit_mm_per_prompt"] = tuple(sorted((str(k), int(v)) for k, v in mm_limits.items()))
    # LoRA slots: only where the log prints vLLM's non-default args ('enable_lora': True, 'max_lora_rank': N).
    args_text = " ".join(str(x) for x in row.get("raw_log_lines") or [] if "non-default args" in str(x))
    if re.search(r"'enable_lora': True", args_text):
        kwargs["enable_lora"] = True
        for key in ("max_lora_rank", "max_loras"):
            found = re.search(rf"'{key}': (\d+)", args_text)
            if found:
                kwargs[key] = int(found.group(1))
    elif (row.get("extra") or {}).get(
        "max_lora_rank"
    ):  # read off the source's own code (extra.max_lora_rank_source)
        kwargs["enable_lora"] = True
        kwargs["max_lora_rank"] = int(row["extra"]["max_lora_rank"])
    if kwargs["engine"] == "sglang":
        kwargs["mem_fraction_static"] = kwargs.pop("gpu_memory_utilization")
        kwargs["chunked_prefill_size"] = kwargs.pop("max_num_batched_tokens")
    elif kwargs["engine"] == "llama.cpp":
        extra = row.get("extra") or {}
        kwargs["ctx_size"] = row.get("n_ctx")
        kwargs["parallel"] = row.get("n_parallel")
        kwargs["n_ubatch"] = extra.get("n_ubatch")
        kwargs["flash_attn"] = extra.get("flash_attn")
        kwargs["cache_type_v"] = extra.get("type_v")
        kwargs["kv_cache_dtype"] = extra.get("type_k") or "auto"
        kwargs["max_model_len"] = None
    if kwargs["engine"] == "vllm" and kwargs["gpu_memory_utilization"] is None:
        kwargs["gpu_memory_utilization"] = None
    kwargs.update(local_engines.settings(row))
    return EngineSettings(**kwargs)


def observed(row: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "weights": row.get("weights_gib"),
        "kv_cache_gib": row.get("kv_cache_gib"),
        "kv_cache_tokens": row.get("kv_cache_tokens"),
        "max_concurrency": row.get("max_concurrency"),
    }
    if row.get("engine") == "llama.cpp":
        mib = 1 / 1024
        out["weights"] = (row.get("llamacpp_model_buffer_mib") or 0) * mib or None
        out["kv_cache_gib"] = (row.get("llamacpp_kv_buffer_mib") or 0) * mib or None
    return out


def scored_settings(row: dict[str, Any], s: EngineSettings) -> EngineSettings:
    """vLLM prints concurrency for the length it was started with: plan that length."""
    conc_len = row.get("max_concurrency_tokens_per_request") or row.get("max_model_len")
    return s if not conc_len or s.engine != "vllm" else s.with_(max_model_len=conc_len)


def predicted(
    row: dict[str, Any], spec: ModelSpec, gpu, s: EngineSettings, constants: Constants | None = None
) -> dict[str, dict[str, float]]:
    conc_len = row.get("max_concurrency_tokens_per_request") or row.get("max_model_len")
    est = estimate(spec, gpu, scored_settings(row, s), constants, with_suggestions=False)
    ours = {
        "weights": est.weights_bytes / GIB,
        "kv_cache_gib": est.kv_available_bytes / GIB,  # signed: a failed start-up prints a negative figure
        "kv_cache_tokens": float(est.kv_cache_tokens),
        "max_concurrency": est.max_concurrency,
    }
    ours.update(local_engines.scored(row, est) or {})
    util = s.gpu_memory_utilization or s.mem_fraction_static or 0.9
    w = est.weights_bytes
    length = conc_len or est.max_model_len
    naive_per_tok = (
        2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2 / max(1, s.tensor_parallel_size)
    )
    naive_kv = util * gpu.nominal_gb * GIB - w
    gqa_per_tok = (
        2
        * spec.num_layers
        * max(1, spec.num_kv_heads // s.tensor_parallel_size)
        * spec.head_dim
        * (1 if "fp8" in (s.kv_cache_dtype or "") else 2)
        / s.pipeline_parallel_size
    )
    wkv_kv = util * gpu.memory_bytes - w
    if s.engine in ("llama.cpp", "transformers", "ollama"):
        # Fixed pools: a calculator sizes KV from the context it is given, not from a budget.
        cells = est.kv_cache_tokens
        naive_kv, wkv_kv = naive_per_tok * cells, gqa_per_tok * cells
    base = {}
    for name, kv, per in (("naive", naive_kv, naive_per_tok), ("weights+kv", wkv_kv, gqa_per_tok)):
        toks = max(0.0, kv) / per
        base[name] = {
            "weights": w / GIB,
            "kv_cache_gib": kv / GIB,
            "kv_cache_tokens": toks,
            "max_concurrency": toks / length,
        }
    return {"vramlab": ours, **base}


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default_data_dir())
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--readme-table",
        action="store_true",
        help="print only the README's accuracy table (accuracy_table.py)",
    )
    ap.add_argument(
        "--no-calibration",
        action="store_true",
        help="skip the leave-one-out calibration table and the leave-one-group-out refits",
    )
    args = ap.parse_args()
    rows_path = args.data / "observed_memory.jsonl"
    if not rows_path.exists():
        print(f"accuracy: no {rows_path}", file=sys.stderr)
        return 2
    configs = (
        json.loads((args.data / "model_configs.json").read_text())
        if (args.data / "model_configs.json").exists()
        else {}
    )
    rows = load_rows(rows_path)
    errs: dict[str, dict[str, list[tuple[dict[str, Any], float]]]] = {}
    skipped: list[tuple[str, str]] = []
    per_row = []
    for row in rows:
        spec = model_for(row, configs)
        if isinstance(spec, str):
            skipped.append((row["row_id"], f"model: {spec}"))
            continue
        gpu = gpu_for(row)
        if gpu is None:
            skipped.append((row["row_id"], "no GPU named and no total memory"))
            continue
        try:
            s = settings_for(row, spec)
            preds = predicted(row, spec, gpu, s)
        except VramlabError as exc:
            skipped.append((row["row_id"], str(exc)))
            continue
        obs = observed(row)
        line = {
            "row": row["row_id"],
            "group": row.get("collection_group"),
            "model": row.get("model_hf_id"),
            "version": row.get("engine_version"),
            "engine": row.get("engine"),
        }
        for who, pred in preds.items():
            for metric in METRICS:
                o = obs.get(metric)
                if o in (None, 0):
                    continue
                e = (pred[metric] - float(o)) / abs(float(o)) * 100
                errs.setdefault(who, {}).setdefault(metric, []).append((row, e))
                if who == "vramlab":
                    line[metric] = (round(pred[metric], 2), o, round(e, 1))
        per_row.append(line)

    summary = summarize(errs)
    calibrated = [] if args.no_calibration else calibrated_loo(rows, configs)
    held_out = {} if args.no_calibration else leave_one_group_out(rows, configs)
    placement = local_engines.table(rows, lambda row: _plan(row, configs))
    readme_table = readme_block(held_out) if held_out else None
    first_look_table = (
        table(
            first_look(FIRST_LOOK),
            never_seen_now(per_row),
            held_out["kv_capacity_by_engine"],
            held_out["bands"],
            pct,
        )
        if held_out
        else None
    )
    batches = first_look_batches(FIRST_LOOK, per_row, pct)
    if args.readme_table:
        print(readme_table or "accuracy: the table needs the held-out pass (leave out --no-calibration)")
        return 0 if readme_table else 2
    if args.json:
        print(
            json.dumps(
                {
                    "summary": summary,
                    "rows": per_row,
                    "skipped": skipped,
                    "calibrated_loo": calibrated,
                    "leave_one_group_out": held_out,
                    "placement": placement,
                    "readme_table": readme_table,
                    "first_look_table": first_look_table,
                    "first_look_batches": batches,
                },
                indent=1,
                default=str,
            )
        )
        return 0
    if args.rows:
        for line in per_row:
            cells = [f"{line['row']} {str(line['model'])[:34]:34} {str(line['version'])[:10]:10}"]
            for metric in METRICS:
                if metric in line:
                    p, o, e = line[metric]
                    cells.append(f"{metric[:6]} {p:>9g}/{o:<9g} {e:+6.1f}%")
            print("  ".join(cells))
        print()
    print_summary(summary, len(rows), skipped, calibrated)
    if placement:
        print("\nllama.cpp per device and Ollama's own decision (logged -> planned):")
        for line in placement:
            err = "" if line["error_pct"] is None else f" ({line['error_pct']:+.2f}%)"
            print(f"  {line['row']}  {line['what']:<28} {line['logged']:>10} -> {line['planned']:<10}{err}")
    print_batches(batches)
    if held_out:
        print_held_out(held_out, summary)
        print(
            f"\nPer engine, each never-seen row at its first look ({FIRST_LOOK.name}) beside the model now:\n"
            f"{first_look_table}\n\nThe README's accuracy table (`--readme-table`):\n{readme_table}"
        )
    return 0


def _plan(row: dict[str, Any], configs: dict[str, Any]):
    """The estimate a row is scored against, or None when its model or card does not resolve."""
    spec, card = model_for(row, configs), gpu_for(row)
    if isinstance(spec, str) or card is None:
        return None
    try:
        return estimate(spec, card, scored_settings(row, settings_for(row, spec)), with_suggestions=False)
    except VramlabError:
        return None


GROUPED_FIELDS = {  # observed_memory.jsonl field (GiB) -> calibration field (bytes)
    "weights_gib": "weights_bytes",
    "activation_peak_gib": "activation_peak_bytes",
    "non_torch_gib": "non_torch_bytes",
    "cuda_graph_gib": "cuda_graph_bytes",
    "kv_cache_gib": "kv_cache_bytes",
}


def case_for(row: dict[str, Any], configs: dict[str, Any]):
    """A calibration case for a row (what `vramlab calibrate` fits), or why there is none."""
    from vramlab.capacity.calibration import Case

    spec = model_for(row, configs)
    if isinstance(spec, str):
        return f"model: {spec}"
    gpu = gpu_for(row)
    if gpu is None:
        return "no GPU named and no total memory"
    observed: dict[str, float] = {}
    for name, target in GROUPED_FIELDS.items():
        if row.get(name) is not None:
            observed[target] = float(row[name]) * GIB
    for name in ("kv_cache_tokens", "max_concurrency"):
        if row.get(name) is not None:
            observed[name] = float(row[name])
    init = (row.get("extra") or {}).get("init_non_torch_gib")
    if init is not None:
        observed["init_non_torch_bytes"] = float(init) * GIB
    s = scored_settings(row, settings_for(row, spec))
    return Case(str(row["row_id"]), spec, gpu, s, observed)


def calibrated_loo(rows: list[dict[str, Any]], configs: dict[str, Any]) -> list[dict[str, Any]]:
    """Leave-one-out error after `vramlab calibrate` fits the constants on the other rows (per engine)."""
    from vramlab.capacity.calibration import fit

    out = []
    for engine, engine_cases in sorted(cases_by_engine(rows, configs).items()):
        if len(engine_cases) < 5:
            continue
        result = fit([c for r, c in engine_cases if not _fork(r)], engine)
        for e in result.loo:
            out.append(
                {
                    "engine": engine,
                    "field": e.field,
                    "n": e.n,
                    "median_before": 100 * e.median_before,
                    "median_after": 100 * e.median_after,
                    "p90_before": 100 * e.p90_before,
                    "p90_after": 100 * e.p90_after,
                }
            )
    return out


def _fork(row: dict[str, Any]) -> bool:
    """A start-up of a fork of the engine (extra.fork, e.g. nlzy/vllm-gfx906): scored, never used to fit the
    upstream engine's constants."""
    return bool((row.get("extra") or {}).get("fork"))


def cases_by_engine(
    rows: list[dict[str, Any]], configs: dict[str, Any]
) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for row in rows:
        try:
            case = case_for(row, configs)
        except VramlabError:
            continue
        if isinstance(case, str):
            continue
        try:  # a plan the planner refuses (the main table lists the row as skipped) is neither fitted nor held out
            estimate(case.model, case.gpu, case.settings, with_suggestions=False)
        except VramlabError:
            continue
        out.setdefault(case.settings.engine, []).append((row, case))
    return out


# Which shipped defaults were set by reading a group's own rows (constants.py names the sources).
# For these the held-out figure of that group is not fully held out, and the report says so.
DEFAULTS_SET_FROM = {
    "llm-d-planner-v0.19.0-sweep": [
        "sampler_bytes_per_seq_vocab",
        "forward_intermediate_copies",
        "forward_hidden_copies",
        "moe_workspace_copies",
        "non_torch_forward_bytes",
        "non_torch_forward_tp_bytes",
        "non_torch_forward_pp_bytes",
        "cuda_context_bytes",
        "nccl_init_bytes",
        "cuda_graph_base_bytes",
        "cuda_graph_per_layer_bytes",
    ],
    "llm-d-planner-version-sweep": ["legacy_sampler_bytes_per_seq_vocab"],
    "unslothai-notebooks": ["legacy_sampler_bytes_per_seq_vocab", "v0_non_torch_bytes"],
    "dennislee22-vLLM-benchmarking": [
        "flashinfer_sampler_bytes_per_seq_vocab",
        "non_torch_forward_tp_nonvls_bytes",
    ],
    "public-logs-vllm-v0-tp": ["v0_non_torch_tp_nvswitch_bytes"],
    "public-logs-sglang": ["nccl_init_pcie_bytes"],
}


def leave_one_group_out(rows: list[dict[str, Any]], configs: dict[str, Any]) -> dict[str, Any]:
    """Every fitted constant refitted without the collection group it is scored on.

    For each group, `vramlab calibrate`'s fit runs on the other groups' rows of the same engine
    (from the shipped defaults as its anchor), and the group's rows are predicted with those
    constants. Components of the group that still use a default the other groups could not
    refit are listed: for them the held-out figure is as in-sample as the default's source.
    """
    from vramlab.capacity.calibration import fit

    by_engine = cases_by_engine(rows, configs)
    errs: dict[str, list[tuple[dict[str, Any], float]]] = {}
    bands: list[tuple[dict[str, Any], str, bool, float, str]] = []
    groups: dict[str, Any] = {}
    for engine, items in sorted(by_engine.items()):
        for group in sorted({str(r.get("collection_group")) for r, _ in items}):
            train = [c for r, c in items if str(r.get("collection_group")) != group and not _fork(r)]
            result = fit(train, engine, leave_one_out=False) if len(train) >= 5 else None
            # refit only when the other groups move a constant (SGLang's token-only rows fit none): else the
            # shipped defaults, and said so
            refit = bool(result and result.fitted)
            if result and refit:
                constants = Constants.defaults().with_overrides(result.overrides(), f"without {group}")
                fitted = sorted(f.name for f in result.fitted)
            else:  # the engine's only group, or nothing refittable outside it: scored at the shipped defaults
                constants, fitted = Constants.defaults(), []
            on_default: set[str] = set()
            group_errs: dict[str, list[float]] = {}
            for row, case in items:
                if str(row.get("collection_group")) != group:
                    continue
                est = estimate(case.model, case.gpu, case.settings, constants, with_suggestions=False)
                on_default |= {c.name for c in est.components if c.provenance == "default"}
                pred = {
                    "weights": est.weights_bytes / GIB,
                    "kv_cache_gib": est.kv_available_bytes / GIB,
                    "kv_cache_tokens": float(est.kv_cache_tokens),
                    "max_concurrency": est.max_concurrency,
                }
                pred.update(local_engines.scored(row, est) or {})
                obs = observed(row)
                scored = band_score(est, obs, pred.get("kv_cache_gib"))
                if scored is not None:
                    bands.append((row, engine, *scored))
                for metric in METRICS:
                    o = obs.get(metric)
                    if o in (None, 0):
                        continue
                    e = (pred[metric] - float(o)) / abs(float(o)) * 100
                    errs.setdefault(metric, []).append((row, e))
                    group_errs.setdefault(metric, []).append(abs(e))
            # a group whose rows span engines is scored per engine: one entry each, none overwritten
            groups[group if group not in groups else f"{group} ({engine})"] = {
                "engine": engine,
                "refit": refit,
                "n_train": len(train),
                "fitted": fitted,
                "why": ""
                if refit
                else (
                    f"only {len(train)} {engine} rows outside it: shipped defaults"
                    if result is None
                    else f"the {len(train)} {engine} rows outside it refit no constant: shipped defaults"
                ),
                "defaults_set_from_this_group": DEFAULTS_SET_FROM.get(group, []),
                "components_on_defaults": sorted(on_default),
                "metrics": {m: (len(v), statistics.median(v), pct(v, 0.9)) for m, v in group_errs.items()},
            }

    def pool(keep) -> dict[str, Any]:
        out = {}
        for m, v in errs.items():
            xs = [abs(e) for r, e in v if keep(str(r.get("collection_group")))]
            if xs:
                out[m] = {"n": len(xs), "median": statistics.median(xs), "p90": pct(xs, 0.9)}
        return out

    return {
        "groups": groups,
        "pooled": pool(lambda g: True),
        "pooled_outside_the_019_sweep": pool(lambda g: g != "llm-d-planner-v0.19.0-sweep"),
        "pooled_public_logs": pool(lambda g: g.startswith("public-logs-")),
        # rows collected after the model was written and committed before they were first scored
        # (benchmarks/data/README.md, "Never-seen rows"): the "logs never seen" figure
        "pooled_unseen": pool(lambda g: g.startswith("unseen-")),
        "bands": band_coverage(bands),
        "bands_every_engine": band_coverage_all(bands),
        "kv_capacity_by_engine": held_out_capacity(errs),
    }


def print_held_out(held_out: dict[str, Any], summary: dict[str, Any]) -> None:
    print()
    print("Leave-one-group-out (constants refitted without the group scored), |error| median / p90 %,")
    print("beside the in-sample defaults and the two baselines on the same group:")
    print(
        f"  {'group':32} {'metric':16} {'n':>3} {'held-out':>15} {'in-sample':>15} {'naive':>15} {'weights+kv':>15}"
    )
    for group, g in held_out["groups"].items():
        for metric in METRICS:
            if metric not in g["metrics"]:
                continue
            n, med, p90 = g["metrics"][metric]
            cells = []
            for who in ("vramlab", "naive", "weights+kv"):
                st = summary.get(who, {}).get(metric, {}).get("by_group", {}).get(group)
                cells.append(f"{st[1]:6.1f} /{st[2]:6.1f}" if st else f"{'-':>15}")
            print(
                f"  {group:32} {metric:16} {n:3} {med:6.1f} /{p90:6.1f} "
                + " ".join(f"{c:>15}" for c in cells)
            )
        if not g["refit"]:
            print(f"  {'':32} not refitted: {g['why']}")
        if g["defaults_set_from_this_group"]:
            print(
                f"  {'':32} defaults set from this group's own rows (not held out): "
                f"{', '.join(g['defaults_set_from_this_group'])}"
            )
    for key, label in (
        ("pooled", "every row"),
        ("pooled_outside_the_019_sweep", "outside the 0.19 H100 sweep"),
        ("pooled_public_logs", "public-logs-* groups only"),
        ("pooled_unseen", "unseen-* (never-seen) groups"),
    ):
        pooled = held_out[key]
        kv, w, conc = (
            pooled.get("kv_cache_gib", {}),
            pooled.get("weights", {}),
            pooled.get("max_concurrency", {}),
        )
        tok = pooled.get("kv_cache_tokens", {})
        print(
            f"held-out, {label:27} (n={kv.get('n', 0):3}): KV median {kv.get('median', math.nan):5.2f}% "
            f"p90 {kv.get('p90', math.nan):5.2f}% | weights median {w.get('median', math.nan):.2f}% | "
            f"concurrency median {conc.get('median', math.nan):.2f}% p90 {conc.get('p90', math.nan):.2f}% | "
            f"KV tokens (n={tok.get('n', 0)}; SGLang and TGI print only tokens) median "
            f"{tok.get('median', math.nan):.2f}% p90 {tok.get('p90', math.nan):.2f}%"
        )
    print_bands(held_out["bands"], held_out["bands_every_engine"])


def summarize(errs: dict[str, dict[str, list[tuple[dict[str, Any], float]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for who, metrics in errs.items():
        out[who] = {}
        for metric, items in metrics.items():
            ape = [abs(e) for _, e in items]
            by_group: dict[str, list[float]] = {}
            by_version: dict[str, list[float]] = {}
            for row, e in items:
                by_group.setdefault(str(row.get("collection_group")), []).append(abs(e))
                key = f"{row.get('engine')} {str(row.get('engine_version')).split(' ')[0]}"
                by_version.setdefault(key, []).append(abs(e))
            out[who][metric] = {
                "n": len(ape),
                "median": statistics.median(ape),
                "p90": pct(ape, 0.9),
                "max": max(ape),
                "signed_median": statistics.median([e for _, e in items]),
                "by_group": {g: (len(v), statistics.median(v), pct(v, 0.9)) for g, v in by_group.items()},
                "by_version": {g: (len(v), statistics.median(v)) for g, v in sorted(by_version.items())},
            }
    return out


def print_summary(
    summary: dict[str, Any], n_rows: int, skipped: list[tuple[str, str]], calibrated: list[dict[str, Any]]
) -> None:
    ours = summary.get("vramlab", {})
    print("Per collection group (vramlab, |error| median / p90, %):")
    groups = sorted({g for m in ours.values() for g in m["by_group"]})
    for g in groups:
        cells = []
        for metric in METRICS:
            if metric in ours and g in ours[metric]["by_group"]:
                n, med, p90 = ours[metric]["by_group"][g]
                cells.append(f"{metric} {med:5.1f}/{p90:5.1f} (n={n})")
        print(f"  {g:32} " + "  ".join(cells))
    print("Per engine version (vramlab, KV GiB |error| median %):")
    for key, (n, med) in ours.get("kv_cache_gib", {}).get("by_version", {}).items():
        print(f"  {key:24} n={n:3}  {med:5.1f}")
    if skipped:
        print(f"Skipped {len(skipped)} of {n_rows} rows:")
        for rid, why in skipped:
            print(f"  {rid}: {why[:120]}")
    if calibrated:
        print("Calibrated on the other rows (vramlab calibrate, leave-one-out), |error| %:")
        print(f"  {'engine':8} {'field':24} {'n':>4} {'defaults med/p90':>18} {'calibrated med/p90':>20}")
        for c in calibrated:
            print(
                f"  {c['engine']:8} {c['field']:24} {c['n']:4} {c['median_before']:8.2f} /{c['p90_before']:7.2f}"
                f"   {c['median_after']:9.2f} /{c['p90_after']:7.2f}"
            )
    print()
    print(f"{'predictor':12} {'metric':16} {'n':>4} {'median%':>8} {'p90%':>8} {'max%':>8} {'signed%':>8}")
    for who in ("naive", "weights+kv", "vramlab"):
        for metric in METRICS:
            st = summary.get(who, {}).get(metric)
            if st:
                print(
                    f"{who:12} {metric:16} {st['n']:4} {st['median']:8.2f} {st['p90']:8.2f} {st['max']:8.1f} "
                    f"{st['signed_median']:+8.2f}"
                )
    print("targets: weights median <= 2%; KV bytes median <= 3%, p90 <= 8%; concurrency median <= 3%")
    if ours:
        kv = ours.get("kv_cache_gib", {})
        w = ours.get("weights", {})
        conc = ours.get("max_concurrency", {})
        print(
            f"vramlab: weights median {w.get('median', math.nan):.2f}% | KV median {kv.get('median', math.nan):.2f}% "
            f"p90 {kv.get('p90', math.nan):.2f}% | concurrency median {conc.get('median', math.nan):.2f}% "
            f"p90 {conc.get('p90', math.nan):.2f}%"
        )


if __name__ == "__main__":
    raise SystemExit(main())
