"""Detection: turn what the drill sees into findings, findings into stop decisions, and the
findings into a failure mode named from evidence.

Inputs, each fed as it arrives: request results (status and error body), health probes, the
target's process state, its log lines (matched against the engines' failure signatures), engine
metrics and GPU samples (including Xid), and the restarts the drill's supervisor issues. Out come
`Finding`s. The window-based stops (error rate, P95, KV usage, GPU memory, wall clock) are the
experiment's `StopMonitor`, the one stop engine `vramlab run` uses too; a dead process and an
OOM the plan asks to stop on end the ramp here. Pure: no clock of its own, no I/O.

Failure modes: an OOM only when one was seen (the engine's words in a response or its
log, a CUDA/HIP signature, the kernel's OOM killer); otherwise the process's end says what
happened (killed by a signal, or a crash with its exit code), or the requests do (hang: timeouts
and failing health with the process alive; overload: 429/503 refusals). A hang is also found without
waiting for a request's own timeout: health failing for the plan's liveness grace while the requests in
flight make no progress (none answered or failed since health began failing) and the process lives. A restart that exits
again before serving, or logs a start-up refusal, is a refused restart. `evidence()` quotes what
the mode was named from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vramlab.drill.evidence import exit_evidence, oom_text, signal_of
from vramlab.plandoc import StopConditions
from vramlab.records.event_payloads import LogFindingData
from vramlab.run.stop import StopMonitor, StopReason

# Failure modes named in the report (docs/research/drill-anchors.md §4.10).
CRASH_AFTER_OOM = "crash_after_oom"  # runtime OOM seen, then the process exited
OOM_KILLED = "oom_killed"  # the kernel's OOM killer ended the process
OOM_NO_EXIT = "oom_no_exit"  # OOM seen but the process stayed up (keep-alive, hang after OOM)
KILLED_BY_SIGNAL = "killed_by_signal"  # the process died by a signal and nothing said out of memory
CRASH = "crash"  # the process exited (or the engine died) and nothing said out of memory
HANG = "hang"  # no answers and no error: requests time out, health stalls, the process lives
STALL = "hang"  # the finding: health failing for the grace, in-flight requests making no progress
OVERLOAD = "overload_429"  # requests refused (429 / 503 busy), process fine
STARTUP_REFUSAL = "startup_refusal"  # the engine would not start
REFUSED_RESTART = "+startup_refusal_on_restart"  # suffix: the restart after the failure was refused
PREEMPTION = "preemption"  # KV full: preemption/retraction, no errors

# Findings that say the target failed (the rest degrade or stop the ramp by a plan's limit).
FAULT_KINDS = (
    "oom",
    "engine_death",
    "process_exit",
    "startup_refusal",
    "request_error",
    "timeout",
    "health_fail",
    "overload",
    "xid",
    "kernel_oom",
    STALL,
)
# A stop condition that fires is a finding of the condition's own name (stop_conditions.p95_ms -> "p95_ms"),
# as in an experiment's stop events.
STOP_KINDS = ("error_rate", "p95_ms", "kv_usage", "gpu_memory_share", "wall_clock_s")
WALL_CLOCK = "wall_clock_s"
# where each stop condition's figure comes from: the requests' answers, the engine's metrics, the card, the clock
_STOP_SOURCES = {
    "error_rate": "response",
    "p95_ms": "response",
    "kv_usage": "engine",
    "gpu_memory_share": "gpu",
    WALL_CLOCK: "clock",
}


@dataclass(frozen=True)
class Finding:
    t_s: float
    kind: str  # oom | engine_death | startup_refusal | process_exit | health_fail | overload | preemption | xid |
    #            request_error | timeout | error_rate | p95_ms | kv_usage | gpu_memory_share | wall_clock_s
    source: str  # response | log | process | health | engine | gpu | clock
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LogFinding(Finding):
    """A finding read from the target's log: its data is the log event's (the drill stores it as one)."""

    data: LogFindingData = field(default_factory=lambda: LogFindingData())


@dataclass
class Detector:
    """Feeds the shared stop engine, keeps the findings, says when to stop and why, names the mode."""

    stop: StopConditions
    engine: str | None = None
    findings: list[Finding] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)  # when the drill's supervisor restarted the target
    stopped: Finding | None = None
    _preemptions: float | None = None
    _health_up: bool | None = None
    _last_ok_s: float | None = None
    _health_back: list[float] = field(default_factory=list)  # when health came back after failing
    # a hang without waiting for request timeouts: health failing this long, requests in flight, none ended
    hang_grace_s: float | None = None
    _health_down_s: float | None = None  # when health began failing (None: up)
    _last_end_s: float | None = None  # when a request last ended (answered or failed): progress
    _in_flight: int = 0  # requests sent and not ended, as the kind counts them
    monitor: StopMonitor = field(init=False)

    def __post_init__(self) -> None:
        self.monitor = StopMonitor(self.stop, self.stop.wall_clock_s or float("inf"))

    # -- inputs ------------------------------------------------------------------------------
    def on_result(
        self,
        t_s: float,
        ok: bool,
        status_code: int,
        error_class: str | None,
        error: str | None,
        e2e_ms: float | None = None,
    ) -> None:
        if error_class == "cancelled":
            return
        self._last_end_s = max(t_s, self._last_end_s or t_s)
        self.monitor.on_request(t_s, ok, error_class, e2e_ms, error)
        if ok:
            self._last_ok_s = t_s
            self._check(t_s)
            return
        said = oom_text(error, self.engine)
        what = f"HTTP {status_code or 'none'} {error_class or ''}: {(error or '').strip()[:200]}".replace(
            " :", ":"
        )
        if said is not None:
            self._add(
                Finding(
                    t_s,
                    "oom",
                    "response",
                    f"a response said out of memory: {what}",
                    {"status_code": status_code, "signature": said},
                )
            )
        elif status_code in (429, 503):
            self._add(Finding(t_s, "overload", "response", what, {"status_code": status_code}), once=True)
        elif error_class == "timeout":
            self._add(Finding(t_s, "timeout", "response", f"request timed out: {what}", {}), once=True)
        self._add(
            Finding(
                t_s,
                "request_error",
                "response",
                f"first failed request: {what}",
                {"status_code": status_code, "error_class": error_class},
            ),
            once=True,
        )
        self._check(t_s)

    def on_log_line(self, t_s: float, line: str) -> LogFinding | None:
        from vramlab.logs.signatures import classify_line

        sig = classify_line(line, self.engine)
        if sig is None:
            said = oom_text(line, self.engine)  # the kernel OOM killer, HIP: words the engines' table lacks
            if said is None:
                return None
            f = LogFinding(t_s, "oom", "log", line.strip()[:300], {"signature": said, "class": "oom"})
            self._add(f)
            return f
        kind = {
            "engine_death": "engine_death",
            "oom": "oom",
            "startup_refusal": "startup_refusal",
            "preemption": "preemption",
            "kv_pressure": "preemption",
            "overload": "overload",
            "gpu_xid": "xid",
        }.get(sig.kind, sig.kind)
        f = LogFinding(
            t_s,
            kind,
            "log",
            sig.line.strip()[:300],
            {
                "signature": sig.name,
                "class": sig.kind,
                "severity": sig.severity,
                "engine": sig.engine,
                "details": sig.details or {},
            },
        )
        self._add(f, once=kind in ("preemption", "overload"))
        return f

    def on_process(
        self,
        t_s: float,
        running: bool,
        exit_code: int | None,
        oom_killed: bool | None = None,
        detail: str = "",
    ) -> None:
        """The target process ended (each end counts: a refused restart exits again)."""
        if running:
            return
        how = exit_evidence(exit_code)
        data: dict[str, Any] = {"exit_code": exit_code, "oom_killed": oom_killed}
        sig = signal_of(exit_code)
        if sig is not None:
            data["signal"] = sig[0]
        msg = f"target process {how}" + (f"; {detail}" if detail else "")
        self._add(Finding(t_s, "process_exit", "process", msg, data))
        if oom_killed:
            self._add(
                Finding(
                    t_s,
                    "kernel_oom",
                    "process",
                    f"the kernel OOM killer ended the target: {detail}",
                    {"exit_code": exit_code},
                )
            )

    def on_health(self, t_s: float, up: bool, status_code: int) -> None:
        if self._health_up is False and up:
            self._health_back.append(t_s)
        self._health_down_s = (
            None if up else (self._health_down_s if self._health_down_s is not None else t_s)
        )
        if self._health_up is not False and not up:
            self._add(
                Finding(
                    t_s,
                    "health_fail",
                    "health",
                    f"health check failed (HTTP {status_code or 'none'})",
                    {"status_code": status_code},
                )
            )
        self._health_up = up

    def on_sample(self, t_s: float, name: str, value: float, total: float | None = None) -> None:
        if name == "engine.num_preemptions_total":
            if self._preemptions is not None and value > self._preemptions:
                self._add(
                    Finding(t_s, "preemption", "engine", f"preemptions rose to {value:g}", {"value": value}),
                    once=True,
                )
            self._preemptions = value
        elif name == "gpu.memory_used_bytes" and total:
            self.monitor.on_sample("gpu.memory_share", value / total)
        elif name == "engine.kv_cache_usage_perc":
            self.monitor.on_sample(name, value)
        elif name == "gpu.xid" and value > 0:
            self._add(Finding(t_s, "xid", "gpu", f"Xid {int(value)}", {"xid": int(value)}), once=True)
        self._check(t_s)

    def on_clock(self, elapsed_s: float, t_s: float, in_flight: int | None = None) -> None:
        """The drill's tick; *in_flight*: the requests sent and not yet ended (for the hang's check)."""
        if in_flight is not None:
            self._in_flight = in_flight
        self._check(t_s)

    def on_restart(self, t_s: float) -> None:
        """A corrective action starts now (the supervisor's restart, the recovery command, the
        operator's first note): what follows is its outcome, not the fault (a process that exits
        because the action stopped it is no evidence of how the target failed)."""
        self.restarts.append(t_s)

    # -- decisions ---------------------------------------------------------------------------
    def failure(self) -> Finding | None:
        """The finding that says the target failed (ends the ramp), or None."""
        if self.stopped is not None:
            return self.stopped
        for f in self.findings:
            if f.kind in ("engine_death", "process_exit", "startup_refusal", "kernel_oom"):
                return self._stop(f)
            if f.kind == "oom" and self.stop.oom_seen:
                return self._stop(f)
        return None

    def _fault(self) -> list[Finding]:
        """Findings up to the first restart: the failure itself, not its recovery."""
        cut = self.restarts[0] if self.restarts else float("inf")
        return [f for f in self.findings if f.t_s < cut]

    def _restart_refused(self) -> Finding | None:
        """The evidence that a restart was refused: after a restart, the process exited again or logged a
        start-up refusal (or an OOM while loading) before any request succeeded."""
        if self.restarts:
            first = self.restarts[0]
            for f in self.findings:
                if f.t_s < first:
                    continue
                if self._last_ok_s is not None and first < self._last_ok_s < f.t_s:
                    return None
                if f.kind in ("process_exit", "startup_refusal") or (f.kind == "oom" and f.source == "log"):
                    return f
            return None
        # no restart recorded (a supervisor outside the drill): a start-up refusal after the fault is one
        fault_t = min((f.t_s for f in self.findings if f.kind != "startup_refusal"), default=None)
        return next(
            (
                f
                for f in self.findings
                if f.kind == "startup_refusal" and fault_t is not None and f.t_s > fault_t
            ),
            None,
        )

    def failure_mode(self) -> str:
        return self._mode()[0]

    def evidence(self) -> list[str]:
        """The quoted evidence the mode was named from, most telling first."""
        return self._mode()[1]

    def _mode(self) -> tuple[str, list[str]]:
        fault = self._fault()
        refused = self._restart_refused()
        if refused is not None and refused in fault:
            fault = [f for f in fault if f is not refused]
        kinds = {f.kind for f in fault}
        first = {k: next(f for f in fault if f.kind == k) for k in kinds}

        def q(kind: str) -> str:
            f = first[kind]
            return f'{f.source} at {f.t_s:.2f} s: "{f.message[:240]}"'

        if not fault and refused is not None and refused.kind == "startup_refusal":
            return STARTUP_REFUSAL, [q_of(refused)]
        oom = [k for k in ("kernel_oom", "oom") if k in kinds]
        exit_ = first.get("process_exit")
        if oom:
            ev = [q(k) for k in oom] + ([q("process_exit")] if exit_ else [])
            if "kernel_oom" in kinds:
                mode = OOM_KILLED
            else:
                mode = CRASH_AFTER_OOM if (exit_ or "engine_death" in kinds) else OOM_NO_EXIT
        elif exit_ is not None or "engine_death" in kinds:
            ev = [q(k) for k in ("process_exit", "engine_death", "xid") if k in kinds]
            ev.append(
                "no out-of-memory evidence: no OOM text in any response or log line"
                + (
                    ""
                    if exit_ is None or exit_.data.get("oom_killed") is None
                    else ", and the kernel OOM killer's counter for its cgroup did not rise"
                )
            )
            if "request_error" in kinds:
                ev.append(q("request_error"))
            if "xid" in kinds:
                mode = "crash_xid"
            elif exit_ is not None and exit_.data.get("signal") is not None:
                mode = KILLED_BY_SIGNAL
            else:
                mode = CRASH
        elif "overload" in kinds:
            mode, ev = OVERLOAD, [q("overload")]
        elif STALL in kinds or "timeout" in kinds or "health_fail" in kinds:
            ev = [q(k) for k in (STALL, "timeout", "health_fail") if k in kinds]
            ev.append("the process stayed up" if "process_exit" not in kinds else "")
            mode = HANG
        elif "preemption" in kinds:
            mode, ev = PREEMPTION, [q("preemption")]
        elif "request_error" in kinds:
            mode, ev = "errors", [q("request_error")]
        else:
            mode, ev = "unknown", []
        if refused is not None:
            mode += REFUSED_RESTART
            ev.append("restart refused: " + q_of(refused))
        return mode, [e for e in ev if e]

    def first_evidence_s(self) -> float | None:
        """T0: when the first sign of the failure was seen (a failed request's end, the exit, the OOM line)."""
        until = self.stopped.t_s if self.stopped is not None else float("inf")

        def cleared(f: Finding) -> bool:  # a health blip that passed before the failure is not its evidence
            return f.kind == "health_fail" and any(f.t_s < t <= until for t in self._health_back)

        ts = [f.t_s for f in self._fault() if f.kind in FAULT_KINDS and not cleared(f)]
        return min(ts) if ts else None

    def signature(self) -> dict[str, Any] | None:
        """The matched log line that best explains the failure (OOM first, then death, refusal)."""
        for kind in ("oom", "engine_death", "startup_refusal", "xid"):
            f = next((x for x in self.findings if x.kind == kind and x.source == "log"), None)
            if f is not None:
                return {**f.data, "line": f.message, "t_s": f.t_s}
        f = next((x for x in self.findings if x.kind == "oom"), None)
        return {"class": "oom", "line": f.message, "t_s": f.t_s, "signature": "response"} if f else None

    def reset_window(self) -> None:
        """After recovery: old results no longer count toward the error-rate stop."""
        self.monitor.reset_requests()

    # -- internals ---------------------------------------------------------------------------
    def _check(self, t_s: float) -> None:
        if self.stopped is not None:
            return
        stall = self._stalled(t_s)
        if stall is not None:
            self._stop(stall)
            return
        reason: StopReason | None = self.monitor.check(t_s)
        if reason is None or reason.condition == "oom_seen":
            return
        kind = reason.condition
        self._stop(
            Finding(
                t_s,
                kind,
                _STOP_SOURCES.get(kind, "response"),
                reason.message,
                {"value": reason.value, "threshold": reason.threshold, "condition": reason.condition},
            )
        )

    def _stalled(self, t_s: float) -> Finding | None:
        """A hang found from health and progress: health failing for the grace, requests in flight, none of
        them (nor any other) ended since health began failing, and no process exit seen."""
        down, grace = self._health_down_s, self.hang_grace_s
        if grace is None or down is None or self._in_flight <= 0 or t_s - down < grace:
            return None
        if (self._last_end_s is not None and self._last_end_s >= down) or any(
            f.kind == "process_exit" for f in self.findings
        ):
            return None
        return Finding(
            t_s,
            STALL,
            "health",
            f"hang: health failing for {t_s - down:.1f} s (since {down:.2f} s) and none of the {self._in_flight} "
            "request(s) in flight answered or failed since; the process is alive",
            {"health_down_s": down, "in_flight": self._in_flight, "grace_s": grace},
        )

    def _add(self, f: Finding, once: bool = False) -> None:
        if once and any(x.kind == f.kind for x in self.findings):
            return
        self.findings.append(f)

    def _stop(self, f: Finding) -> Finding:
        if self.stopped is None:
            self.stopped = f
            if f not in self.findings:
                self.findings.append(f)
        return self.stopped


def q_of(f: Finding) -> str:
    return f'{f.source} at {f.t_s:.2f} s: "{f.message[:240]}"'


__all__ = [
    "CRASH",
    "CRASH_AFTER_OOM",
    "HANG",
    "KILLED_BY_SIGNAL",
    "OOM_KILLED",
    "OOM_NO_EXIT",
    "OVERLOAD",
    "PREEMPTION",
    "STALL",
    "STARTUP_REFUSAL",
    "STOP_KINDS",
    "WALL_CLOCK",
    "Detector",
    "Finding",
]
