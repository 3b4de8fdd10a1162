"""`vramlab check-log` through the installed command, on fixture logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _narrow import some
from vramlab.logs.check import check_log
from vramlab.logs.compare import compare, gpu_for, settings_for
from vramlab.logs.detect import parse_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
GIB = 1 << 30
VRAMLAB = [sys.executable, "-m", "vramlab"]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([*VRAMLAB, *args], capture_output=True, text=True, timeout=60, env=env)


def test_json_contract_on_a_vllm_log_with_no_flags():
    r = cli("check-log", str(LOGS / "vllm-v1-0.19-debug.log"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (o,) = out["observations"]
    for key in (
        "engine",
        "engine_version",
        "model",
        "weights_bytes",
        "activation_peak_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "kv_cache_bytes",
        "kv_cache_tokens",
        "gpu_blocks",
        "block_size",
        "max_concurrency",
        "max_model_len",
        "total_gpu_memory_bytes",
        "gpu_memory_utilization",
        "source_lines",
    ):
        assert key in o, key
    assert o["kv_cache_bytes"] == int(round(61.66 * GIB)) and isinstance(o["weights_bytes"], int)
    pred = o["prediction"]
    assert pred["engine"] == "vllm" and pred["engine_version"] == "0.19.0"
    # the card is the log's: 79.19 GiB as vLLM saw it, not the 80 GB label
    assert abs(pred["gpu_memory_bytes"] - 79.19 * GIB) < 2
    assert set(pred["difference"]) >= {
        "weights_bytes",
        "activation_peak_bytes",
        "kv_cache_bytes",
        "kv_cache_tokens",
    }
    assert pred["difference"]["kv_cache_bytes"] == pred["kv_cache_bytes"] - o["kv_cache_bytes"]
    assert pred["explained_by"] in pred["kv_difference_by_component"]


def test_text_table_names_the_component_that_explains_most():
    r = cli("check-log", str(LOGS / "vllm-v1-0.19-debug.log"))
    assert r.returncode == 0, r.stderr
    assert "component" in r.stdout and "kv_cache" in r.stdout and "61.66 GiB" in r.stdout
    assert "most of the KV difference" in r.stdout


def test_flags_fill_what_the_log_does_not_say():
    # Without the card the engine's figures are still reported; the prediction says what it lacks.
    r = cli("check-log", str(LOGS / "sglang-tp4.log"), "--json")
    assert r.returncode == 0 and r.stderr == ""
    obs = json.loads(r.stdout)["observations"]
    assert obs and all(o["prediction"] is None and "pass --gpu" in o["prediction_error"] for o in obs)
    assert all(o["kv_cache_bytes"] > 0 for o in obs)
    r = cli("check-log", str(LOGS / "sglang-tp4.log"), "--gpu", "h100-80gb", "--json")
    assert r.returncode == 0, r.stderr
    obs = json.loads(r.stdout)["observations"]
    assert [o["rank"] for o in obs] == [0, 1, 2, 3]
    assert obs[0]["prediction"]["engine"] == "sglang"


@pytest.mark.parametrize(
    "content,match",
    [
        ("hello\nthis is not a log\n", "no line of a known engine"),
        (b"\x00\xff\xfe binary \x89PNG\r\n", "no line of a known engine"),
    ],
)
def test_nothing_recognizable_exits_nonzero_with_one_line(tmp_path, content, match):
    p = tmp_path / "junk.log"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = cli("check-log", str(p))
    assert r.returncode == 2 and match in r.stderr and r.stderr.count("\n") == 1


def test_truncated_log_says_it_is_incomplete():
    r = cli("check-log", str(LOGS / "vllm-truncated.log"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["observations"] and all(o["complete"] is False for o in out["observations"])
    assert out["observations"][0]["weights_bytes"] > 0  # what it printed before the cut is still read
    r = cli("check-log", str(LOGS / "vllm-truncated.log"))
    assert r.returncode == 0 and "incomplete start-up" in r.stdout


def test_missing_file():
    r = cli("check-log", "/nonexistent/vllm.log")
    assert r.returncode == 2 and "no such log file" in r.stderr and r.stderr.count("\n") == 1


def test_tp_ranks_and_attribution_in_library():
    report = check_log(LOGS / "vllm-v1-tp2-0.10.log", gpu="a100-80gb", model="qwen2-7b-instruct")
    assert [it.observation.rank for it in report.items] == [0, 1]
    item = report.items[0]
    assert item.settings_used["tensor_parallel_size"] == 2
    cmp = item.comparison
    assert cmp is not None
    # no budget line and no activation line printed: the KV difference is left unexplained
    assert cmp.explains == "unexplained"
    assert report.to_json()["observations"][1]["prediction"]["settings"]["tensor_parallel_size"] == 2


def test_contributions_add_up_to_the_kv_difference():
    obs = parse_log(LOGS / "vllm-v1-0.19-debug.log").observations[0]
    from vramlab.capacity import estimate
    from vramlab.sources import resolve_model

    card, _ = gpu_for(obs)
    est = estimate(resolve_model(obs.model), card, settings_for(obs))
    cmp = compare(obs, est)
    kv = next(r for r in cmp.rows if r.field == "kv_cache_bytes").difference
    assert sum(cmp.contributions.values()) == pytest.approx(kv, abs=2)
    weights_row = next(r for r in cmp.rows if r.field == "weights_bytes")
    assert cmp.contributions["weights"] == pytest.approx(-some(weights_row.difference))


def test_a_log_of_failures_names_them_and_exits_zero():
    r = cli("check-log", str(LOGS / "failures.log"), "--json")
    assert r.returncode == 0, r.stderr
    failures = json.loads(r.stdout)["failures"]
    assert failures[0]["name"] == "vllm.no_kv_memory" and failures[0]["line_number"] == 2
    assert failures[0]["kind"] == "startup_refusal"
    r = cli("check-log", str(LOGS / "failures.log"))
    assert r.returncode == 0 and "line 2: startup_refusal (vllm.no_kv_memory)" in r.stdout


def test_a_folder_gives_one_table_per_engine_era():
    real = LOGS / "real"
    r = cli("check-log", str(real), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["files"]) == len(list(real.glob("*.log")))  # sources.json is not taken for a log
    tables = {(t["engine"], t["era"]): t for t in out["tables"]}
    assert ("vllm", "vLLM V0 0.6.6-0.10") in tables and ("vllm", "vLLM V1 0.7") in tables
    assert ("tgi", "TGI 2.2+ (scheduler V3)") in tables and ("sglang", "SGLang 0.4+") in tables
    assert sum(t["observations"] for t in tables.values()) == sum(
        len(f["observations"]) for f in out["files"]
    )
    r = cli(
        "check-log",
        str(real / "vllm-0.7-v0-pr12126.log"),
        str(real / "vllm-0.8-v0-tp-pr14447.log"),
        "--model",
        "llama-3.1-8b-instruct",
    )
    assert r.returncode == 0, r.stderr
    # one table for the era both logs share, a row per observation (three ranks in the second)
    assert r.stdout.count("vLLM V0 0.6.6-0.10  (4 observations)") == 1
    assert "failures:" not in r.stdout


def test_several_files_where_none_is_a_log_is_one_line(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("nothing here\n")
    b.write_text("nor here\n")
    r = cli("check-log", str(a), str(b))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "none of the 2 files" in r.stderr


def _measured(reports) -> list[tuple[str, list]]:
    return [
        (
            r.engine,
            [(it.observation.startup, it.observation.rank, it.observation.kv_cache_bytes) for it in r.items],
        )
        for r in reports
    ]


@pytest.mark.parametrize("prefix", ["compose", "journald"])
def test_a_file_interleaving_a_vllm_and_an_sglang_writer_is_read_as_both(tmp_path, prefix):
    from vramlab.logs.check import check_file

    vllm = (LOGS / "vllm-v1-newest.log").read_text().splitlines()
    sgl = (LOGS / "sglang-tp4.log").read_text().splitlines()

    def tag(name: str, line: str, i: int) -> str:
        if prefix == "compose":
            return f"{name}  | {line}"
        return f"Jan 12 10:{i // 60 % 60:02d}:{i % 60:02d} gpu01 {name}[4{len(name)}1]: {line}"

    mixed: list[str] = []
    for i in range(max(len(vllm), len(sgl))):  # line by line, as two containers started side by side
        if i < len(vllm):
            mixed.append(tag("vllm-1", vllm[i], i))
        if i < len(sgl):
            mixed.append(tag("sglang-1", sgl[i], i))
    (tmp_path / "compose.log").write_text("\n".join(mixed) + "\n")
    reports, skipped = check_file(tmp_path / "compose.log")
    assert not skipped and [r.engine for r in reports] == ["vllm", "sglang"], [
        (r.engine, r.source) for r in reports
    ]
    alone = [check_log(LOGS / "vllm-v1-newest.log"), check_log(LOGS / "sglang-tp4.log")]
    assert _measured(reports) == _measured(alone)  # each writer read as if it were its own file
    assert reports[0].source.endswith("[vllm-1]") and reports[1].source.endswith("[sglang-1]")
    # the CLI: one file, two reports (not one engine kept and the other silently dropped)
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "check-log", str(tmp_path / "compose.log"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert [f["engine"] for f in json.loads(res.stdout)["files"]] == ["vllm", "sglang"]


def test_one_writer_is_one_stream_and_table_rows_are_not_writers():
    from vramlab.logs.split import split_streams

    lines = [f"vllm-1  | INFO line {i}" for i in range(20)]
    assert len(split_streams(lines)) == 1
    table = [f"INFO line {i}" for i in range(40)] + ["weights   | 12 GiB"] * 3 + ["kv_cache  | 9 GiB"] * 3
    assert len(split_streams(table)) == 1  # a few rows that look like "name | ..." are not two writers
