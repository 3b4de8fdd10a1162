"""Detection and the herd monitor on hand-fed inputs (pure: no clock, no I/O)."""

from __future__ import annotations

from vramlab.drill.detect import Detector
from vramlab.drill.herd import HerdMonitor
from vramlab.experiment.plan import StopConditions


def _det(**kw) -> Detector:
    base = dict(error_rate=0.5, window_s=2.0, min_requests=3, oom_seen=True, wall_clock_s=60.0,
                gpu_memory_share=0.99)
    base.update(kw)
    return Detector(StopConditions(**base), engine="vllm")


def test_oom_in_response_stops_and_crash_is_named_after_exit():
    d = _det()
    d.on_result(1.0, True, 200, None, None)
    assert d.failure() is None
    d.on_result(1.1, False, 500, "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    f = d.failure()
    assert f is not None and f.kind == "oom" and f.source == "response"
    assert d.failure_mode() == "oom_no_exit"
    d.on_process(1.5, False, 1)
    assert d.failure_mode() == "crash_after_oom"
    d.on_log_line(2.0, "ValueError: Free memory on device cuda:0 (19.40/22.49 GiB) on startup is less than desired "
                       "GPU memory utilization (0.9, 20.24 GiB).")
    assert d.failure_mode() == "crash_after_oom+startup_refusal_on_restart"


def test_log_signature_wins_over_response_for_the_report():
    d = _det()
    d.on_result(1.0, False, 500, "oom", "engine dead")
    d.on_log_line(1.05, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a total "
                        "capacity of 22.49 GiB of which 164.00 MiB is free.")
    sig = d.signature()
    assert sig is not None and sig["signature"] == "torch.cuda_oom" and "290.00 MiB" in sig["line"]


def test_oom_stop_can_be_disarmed_but_error_rate_still_holds():
    d = _det(oom_seen=False, window_s=1.0)
    d.on_result(0.1, False, 500, "oom", "x")
    assert d.failure() is None
    for i in range(6):  # every request failing: no need to wait the whole window
        d.on_result(0.2 + i * 0.01, False, 500, "http_5xx", "x")
    f = d.failure()
    assert f is not None and f.kind == "error_rate"


def test_error_rate_must_hold_for_the_window():
    d = _det(window_s=2.0)
    t = 0.0
    for i in range(40):  # alternate: 2 failures, 1 success -> 67 % errors, above 50 %
        t = i * 0.1
        d.on_result(t, i % 3 == 0, 200 if i % 3 == 0 else 500, None if i % 3 == 0 else "http_5xx", None)
        if t < 1.9:
            assert d.failure() is None, t
    assert d.failure() is not None and d.failure().kind == "error_rate"


def test_overload_hang_preemption_modes():
    d = _det()
    d.on_result(1.0, False, 429, "http_4xx", "Model is overloaded")
    assert d.failure_mode() == "overload_429"
    h = _det()
    h.on_result(1.0, False, 0, "timeout", None)
    assert h.failure_mode() == "hang"
    p = _det()
    p.on_sample(1.0, "engine.num_preemptions_total", 0)
    p.on_sample(1.5, "engine.num_preemptions_total", 3)
    assert p.failure_mode() == "preemption" and p.failure() is None  # degraded, not failed


def test_resource_and_clock_stops():
    d = _det()
    d.on_sample(1.0, "gpu.memory_used_bytes", 99.5, total=100.0)
    f = d.failure()
    assert f is not None and f.kind == "gpu_memory"
    c = _det(wall_clock_s=5.0)
    c.on_clock(4.0, 4.0)
    assert c.failure() is None
    c.on_clock(5.1, 5.1)
    assert c.failure() is not None and c.failure().kind == "wall_clock"


def test_herd_monitor_flags_a_retry_wave_against_the_baseline():
    h = HerdMonitor(window_s=1.0, threshold=2.0)
    for i in range(21):
        assert h.on_attempt(i * 0.25, "baseline") is None  # 4 per second
    assert h.baseline_rate_rps() == 4.0
    for i in range(6):  # 6 per second: 1.5x, not a storm
        assert h.on_attempt(10 + i / 6, "recovery") is None
    hit = None
    for i in range(12):  # then 12 within a second: 3x
        hit = h.on_attempt(12 + i / 12, "recovery") or hit
    assert hit is not None and hit >= 2.0 and h.storm_at_s is not None and h.storm_at_s >= 12
