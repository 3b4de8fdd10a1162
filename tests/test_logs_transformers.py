"""check-log on real `transformers serve` logs (tests/fixtures/logs/captured/, transformers 5.24.0 on CPU),
and a drill whose transformers target crashes while starting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from vramlab.logs.detect import detect_engine, parse_log, read_log

CAPTURED = Path(__file__).parent / "fixtures" / "logs" / "captured"
REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
INFO = CAPTURED / "transformers-5.24-serve-info-cpu.log"
TWO = CAPTURED / "transformers-5.24-serve-two-startups.log"
DEFAULT = CAPTURED / "transformers-5.24-serve-default-level.log"
MISSING = CAPTURED / "transformers-5.24-serve-fail-missing-model.log"
MODEL = "/work/tfscratch/tiny-llama"  # where the captured runs had the model


def test_the_engine_is_recognised_with_no_flag():
    for path in (INFO, TWO, DEFAULT, MISSING):
        assert detect_engine(read_log(path)) == "transformers", path
    # uvicorn's lines are SGLang's too: they do not make an SGLang log a transformers one
    for name in ("sglang-0.4.10-rtx5080-qwen3-0.6b.log", "sglang-0.4.9-llama8b-docker-desktop.log"):
        assert detect_engine(read_log(REAL / name)) == "sglang", name


def test_the_start_up_facts_are_read():
    (obs,) = parse_log(INFO).incomplete
    assert obs.engine == "transformers" and obs.engine_version == "5.24.0" and obs.model == MODEL
    assert (
        obs.settings["dtype"] == "bfloat16"
    )  # "Will use dtype=torch.bfloat16 as defined in model's config object"
    x = obs.extra
    assert (
        x["architecture"],
        x["num_hidden_layers"],
        x["hidden_size"],
        x["num_key_value_heads"],
        x["head_dim"],
        x["vocab_size"],
        x["max_position_embeddings"],
    ) == ("LlamaForCausalLM", 2, 256, 8, 32, 128, 1048576)
    assert x["pid"] == 26078 and x["listen"] == "http://127.0.0.1:18431" and x["continuous_batching"] is False
    assert not obs.complete  # it sizes no KV cache when it starts: no figure is claimed
    assert all(getattr(obs, f) is None for f in ("weights_bytes", "kv_cache_bytes", "kv_cache_tokens"))


def test_a_file_with_two_start_ups_is_read_as_two():
    obs = sorted(parse_log(TWO).incomplete, key=lambda o: o.startup)
    assert [o.startup for o in obs] == [0, 1]
    assert [o.extra["pid"] for o in obs] == [27920, 27971]
    # the second was started with --dtype float32 (no "Will use dtype" line; its config dump says so)
    assert [o.settings["dtype"] for o in obs] == ["bfloat16", "float32"]
    assert [o.extra["checkpoint_dtype"] for o in obs] == ["bfloat16", "bfloat16"]
    first, second = ([s.line for s in o.source_lines] for o in obs)
    assert max(first) < 218 <= min(second)  # line 218: the second "[transformers] Loading"


def test_the_default_log_level_still_gives_the_model():
    (obs,) = parse_log(DEFAULT).incomplete
    assert obs.model == MODEL and obs.engine_version is None and obs.extra["pid"] == 26604


def test_check_log_says_what_it_read_and_that_no_pool_is_sized():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "check-log", str(TWO)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "transformers log, 433 lines" in r.stdout and "start-up 2: transformers 5.24.0" in r.stdout
    assert (
        "sizes no KV cache at start-up" in r.stdout
        and "dtype float32, LlamaForCausalLM, 2 layers" in r.stdout
    )
    assert "incomplete start-up: the log ends" not in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "check-log", str(MISSING), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (
        out["engine"] == "transformers" and out["observations"][0]["model"] == "/work/tfscratch/no-such-model"
    )


def test_a_transformers_start_up_crash_is_a_process_exit_with_the_logs_last_lines(tmp_path):
    # the real failed start, replayed by a process that prints it and exits 1 as transformers serve did
    crash = (
        f'{sys.executable} -c "import sys, time; time.sleep(0.5); '
        f'sys.stdout.write(open({str(MISSING)!r}).read()); sys.exit(1)"'
    )
    plan = {
        "name": "tf-crash-at-start",
        "rounds": 1,
        "baseline_s": 1.0,
        "target": {
            "kind": "process",
            "environment": "test",
            "engine": "transformers",
            "api": "openai-chat",
            "base_url": "http://127.0.0.1:9",
            "model": "/work/tfscratch/no-such-model",
            "command": crash,
            "log_file": str(tmp_path / "target.log"),
        },
        "ramp": {
            "knob": "concurrency",
            "mode": "geometric",
            "start": 2,
            "factor": 2,
            "ceiling": 4,
            "step_s": 1,
        },
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(plan))
    t = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "drill", "p.yaml", "--db", str(tmp_path / "v.db"), "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert res.returncode == 1, (res.stdout[-1000:], res.stderr[-2000:])
    assert "the target process exited with code 1" in res.stderr and "after it was started" in res.stderr
    assert "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name'" in res.stderr
    assert "did not pass a health check" not in res.stderr
    assert time.monotonic() - t < 30


def test_a_host_memory_oom_while_serving_is_named_and_placed_after_start_up():
    # a 400,000-token prompt with eager attention: PyTorch refuses the 160 GB score tensor, the request gets
    # a 500 and the server keeps answering /health
    oom = CAPTURED / "transformers-5.24-serve-cpu-alloc-oom.log"
    parsed = parse_log(oom)
    (sig,) = parsed.failures
    assert (sig.kind, sig.name, sig.line_number) == ("oom", "torch.cpu_alloc", 354)
    assert sig.details == {"requested": "160000000000 bytes"}
    assert parsed.phase(sig) == "serving"  # after "Uvicorn running on", not while loading
    # a failure inside a start-up that never got to listen stays a start-up failure
    cut = read_log(oom)[:200] + read_log(oom)[353:354]
    (early,) = parse_log(cut).failures
    assert parse_log(cut).phase(early) == "start-up"
