"""A CPU engine's runtime terms, learned from a run's host readings of its processes: the per-window
readings (analysis/host_runtime.py: vLLM's worker told from its front end by process title; a one-process
engine's tree less its buffers), and the fit of the plan's runtime constants from one run's windows
(capacity/run_calibration.py), with the held-out error before and after."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity_models import spec
from vramlab.analysis.host_runtime import Window, split_readings, tree_readings
from vramlab.capacity import EngineSettings, estimate
from vramlab.capacity.constants import Constants
from vramlab.capacity.gpus import host_device
from vramlab.capacity.run_calibration import RunMeasure, calibrate_runs, summary
from vramlab.records import SampleRecord

MIB = 1 << 20
TINY = {  # tests/_vllm.py's model
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
HOST = host_device(23.54)


def _proc(t: float, pid: int, name: str, mib: float) -> SampleRecord:
    return SampleRecord(
        run_id="r",
        t_s=t,
        source="host",
        name="host.process_rss_bytes",
        value=mib * MIB,
        labels={"pid": str(pid), "name": name},
    )


def _tree(t: float, worker: float, front: tuple[float, float, float] = (608, 589, 12)) -> list[SampleRecord]:
    api, core, tracker = front
    return [
        _proc(t, 10, "python", api),
        _proc(t, 11, "python", tracker),
        _proc(t, 12, "VLLM::EngineCore", core),
        _proc(t, 13, "VLLM::Worker", worker),
    ]


def test_vllm_cpu_worker_is_told_from_its_front_end_by_process_title() -> None:
    samples = [*_tree(1.0, 640), *_tree(1.5, 652, (610, 590, 12)), *_tree(9.0, 700)]
    (w,) = split_readings(samples, [Window("step 1", 0.5, 2.0)], held_bytes=8 * MIB)
    # the worker's highest less the model and the pool it holds; the rest of the tree at its highest
    assert w.runtime_bytes == (652 - 8) * MIB and w.front_bytes == (610 + 590 + 12) * MIB
    assert w.tree_bytes == (652 + 1212) * MIB
    # a tree whose readings name no worker (no setproctitle): nothing, rather than a wrong split
    anon = [s.model_copy(update={"labels": {"pid": "1", "name": "python"}}) for s in samples]
    assert split_readings(anon, [Window("step 1", 0.5, 2.0)], 8 * MIB) == []
    # a window without readings gives nothing
    assert split_readings(samples, [Window("later", 3.0, 4.0)], 8 * MIB) == []


def test_a_one_process_engine_is_its_tree_less_its_buffers() -> None:
    rss = [
        SampleRecord(run_id="r", t_s=t, source="host", name="host.target_rss_bytes", value=v * MIB)
        for t, v in ((1.0, 80.0), (1.2, 83.5), (5.0, 90.0))
    ]
    (w,) = tree_readings(rss, [Window("step 1", 0.0, 2.0)], held_bytes=int(9.5 * MIB))
    assert w.runtime_bytes == 74 * MIB and w.front_bytes is None


@settings(max_examples=40, deadline=None)
@given(
    worker=st.lists(st.integers(300, 2000), min_size=1, max_size=6),
    front=st.lists(st.integers(100, 3000), min_size=1, max_size=6),
    held=st.integers(0, 250),
)
def test_the_split_adds_up_to_the_tree(worker: list[int], front: list[int], held: int) -> None:
    n = min(len(worker), len(front))
    samples = [
        s
        for i in range(n)
        for s in (_proc(float(i), 1, "python", front[i]), _proc(float(i), 2, "VLLM::Worker", worker[i]))
    ]
    (w,) = split_readings(samples, [Window("w", 0.0, float(n))], held * MIB)
    assert w.runtime_bytes == (max(worker[:n]) - held) * MIB and w.front_bytes == max(front[:n]) * MIB
    assert w.tree_bytes <= w.runtime_bytes + held * MIB + (w.front_bytes or 0)


def _measure(run_id: str, windows: list[tuple[str, float, float]], **kw: int) -> RunMeasure:
    """A vLLM CPU run as `calibrate_runs` sees it: the plan's settings, the heaviest window's figures."""
    model = spec(TINY, "tiny")
    s = EngineSettings(
        engine="vllm",
        engine_version="0.32.0",
        max_model_len=2048,
        enforce_eager=True,
        num_gpu_blocks_override=kw.get("blocks", 40),
        max_num_seqs=kw.get("seqs", 8),
        kv_cache_memory_bytes=64 * MIB,
    )
    est = estimate(model, HOST, s, with_suggestions=False)
    weights, pool = (next(c.bytes for c in est.components if c.name == n) for n in ("weights", "kv_cache"))
    heavy = max(windows, key=lambda w: w[1] + w[2])
    measured = {
        "kv_cache": pool,
        "runtime": int(heavy[1] * MIB),
        "api_server": int(heavy[2] * MIB),
        "peak": int((heavy[1] + heavy[2]) * MIB) + weights + pool,
    }
    return RunMeasure(
        run_id,
        "vllm",
        model,
        HOST,
        s,
        measured,
        None,
        {},
        {},
        (heavy[0],),
        host=True,
        runtime_windows=tuple((w, int(a * MIB), int(b * MIB)) for w, a, b in windows),
        runtime_how={"runtime_bytes": "the worker", "api_server_bytes": "the front end"},
    )


def _est(m, g, s, c):
    return estimate(m, g, s, c, with_suggestions=False)


def test_one_vllm_cpu_run_fits_both_runtime_terms_and_the_held_out_error_shrinks() -> None:
    # one run, five windows: the worker grows a little under load, the front end holds still
    learned = _measure(
        "aaaa1111",
        [
            ("baseline", 690, 1214),
            ("step 1", 694, 1214),
            ("step 2", 697, 1214),
            ("step 3", 699, 1215),
            ("rec", 697, 1214),
        ],
    )
    held = _measure("bbbb2222", [("baseline", 691, 1213), ("step 1", 696, 1214)], blocks=64, seqs=4)
    cal = calibrate_runs([learned], [held], _est)
    got = {c.name: c for c in cal.changes}
    assert set(got) == {"vllm_cpu_worker_runtime_bytes", "vllm_cpu_frontend_runtime_bytes"}
    assert got["vllm_cpu_worker_runtime_bytes"].value == pytest.approx(696 * MIB, rel=0.005)
    assert got["vllm_cpu_frontend_runtime_bytes"].value == pytest.approx(1214 * MIB, rel=0.002)
    assert got["vllm_cpu_worker_runtime_bytes"].runs == ("aaaa1111",)
    assert "5 window(s)" in got["vllm_cpu_worker_runtime_bytes"].evidence
    errs = {e.figure: e for e in cal.holdout}
    assert {"runtime", "api_server", "peak", "kv_cache"} <= set(errs)
    for fig in ("runtime", "peak"):
        assert abs(errs[fig].after_pct) < abs(errs[fig].before_pct), errs[fig]
        assert abs(errs[fig].after_pct) < 1.0, errs[fig]
    # a figure the CPU plan has no term for (the overhead beyond weights, runtimes and pool) is not scored
    assert "runtime_overhead" not in errs
    doc = summary(cal)
    assert {c["constant"] for c in doc["changed"]} == set(got)
    assert any(h["figure"] == "runtime" for h in doc["holdout"])


def test_too_few_windows_are_refused_with_the_count() -> None:
    learned = _measure("aaaa1111", [("baseline", 690, 1214), ("step 1", 700, 1214)])
    cal = calibrate_runs([learned], [], _est)
    assert not cal.changes
    assert any("only 2 observation(s) of runtime_bytes" in n for n in cal.not_fitted), cal.not_fitted
    assert Constants.defaults()["vllm_cpu_worker_runtime_bytes"] == 630 * MIB  # nothing changed the model
