"""Detection: turn what the drill sees into findings, and findings into stop decisions.

Inputs, each fed as it arrives: request results (status and error body), health probes, the
target's process state, its log lines (matched against the engines' failure signatures), engine
metrics and GPU samples (including Xid). Out come `Finding`s; the stop conditions of the plan
decide which finding ends the ramp. Pure: no clock of its own, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vramlab.experiment.plan import StopConditions

# Failure modes named in the report (research/drill-anchors.md §4.10).
CRASH_AFTER_OOM = "crash_after_oom"  # runtime OOM, engine dead, process exits
OOM_NO_EXIT = "oom_no_exit"  # OOM seen but the process stayed up (keep-alive, hang after OOM)
HANG = "hang"  # no answers and no error: requests time out, health stalls
OVERLOAD = "overload_429"  # requests refused (429 / 503 busy), process fine
STARTUP_REFUSAL = "startup_refusal"  # the engine would not start (on restart, usually)
PREEMPTION = "preemption"  # KV full: preemption/retraction, no errors


@dataclass(frozen=True)
class Finding:
    t_s: float
    kind: str  # oom | engine_death | startup_refusal | process_exit | health_fail | overload | preemption | xid | error_rate | gpu_memory | wall_clock | timeout
    source: str  # response | log | process | health | engine | gpu
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Detector:
    """Keeps the sliding windows the stop conditions need; says when to stop and why."""

    stop: StopConditions
    engine: str | None = None
    findings: list[Finding] = field(default_factory=list)
    _results: deque[tuple[float, bool]] = field(default_factory=deque)
    _error_since: float | None = None
    _preemptions: float | None = None
    _health_up: bool | None = None
    stopped: Finding | None = None

    # -- inputs ------------------------------------------------------------------------------
    def on_result(self, t_s: float, ok: bool, status_code: int, error_class: str | None, error: str | None) -> None:
        self._results.append((t_s, ok))
        if error_class == "oom":
            self._add(Finding(t_s, "oom", "response", f"response carried an out-of-memory error: {(error or '')[:160]}",
                              {"status_code": status_code}))
        elif status_code in (429, 503) and error_class is not None:
            self._add(Finding(t_s, "overload", "response", f"HTTP {status_code}: {(error or '')[:160]}",
                              {"status_code": status_code}), once=True)
        elif error_class == "timeout":
            self._add(Finding(t_s, "timeout", "response", "request timed out", {}), once=True)
        self._check_error_rate(t_s)

    def on_log_line(self, t_s: float, line: str) -> Finding | None:
        from vramlab.logs.signatures import classify_line

        sig = classify_line(line, self.engine)
        if sig is None:
            return None
        kind = {"engine_death": "engine_death", "oom": "oom", "startup_refusal": "startup_refusal",
                "preemption": "preemption", "kv_pressure": "preemption", "overload": "overload",
                "gpu_xid": "xid"}.get(sig.kind, sig.kind)
        f = Finding(t_s, kind, "log", sig.line.strip()[:300],
                    {"signature": sig.name, "class": sig.kind, "severity": sig.severity, "engine": sig.engine,
                     "details": sig.details or {}})
        self._add(f, once=kind in ("preemption", "overload"))
        return f

    def on_process(self, t_s: float, running: bool, exit_code: int | None) -> None:
        if not running:
            self._add(Finding(t_s, "process_exit", "process", f"target process exited with code {exit_code}",
                              {"exit_code": exit_code}), once=True)

    def on_health(self, t_s: float, up: bool, status_code: int) -> None:
        if self._health_up is not False and not up:
            self._add(Finding(t_s, "health_fail", "health", f"health check failed (HTTP {status_code or 'none'})",
                              {"status_code": status_code}))
        self._health_up = up

    def on_sample(self, t_s: float, name: str, value: float, total: float | None = None) -> None:
        if name == "engine.num_preemptions_total":
            if self._preemptions is not None and value > self._preemptions:
                self._add(Finding(t_s, "preemption", "engine", f"preemptions rose to {value:g}", {"value": value}),
                          once=True)
            self._preemptions = value
        elif name == "gpu.memory_used_bytes" and total:
            share = value / total
            limit = self.stop.gpu_memory_share
            if limit is not None and share > limit:
                self._stop(Finding(t_s, "gpu_memory", "gpu", f"GPU memory share {share:.4f} above the stop limit {limit:g}",
                                   {"share": share}))
        elif name == "engine.kv_cache_usage_perc" and self.stop.kv_usage is not None and value > self.stop.kv_usage:
            self._stop(Finding(t_s, "kv_usage", "engine", f"KV-cache usage {value:.3f} above the stop limit "
                               f"{self.stop.kv_usage:g}", {"value": value}))
        elif name == "gpu.xid" and value > 0:
            self._add(Finding(t_s, "xid", "gpu", f"Xid {int(value)}", {"xid": int(value)}), once=True)

    def on_clock(self, elapsed_s: float, t_s: float) -> None:
        limit = self.stop.wall_clock_s
        if limit is not None and elapsed_s > limit:
            self._stop(Finding(t_s, "wall_clock", "clock", f"wall clock limit {limit:g} s reached", {}))

    # -- decisions ---------------------------------------------------------------------------
    def failure(self) -> Finding | None:
        """The finding that says the target failed (ends the ramp), or None."""
        if self.stopped is not None:
            return self.stopped
        for f in self.findings:
            if f.kind in ("oom", "engine_death", "process_exit", "startup_refusal") and self.stop.oom_seen:
                return self._stop(f)
            if f.kind == "error_rate":
                return self._stop(f)
        return None

    def failure_mode(self) -> str:
        kinds = {f.kind for f in self.findings}
        oom = "oom" in kinds or "engine_death" in kinds
        if "startup_refusal" in kinds and not oom:
            return STARTUP_REFUSAL
        if oom and "startup_refusal" in kinds:
            return CRASH_AFTER_OOM + "+startup_refusal_on_restart"
        if oom and "process_exit" in kinds:
            return CRASH_AFTER_OOM
        if oom:
            return OOM_NO_EXIT
        if "process_exit" in kinds:
            return CRASH_AFTER_OOM if "xid" not in kinds else "crash_xid"
        if "overload" in kinds:
            return OVERLOAD
        if "timeout" in kinds or "health_fail" in kinds:
            return HANG
        if "preemption" in kinds:
            return PREEMPTION
        return "unknown"

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
        self._results.clear()
        self._error_since = None

    # -- internals ---------------------------------------------------------------------------
    def _check_error_rate(self, t_s: float) -> None:
        w = self.stop.window_s
        if self.stop.error_rate is None:
            return
        while self._results and self._results[0][0] < t_s - w:
            self._results.popleft()
        n = len(self._results)
        bad = sum(1 for _, ok in self._results if not ok)
        high = n >= self.stop.min_requests and bad / n > self.stop.error_rate
        if not high:
            self._error_since = None
            return
        if self._error_since is None:
            self._error_since = t_s
        # "error rate above X for Y seconds": the window holds Y seconds; the condition must hold
        # for Y seconds too, unless the whole window is failures (nothing gets through at all).
        if t_s - self._error_since >= w or bad == n >= 5:
            self._add(Finding(t_s, "error_rate", "response",
                              f"error rate {bad}/{n} above {self.stop.error_rate:g} over {w:g} s", {"rate": bad / n}),
                      once=True)

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


__all__ = [
    "CRASH_AFTER_OOM",
    "HANG",
    "OOM_NO_EXIT",
    "OVERLOAD",
    "PREEMPTION",
    "STARTUP_REFUSAL",
    "Detector",
    "Finding",
]
