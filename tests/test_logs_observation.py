"""Observations as JSONL: write, append, read back; the data set's rows convert; bad lines are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramlab.errors import ConfigError
from vramlab.logs.detect import parse_log
from vramlab.logs.observation import (
    Observation,
    append_observations,
    from_dataset_row,
    read_observations,
    write_observations,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"
GIB = 1 << 30


def test_write_append_read_round_trip(tmp_path):
    parsed = (
        parse_log(LOGS / "vllm-v1-tp2-0.10.log").observations
        + parse_log(LOGS / "sglang-tp4.log").observations
    )
    p = tmp_path / "obs.jsonl"
    assert write_observations(p, parsed[:2]) == 2
    assert append_observations(p, parsed[2:]) == len(parsed) - 2
    back = read_observations(p)
    assert back == parsed
    # one JSON object per line, plan-JSON field names, bytes as integers
    first = json.loads(p.read_text().splitlines()[0])
    assert first["kv_cache_bytes"] == 11843372319 and isinstance(first["weights_bytes"], int)


def test_a_hand_written_line_is_enough(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text(
        '# my H100 measurement\n\n{"engine": "vllm", "model": "llama-3.1-8b-instruct", '
        '"kv_cache_bytes": 62000000000, "settings": {"max_model_len": 8192}}\n'
    )
    (o,) = read_observations(p)
    assert o.kv_cache_bytes == 62_000_000_000 and o.settings["max_model_len"] == 8192
    assert o.source == f"{p}:3"


@pytest.mark.parametrize(
    "text,match",
    [
        ("{not json", r":1: not JSON"),
        ("[1, 2]", r":1: expected a JSON object"),
        ('{"engine": "vllm", "kv_cache_bytes": "lots"}', r":1: kv_cache_bytes:"),
        ('{"engine": "vllm", "kv_cache_gb": 3}', r":1: kv_cache_gb: Extra inputs"),
    ],
)
def test_bad_lines_are_named(tmp_path, text, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError, match=match):
        read_observations(p)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such measurement file"):
        read_observations(tmp_path / "nope.jsonl")


def test_dataset_rows_convert_gib_to_bytes():
    row = json.loads((LOGS / "observed_memory_lines.jsonl").read_text().splitlines()[0])
    o = from_dataset_row(row | {"dtype": "torch.bfloat16", "tensor_parallel": 1, "gpu_model": "H100-80GB"})
    assert o.kv_cache_bytes == int(round(row["kv_cache_gib"] * GIB))
    assert o.settings["dtype"] == "bfloat16" and o.settings["tensor_parallel_size"] == 1
    assert o.init_non_torch_bytes == int(round(0.51 * GIB))
    assert o.source is not None and o.source.startswith(row["row_id"])
    v0 = from_dataset_row(
        {
            "row_id": "x",
            "engine": "vllm",
            "engine_version": "0.8.5.post1 (V0 engine)",
            "collection_group": "unslothai-notebooks",
            "gpu_memory_utilization": 0.69,
            "extra": {"unsloth_actual_gpu_utilization_pct": 69.34},
        }
    )
    assert v0.engine_version == "0.8.5.post1" and v0.settings["vllm_engine"] == "v0"
    assert (
        v0.settings["gpu_memory_utilization"] == pytest.approx(0.6934) and v0.settings["api_server"] is False
    )


def test_dataset_rows_with_a_bracketed_version_note_keep_the_release_and_era():
    # benchmarks/data writes a note when the log did not print the version; calibrate read the whole
    # note as a version and refused the row ("not a release number").
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "observed_memory.jsonl"
    rows = {r["row_id"]: r for r in map(json.loads, data.read_text().splitlines())}
    r093 = from_dataset_row(rows["r093"])  # "[V0 engine, ~0.7.3: 'worker.py:267' without brackets, ...]"
    assert r093.engine_version == "0.7.3" and r093.settings["vllm_engine"] == "v0"
    sglang = from_dataset_row(rows["r090"])  # "[~0.4.3, March 2025 server_args ...; not printed]"
    assert sglang.engine_version == "0.4.3" and "vllm_engine" not in sglang.settings
    rocm = from_dataset_row(rows["r096"])  # "[V0 engine on ROCm ...]": no release written, the era kept
    assert rocm.engine_version is None and rocm.settings["vllm_engine"] == "v0"


def test_data_set_file_is_read_directly(tmp_path):
    p = tmp_path / "observed_memory.jsonl"
    row = json.loads((LOGS / "observed_memory_lines.jsonl").read_text().splitlines()[0])
    p.write_text(json.dumps(row) + "\n")
    (o,) = read_observations(p)
    assert isinstance(o, Observation) and o.kv_cache_tokens == row["kv_cache_tokens"]
