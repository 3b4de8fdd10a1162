"""Several logs in one file, through the installed `vramlab check-log`: every start-up is either
reported, with the figures it has when read alone, or named with the reason it was not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.logs.check import check_file, check_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
MIXED = LOGS / "mixed"
VRAMLAB = str(Path(sys.executable).with_name("vramlab"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([VRAMLAB, *args], capture_output=True, text=True, timeout=120, env=env)


def _read(path: Path, *flags: str) -> dict:
    r = cli("check-log", str(path), "--json", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _figures(obs: list[dict]) -> list[tuple]:
    return [
        (o["engine"], o.get("engine_version"), o.get("rank"), o.get("complete"), o.get("kv_cache_bytes"))
        for o in obs
    ]


def _alone(name: str) -> list[tuple]:
    report = check_log(LOGS / name)
    return [
        (o.engine, o.engine_version, o.rank, o.complete, o.kv_cache_bytes)
        for o in (it.observation for it in report.items)
    ]


# file -> the fixtures it was made of, in the order their logs begin in it
CASES = {
    "two-vllm-servers-interleaved.log": ["vllm-v1-newest.log", "vllm-v1-0.19-debug.log"],
    "vllm-then-ollama-then-llamacpp.log": ["vllm-v1-0.19-debug.log", "ollama-new.log", "llamacpp-new.log"],
    "journald-two-python3-pids.log": ["vllm-v1-0.19-debug.log", "sglang-tp4.log"],
    "k9s-two-pods.log": ["vllm-v1-0.19-debug.log", "sglang-tp4.log"],
    "compose-one-service-vllm-then-llamacpp.log": ["vllm-v1-0.19-debug.log", "llamacpp-new.log"],
    "llamacpp-with-vllm-inside.log": ["llamacpp-new.log", "vllm-v1-0.19-debug.log"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_log_in_the_file_is_read_as_if_it_were_alone(name):
    out = _read(MIXED / name)
    assert not out["skipped"], out["skipped"]
    got = [_figures(f["observations"]) for f in out["files"]]
    assert got == [_alone(src) for src in CASES[name]]
    # line numbers are the file's: each observation's lines hold the text the file has there
    text = (MIXED / name).read_text(encoding="utf-8").splitlines()
    for f in out["files"]:
        for o in f["observations"]:
            for s in o["source_lines"]:
                assert text[s["line"] - 1] == s["text"], (name, s)


def test_the_text_report_lists_the_logs_and_shows_each_in_full():
    r = cli("check-log", str(MIXED / "vllm-then-ollama-then-llamacpp.log"))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.endswith("3 logs in one file: vllm, ollama, llama.cpp"), first
    assert "llama.cpp b7012" in r.stdout and "ollama 0.12.9" in r.stdout and "vllm 0.19.0" in r.stdout
    assert "ollama b7012" not in r.stdout  # llama-server's start-up is not Ollama's


def test_two_servers_written_one_after_another_are_one_log_with_two_start_ups(tmp_path):
    a = (LOGS / "vllm-v1-newest.log").read_text(encoding="utf-8")
    b = (LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8")
    (tmp_path / "restart.log").write_text(a + b, encoding="utf-8")
    out = _read(tmp_path / "restart.log")
    assert [o["startup"] for o in out["observations"]] == [0, 1]
    assert all(o["complete"] for o in out["observations"])


def test_an_engine_left_out_by_engine_is_named(tmp_path):
    out = _read(MIXED / "llamacpp-with-vllm-inside.log", "--engine", "llama.cpp")
    assert out["engine"] == "llama.cpp"
    assert any("line(s) of vllm, not read: --engine llama.cpp was given" in n for n in out["notes"]), out[
        "notes"
    ]


def test_an_engine_whose_lines_hold_no_start_up_is_named(tmp_path):
    """A second engine's lines that make no start-up (an SGLang log's three argument lines inside a
    vLLM log): not a report, but not dropped without a word either."""
    sgl = [ln for ln in (LOGS / "sglang-tp4.log").read_text().splitlines() if "server_args" in ln]
    vllm = (LOGS / "vllm-v1-0.19-debug.log").read_text().splitlines()
    lines = vllm[:3] + sgl * 3 + vllm[3:]
    (tmp_path / "mix.log").write_text("\n".join(lines) + "\n")
    out = _read(tmp_path / "mix.log")
    engines = [f["engine"] for f in out["files"]]
    assert engines[0] == "vllm"
    # SGLang's arguments alone are a start-up without figures: reported, or named as skipped
    assert "sglang" in engines or any("sglang" in s["source"] for s in out["skipped"])


def test_a_failure_line_goes_to_the_engine_whose_start_up_it_follows(tmp_path):
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    lc = (LOGS / "llamacpp-new.log").read_text().splitlines()
    vllm = (LOGS / "vllm-v1-0.19-debug.log").read_text().splitlines()
    (tmp_path / "mix.log").write_text("\n".join(lc + vllm + [oom]) + "\n")
    out = _read(tmp_path / "mix.log")
    failures = {f["engine"]: [x["line_number"] for x in f["failures"]] for f in out["files"]}
    assert failures["vllm"] == [len(lc) + len(vllm) + 1] and failures["llama.cpp"] == []


def test_calibrate_reads_every_log_a_file_holds():
    from vramlab.logs.calibrate import read_inputs

    found, problems = read_inputs([MIXED / "vllm-then-ollama-then-llamacpp.log"])
    assert sorted({o.engine for o in found}) == ["llama.cpp", "ollama", "vllm"]
    assert not [p for p in problems if "incomplete" not in p[1]]


def test_many_processes_are_read_in_one_pass(tmp_path):
    """Two API servers and 30,000 worker pids (a hostile or very long log): each process is given a
    server once, never against every other process (30,000 x 30,000 would not end in the test's time)."""
    lines = [
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.19.0",
        "(APIServer pid=2) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.27.1",
    ]
    lines += [
        f"(VllmWorker rank={i % 8} pid={1000 + i}) INFO 01-01 00:00:01 [gpu_worker.py:1] Available KV cache memory: 1.00 GiB"
        for i in range(30_000)
    ]
    lines += [
        "(APIServer pid=1) INFO 01-01 00:00:09 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000"
    ]
    (tmp_path / "many.log").write_text("\n".join(lines) + "\n")
    reports, _ = check_file(tmp_path / "many.log")
    assert len(reports) == 2 and sum(len(r.items) for r in reports) > 2
