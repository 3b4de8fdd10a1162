"""`vramlab calibrate` through the installed command: synthetic measurements with a known
constant, the refusal path, a profile that check-log applies, and logs as inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]  # same API under the 3.11 name

from vramlab.capacity import Constants, EngineSettings, estimate, get_gpu
from vramlab.logs.observation import Observation, write_observations
from vramlab.sources import resolve_model

LOGS = Path(__file__).parent / "fixtures" / "logs"
GIB = 1 << 30
TRUE_NON_TORCH = 0.43 * GIB


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args], capture_output=True, text=True, timeout=120, env=env
    )


def measurements(path: Path, tp2: int) -> None:
    """What a fleet's logs would have said if non-torch memory were 0.43 GiB (2 decimals, as printed)."""
    truth = Constants.defaults().with_overrides({"non_torch_forward_bytes": (TRUE_NON_TORCH, 0, "t")}, "t")
    gpu = get_gpu("h100-80gb")
    out = []
    names = [
        "llama-3.1-8b-instruct",
        "qwen2.5-7b-instruct",
        "qwen3-8b",
        "mistral-7b-instruct-v0.3",
        "qwen3-4b",
    ]
    for i, name in enumerate(names + names[:tp2]):
        tp = 2 if i >= len(names) else 1
        s = EngineSettings(
            engine="vllm",
            engine_version="0.19.0",
            max_model_len=8192,
            gpu_memory_utilization=0.9,
            tensor_parallel_size=tp,
        )
        est = estimate(resolve_model(name), gpu, s, truth)
        printed = lambda b: int(round(round(b / GIB, 2) * GIB))  # noqa: E731
        out.append(
            Observation(
                engine="vllm",
                engine_version="0.19.0",
                model=name,
                rank=0,
                weights_bytes=printed(est.weights_bytes),
                activation_peak_bytes=printed(est.activation_peak_bytes),
                non_torch_bytes=printed(est.non_torch_bytes),
                kv_cache_bytes=printed(est.kv_cache_bytes),
                kv_cache_tokens=est.kv_cache_tokens,
                max_model_len=8192,
                total_gpu_memory_bytes=int(round(gpu.memory_gib * GIB)),
                gpu_memory_utilization=0.9,
                settings={"max_model_len": 8192, "gpu_memory_utilization": 0.9, "tensor_parallel_size": tp},
            )
        )
    write_observations(path, out)


def test_calibrate_recovers_the_constant_and_refuses_thin_ones(tmp_path):
    data = tmp_path / "fleet.jsonl"
    measurements(data, tp2=2)
    profile = tmp_path / "fleet.calibration.toml"
    r = cli("calibrate", str(data), "-o", str(profile), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (f,) = out["fits"]
    fitted = {c["name"]: c for c in f["fitted"]}
    assert abs(fitted["non_torch_forward_bytes"]["value"] - TRUE_NON_TORCH) / TRUE_NON_TORCH < 0.02
    refused = {c["name"]: c for c in f["refused"]}
    assert refused["non_torch_forward_tp_bytes"]["n_points"] == 2
    loo = {e["field"]: e for e in f["loo"]}
    assert loo["non_torch_bytes"]["median_after"] < loo["non_torch_bytes"]["median_before"]
    doc = tomllib.loads(profile.read_text())
    sec = doc["section"][0]
    assert sec["engine"] == "vllm" and sec["version_min"] == "0.19.0"
    c = sec["constants"]["non_torch_forward_bytes"]
    assert {"value", "rel_band", "source", "n_points"} <= set(c)
    assert doc["provenance"]["inputs"] == [str(data)]


def test_text_report_and_profile_used_by_check_log(tmp_path):
    data = tmp_path / "fleet.jsonl"
    measurements(data, tp2=0)
    profile = tmp_path / "p.toml"
    r = cli("calibrate", str(data), "-o", str(profile))
    assert r.returncode == 0, r.stderr
    assert (
        "non_torch_forward_bytes" in r.stdout
        and "leave-one-out" in r.stdout
        and f"wrote {profile}" in r.stdout
    )
    r = cli("check-log", str(LOGS / "vllm-v1-0.19-debug.log"), "--calibration", str(profile), "--json")
    assert r.returncode == 0, r.stderr
    comps = {c["name"]: c for c in json.loads(r.stdout)["observations"][0]["prediction"]["components"]}
    assert comps["non_torch"]["provenance"] == "calibrated"
    assert abs(comps["non_torch"]["bytes"] - TRUE_NON_TORCH) / TRUE_NON_TORCH < 0.03
    # a profile from another version is refused with the reason
    r = cli(
        "check-log",
        str(LOGS / "vllm-v1-tp2-0.10.log"),
        "--calibration",
        str(profile),
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2-7b-instruct",
    )
    assert r.returncode == 2 and "fitted on vllm 0.19.0..0.19.0, not vllm 0.10.1.1" in r.stderr


def test_calibrate_reads_logs_and_reports_skips(tmp_path):
    profile = tmp_path / "p.calibration.toml"
    r = cli(
        "calibrate",
        str(LOGS / "vllm-v1-0.19-debug.log"),
        str(LOGS / "vllm-truncated.log"),
        str(LOGS / "tgi.log"),
        "--json",
        "-o",
        str(profile),
    )
    # one observation: every constant is refused, none guessed, nothing written, and the exit
    # status says so
    assert r.returncode == 1 and "no constant was fitted" in r.stderr and "no profile written" in r.stderr
    assert r.stderr.count("\n") == 1 and not profile.exists()
    out = json.loads(r.stdout)
    assert out["fitted_any"] is False
    reasons = " ".join(s["reason"] for s in out["skipped"])
    assert "incomplete start-up" in reasons
    # the TGI log's model: the hint names calibrate's own switch, not plan's --offline
    assert "not in the bundled catalog" in reasons and "--online" in reasons and "--offline" not in reasons
    (f,) = out["fits"]
    assert f["fitted"] == [] and all(c["n_points"] < 3 for c in f["refused"])


def test_impossible_observations_are_rejected_with_the_reason(tmp_path):
    data = tmp_path / "m.jsonl"
    measurements(data, tp2=2)
    good = data.read_text().splitlines()
    bad = [
        {
            "engine": "vllm",
            "engine_version": "0.19.0",
            "model": "qwen3-8b",
            "kv_cache_bytes": 900 * GIB,
            "total_gpu_memory_bytes": 80 * GIB,
            "source": "bigger-than-card",
        },
        {
            "engine": "vllm",
            "engine_version": "0.19.0",
            "model": "qwen3-8b",
            "non_torch_bytes": -GIB,
            "kv_cache_bytes": 60 * GIB,
            "source": "negative",
        },
        {
            "engine": "vllm",
            "engine_version": "0.19.0",
            "model": "qwen3-8b",
            "kv_cache_bytes": 60 * GIB,
            "max_concurrency": float("nan"),
            "source": "not-finite",
        },
    ]
    data.write_text("\n".join(good + [json.dumps(b) for b in bad]) + "\n")
    r = cli("calibrate", str(data), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    why = {s["source"]: s["reason"] for s in out["skipped"]}
    assert "bigger than the card" in why["bigger-than-card"]
    assert "negative" in why["negative"] and "not a finite number" in why["not-finite"]
    assert out["observations"] == len(good)  # the good rows are all used, the bad ones none
    assert out["fitted_any"] is True


def test_a_folder_gives_one_row_per_engine_era(tmp_path):
    r = cli("calibrate", str(LOGS / "real"))
    assert r.returncode == 1  # excerpts without model or card: nothing to fit, said so
    assert "engine era" in r.stdout
    for era in ("vLLM V0 0.6.4-0.6.5", "vLLM V1 0.7", "SGLang 0.4+", "TGI 2.2+ (scheduler V3)"):
        assert era in r.stdout, era
    assert "inferred from the wording" in r.stdout


def test_bad_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"engine": "vllm", "kv_cache_bytes": "many"}\n')
    r = cli("calibrate", str(bad))
    assert r.returncode == 2 and f"{bad}:1" in r.stderr and r.stderr.count("\n") == 1
    r = cli("calibrate", str(LOGS / "vllm-v1-0.19-debug.log"), "--min-points", "1")
    assert r.returncode == 2 and "--min-points" in r.stderr


def test_versions_widen_the_profile_range(tmp_path):
    data = tmp_path / "fleet.jsonl"
    measurements(data, tp2=0)
    profile = tmp_path / "wide.toml"
    r = cli("calibrate", str(data), "-o", str(profile), "--versions", "0.10..0.29")
    assert r.returncode == 0, r.stderr
    sec = tomllib.loads(profile.read_text())["section"][0]
    assert (sec["version_min"], sec["version_max"]) == ("0.10", "0.29")
    r = cli("calibrate", str(data), "--versions", "0.10")
    assert r.returncode == 2 and "MIN..MAX" in r.stderr


def test_reversed_or_non_numeric_versions_are_refused_in_one_line(tmp_path):
    data = tmp_path / "fleet.jsonl"
    measurements(data, tp2=0)
    profile = tmp_path / "never.toml"
    r = cli("calibrate", str(data), "-o", str(profile), "--versions", "0.29..0.10")
    assert r.returncode == 2 and r.stdout == "" and not profile.exists()
    assert (
        r.stderr.strip().count("\n") == 0
        and "reversed (0.29 > 0.10)" in r.stderr
        and "Traceback" not in r.stderr
    )
    r = cli("calibrate", str(data), "--versions", "0.10..latest")
    assert r.returncode == 2 and "not a release number" in r.stderr and "'latest'" in r.stderr
    r = cli("calibrate", str(data), "-o", str(profile), "--versions", "0.10..")  # open end still allowed
    assert r.returncode == 0, r.stderr


def test_the_documented_observation_line_reads(tmp_path):
    from vramlab.logs.observation import read_observations

    doc = (Path(__file__).parents[1] / "docs" / "logs-and-calibration.md").read_text()
    line = next(ln for ln in doc.splitlines() if ln.startswith('{"engine": "vllm"'))
    p = tmp_path / "doc.jsonl"
    p.write_text(line + "\n")
    (o,) = read_observations(p)
    assert o.model == "llama-3.1-8b-instruct" and o.settings["max_model_len"] == 8192


def test_an_outlier_row_is_warned_about(tmp_path):
    data = tmp_path / "m.jsonl"
    measurements(data, tp2=2)
    rows = data.read_text().splitlines()
    odd = json.loads(rows[0])
    odd["kv_cache_bytes"] //= 2  # half the pool: another process held the card during start-up
    odd["source"] = "shared-card"
    data.write_text("\n".join(rows + [json.dumps(odd)]) + "\n")
    r = cli("calibrate", str(data), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # that row, and only that row (the ordinary ones are within the fit's typical error)
    assert len(out["outliers"]) == 1 and "shared-card" in out["outliers"][0], out["outliers"]


def test_impossibly_small_observations_are_refused_not_fitted(tmp_path):
    """A unit slip (activation peak 1 byte) must not become a profile that moves the KV pool by GiB."""
    data = tmp_path / "m.jsonl"
    measurements(data, tp2=2)
    good = data.read_text().splitlines()
    tiny = [
        json.dumps({**json.loads(line), "activation_peak_bytes": 1, "source": f"tiny-{i}"})
        for i, line in enumerate(good * 3)
    ]
    only_tiny = tmp_path / "tiny.jsonl"
    only_tiny.write_text("\n".join(tiny) + "\n")
    r = cli("calibrate", str(only_tiny), "-o", str(tmp_path / "p.toml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "activation_peak_bytes is 1 bytes" in r.stderr and "tiny-0" in r.stderr
    assert not (tmp_path / "p.toml").exists()
    data.write_text("\n".join(good + tiny) + "\n")
    mixed = json.loads(cli("calibrate", str(data), "--json").stdout)
    alone = json.loads(cli("calibrate", str(_good(tmp_path, good)), "--json").stdout)
    why = {s["source"]: s["reason"] for s in mixed["skipped"]}
    assert all("smaller than any buffer" in why[f"tiny-{i} rank 0"] for i in range(len(tiny)))
    assert mixed["observations"] == len(good)
    assert [f["fitted"] for f in mixed["fits"]] == [f["fitted"] for f in alone["fits"]]  # the same profile


def _good(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "good.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p
