"""Detection and the herd monitor on hand-fed inputs (pure: no clock, no I/O)."""

from __future__ import annotations

from _narrow import some
from vramlab.drill.detect import Detector
from vramlab.drill.herd import HerdMonitor
from vramlab.plandoc import StopConditions


def _det(**kw) -> Detector:
    base = dict(
        error_rate=0.5, window_s=2.0, min_requests=3, oom_seen=True, wall_clock_s=60.0, gpu_memory_share=0.99
    )
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
    d.on_log_line(
        2.0,
        "ValueError: Free memory on device cuda:0 (19.40/22.49 GiB) on startup is less than desired "
        "GPU memory utilization (0.9, 20.24 GiB).",
    )
    assert d.failure_mode() == "crash_after_oom+startup_refusal_on_restart"


def test_log_signature_wins_over_response_for_the_report():
    d = _det()
    d.on_result(1.0, False, 500, "oom", "engine dead")
    d.on_log_line(
        1.05,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a total "
        "capacity of 22.49 GiB of which 164.00 MiB is free.",
    )
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


def test_error_rate_is_the_shared_stop_engine_min_requests_then_rate():
    # the drill's error-rate stop is the experiment's StopMonitor: the same rule in `run` and `drill`
    d = _det(window_s=2.0, min_requests=3)
    d.on_result(0.0, False, 500, "http_5xx", "x")
    d.on_result(0.1, False, 500, "http_5xx", "x")
    assert d.failure() is None  # two results are below min_requests
    d.on_result(0.2, True, 200, None, None)
    failure = d.failure()
    assert failure is not None and failure.kind == "error_rate"
    assert failure.message == some(d.monitor.check(0.2)).message


def test_timeouts_arm_the_error_stop_below_min_requests():
    d = _det(window_s=5.0, min_requests=10)
    d.on_result(1.0, False, 0, "timeout", "no answer within 1 s")
    f = d.failure()
    assert f is not None and f.kind == "error_rate" and "timed out (1/1)" in f.message
    mixed = _det(window_s=5.0, min_requests=10)
    mixed.on_result(1.0, True, 200, None, None)
    mixed.on_result(1.1, False, 0, "timeout", None)
    assert mixed.failure() is None  # one answer got through: the window is not all timeouts


def test_sigkill_without_oom_evidence_is_killed_by_signal_not_oom():
    d = _det()
    d.on_result(1.0, True, 200, None, None)
    d.on_result(2.0, False, 0, "connect", "Cannot connect to host 127.0.0.1:1234 [Connection refused]")
    d.on_process(2.05, False, -9, oom_killed=False, detail="oom_kill counter 0 -> 0")
    assert d.failure() is not None
    assert d.failure_mode() == "killed_by_signal"
    ev = " | ".join(d.evidence())
    assert (
        "killed by signal 9 (SIGKILL)" in ev
        and "no out-of-memory evidence" in ev
        and "Connection refused" in ev
    )
    assert d.first_evidence_s() == 2.0  # T0: the first failed request, before the exit was seen
    # the supervisor restarts it; the restart exits at once: a refused restart, and still no OOM
    d.on_restart(3.0)
    d.on_process(3.4, False, 2, detail="")
    assert d.failure_mode() == "killed_by_signal+startup_refusal_on_restart"
    assert any("restart refused" in e and "exited with code 2" in e for e in d.evidence())


def test_shell_status_137_is_a_signal_and_a_plain_exit_is_a_crash():
    d = _det()
    d.on_process(1.0, False, 137)
    assert d.failure_mode() == "killed_by_signal"
    assert "shell exit status 128+N 137" in d.evidence()[0]
    c = _det()
    c.on_process(1.0, False, 1)
    assert c.failure_mode() == "crash"


def test_kernel_oom_killer_is_an_oom():
    d = _det()
    d.on_process(1.0, False, -9, oom_killed=True, detail="memory.oom_control oom_kill 0 -> 1")
    assert d.failure_mode() == "oom_killed"
    k = _det()
    k.on_log_line(0.9, "[ 812.3] Out of memory: Killed process 4242 (llama-server) total-vm:9GB")
    k.on_process(1.0, False, -9)
    assert k.failure_mode() == "crash_after_oom"


def test_engine_dead_text_alone_is_not_an_oom():
    d = _det()
    d.on_result(1.0, False, 500, "oom", "EngineDeadError: engine dead")  # the client's class is not evidence
    d.on_process(1.2, False, 1)
    assert d.failure_mode() == "crash"


def test_restart_that_serves_is_not_refused():
    d = _det()
    d.on_process(1.0, False, -9)
    d.on_restart(1.5)
    d.on_result(4.0, True, 200, None, None)
    d.on_process(9.0, False, -15)  # a later exit (the drill's own stop) is not the restart's refusal
    assert d.failure_mode() == "killed_by_signal"


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
    assert (
        f is not None and f.kind == "gpu_memory_share" and f.source == "gpu"
    )  # the card said so, not an answer
    k = _det(kv_usage=0.9)
    k.on_sample(1.0, "engine.kv_cache_usage_perc", 0.95)
    kv = k.failure()
    assert kv is not None and kv.kind == "kv_usage" and kv.source == "engine"
    c = _det(wall_clock_s=5.0)
    c.on_clock(4.0, 4.0)
    assert c.failure() is None
    c.on_clock(5.1, 5.1)
    failure = c.failure()
    assert failure is not None and failure.kind == "wall_clock_s" and failure.source == "clock"


def test_herd_monitor_flags_a_retry_wave_against_the_baseline():
    h = HerdMonitor(window_s=1.0, threshold=2.0)
    for i in range(21):
        assert h.on_attempt(i * 0.25, "baseline") is None  # 4 per second
    assert h.baseline_rate_rps() == 4.0
    for i in range(6):  # 6 per second: 1.5x, not a storm
        assert h.on_attempt(10 + i / 6, "recovery") is None
    hit = None
    for i in range(12):  # then 12 new requests within a second: 3x, but no retry among them
        hit = h.on_attempt(12 + i / 12, "recovery") or hit
    assert hit is None and h.storm_at_s is None  # closed-loop users resubmitting are not a retry storm
    for i in range(12):  # 12 more within a second, 8 of them retries: a storm
        hit = h.on_attempt(14 + i / 12, "recovery", attempt=1 if i % 3 else 0) or hit
    assert hit is not None and hit >= 2.0 and h.storm_at_s is not None and h.storm_at_s >= 14


def test_hip_and_cuda_oom_words_are_oom_evidence():
    d = _det()
    d.on_log_line(1.0, "ggml_cuda_host_malloc: failed: hipErrorOutOfMemory (out of memory)")
    d.on_process(1.1, False, -6)
    assert d.failure_mode() == "crash_after_oom"
    r = _det()
    r.on_result(1.0, False, 500, "http_5xx", '{"error": "HIP out of memory. Tried to allocate 2.00 GiB"}')
    assert r.failure_mode() == "oom_no_exit" and r.failure() is not None


def test_a_health_blip_that_passed_before_the_failure_is_not_t0():
    # a busy CPU engine misses one 1 s health probe in the baseline, then answers again; minutes later
    # it hangs: T0 is the first timed-out request, not the blip (the report once put T0 before the ramp)
    d = _det(min_requests=3, window_s=2.0)
    d.on_health(4.7, False, 0)
    d.on_health(5.2, True, 200)
    for t in (6.0, 7.0, 8.0):
        d.on_result(t, True, 200, None, None, 100.0)
    d.on_health(10.7, False, 0)  # the hang: health fails and stays failed
    for t in (11.66, 11.70, 11.77):
        d.on_result(t, False, 0, "timeout", "no complete answer within 2 s", 2000.0)
    assert d.failure() is not None
    assert d.first_evidence_s() == 10.7


def _hanging(grace: float = 2.0) -> Detector:
    d = _det()
    d.hang_grace_s = grace
    d.on_result(1.0, True, 200, None, None)
    d.on_health(1.2, True, 200)
    return d


def test_a_hang_is_found_from_health_and_no_progress_before_any_request_times_out():
    d = _hanging()
    d.on_clock(1.5, 1.5, in_flight=4)
    d.on_health(2.0, False, 0)  # SIGSTOPped: the probe times out
    d.on_clock(3.9, 3.9, in_flight=4)
    assert d.failure() is None  # within the grace
    d.on_clock(4.1, 4.1, in_flight=4)
    f = d.failure()
    assert f is not None and f.kind == "hang" and f.source == "health", f
    assert "none of the 4 request(s) in flight answered" in f.message and "process is alive" in f.message
    assert d.failure_mode() == "hang" and d.evidence()[0].startswith("health at 4.10 s")
    assert d.first_evidence_s() == 2.0  # T0: when health began failing, not when the grace ran out


def test_no_hang_while_requests_still_end_nothing_in_flight_or_the_process_exited():
    progress = _hanging()
    progress.on_health(2.0, False, 0)
    progress.on_result(3.0, True, 200, None, None)  # a slow health probe, but answers come back
    progress.on_clock(4.5, 4.5, in_flight=2)
    assert progress.failure() is None
    idle = _hanging()
    idle.on_health(2.0, False, 0)
    idle.on_clock(5.0, 5.0, in_flight=0)  # nothing asked of it: no request can show a hang
    assert idle.failure() is None
    off = _det()  # no grace given (a detector outside a drill): only the stop engine and the findings
    off.on_health(2.0, False, 0)
    off.on_clock(30.0, 30.0, in_flight=4)
    assert off.failure() is None
    dead = _hanging()
    dead.on_health(2.0, False, 0)
    dead.on_process(2.5, False, -9)
    dead.on_clock(5.0, 5.0, in_flight=4)
    f = dead.failure()
    assert f is not None and f.kind == "process_exit"  # the exit, not a hang
    back = _hanging()
    back.on_health(2.0, False, 0)
    back.on_health(3.0, True, 200)  # health came back: the clock restarts at the next failure
    back.on_health(3.5, False, 0)
    back.on_clock(5.0, 5.0, in_flight=4)
    assert back.failure() is None
    back.on_clock(5.6, 5.6, in_flight=4)
    assert some(back.failure()).kind == "hang"
