"""The drill's watchers: samplers, the target's log and process, neighbours, Prometheus.

They run beside the load for the whole round and feed the round's detector and live state
(``watch``); they read the target and the plan, and emit through the one runner. The drill's
clock is the runner's own tick (drill/kind.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from vramlab.drill.detect import Detector
from vramlab.drill.plan import DrillPlan, NeighbourSpec
from vramlab.drill.recovery import LiveState
from vramlab.drill.target import SPAWNED_KINDS, Target
from vramlab.records import SampleRecord
from vramlab.records import emit as E
from vramlab.records.emit import Emit
from vramlab.records.event_payloads import LogFindingData

if TYPE_CHECKING:
    from vramlab.drill.colocation_run import ColocationRun
    from vramlab.observe.base import Sample
    from vramlab.run.runner import Runner

# the detector's finding kinds a log line can produce, and the timeline event each is stored as
FINDING_EVENTS: dict[str, Emit[LogFindingData]] = {
    "oom": E.OOM,
    "engine_death": E.OOM,
    "startup_refusal": E.STARTUP_REFUSAL,
    "xid": E.XID,
    "preemption": E.PREEMPTION,
    "overload": E.OVERLOAD,
}


class Watchers:
    """What watches the target while a round runs; one per drill (what it last saw spans the rounds)."""

    def __init__(
        self,
        run: Runner,
        plan: DrillPlan,
        target: Target,
        device: str | None,
        coloc: ColocationRun | None,
        detector: Detector,
        state: LiveState,
    ) -> None:
        self.run, self.plan, self.target, self.device, self.coloc = run, plan, target, device, coloc
        self.detector, self.state = detector, state  # each round's own, from watch()
        self.health_path = plan.target.health_path  # replaced by what answered at bring-up
        self._last_health: bool | None = None
        self._last_log_event: dict[str, float] = {}

    def watch(
        self, detector: Detector, state: LiveState, health_path: str
    ) -> list[Coroutine[Any, Any, None]]:
        """The round's watchers, feeding *detector* and *state*."""
        self.detector, self.state, self.health_path = detector, state, health_path
        coloc = self.coloc
        return [
            self._sample_loop(),
            self._log_loop(),
            self._process_loop(),
            *[self._neighbour_loop(n) for n in self.plan.neighbours],
            *(
                [coloc.watch_exits(), *map(self._neighbour_loop, coloc.neighbours())]
                if coloc is not None
                else []
            ),
            *([self._prometheus_loop(self.plan.prometheus_url)] if self.plan.prometheus_url else []),
        ]

    async def _prometheus_loop(self, url: str) -> None:
        from vramlab.drill.alerting import watch_prometheus

        def changed(name: str, state: str, labels: dict[str, str]) -> None:
            self.run.emit(
                E.ALERT(
                    f"{name} {state}",
                    {
                        "name": name,
                        "state": state,
                        "source": "prometheus",
                        "severity": labels.get("severity"),
                        "owner": labels.get("owner"),
                    },
                )
            )

        await watch_prometheus(url, changed)

    async def _sample_loop(self) -> None:
        from vramlab.observe.base import SamplerSet
        from vramlab.observe.health import HealthSampler
        from vramlab.observe.prom_text import PromTextSampler

        root = self.target.url.rstrip("/")
        samplers: list[Any] = [
            HealthSampler(root + self.health_path, timeout_s=1.0),
            PromTextSampler(self.plan.target.metrics_endpoint(root), timeout_s=1.0),
        ]
        if self.device:
            from vramlab.observe.ledger import LedgerSampler

            samplers.append(LedgerSampler(self.device))
        else:
            from vramlab.observe.nvml import GpuSampler

            samplers.append(GpuSampler())
        if hasattr(self.target, "pid"):  # a process the drill started: its memory, across restarts
            from vramlab.observe.host import HostSampler

            samplers.append(HostSampler(pid_of=lambda: getattr(self.target, "pid", None)))
        if self.plan.target.kind == "ollama" or self.plan.target.engine == "ollama":
            from vramlab.observe.ollama import OllamaSampler  # model loads and unloads on the timeline

            samplers.append(OllamaSampler(root, timeout_s=1.0))
        sset = SamplerSet(
            samplers,
            self.plan.sample_interval_s,
            self._on_samples,
            lambda note: self.run.emit(E.WARNING(note)),
            self.run.emit,
        )
        await sset.start()
        try:
            await asyncio.Event().wait()
        finally:
            await sset.stop()

    def _on_samples(self, samples: list[Sample]) -> None:
        recs = []
        total = next((s.value for s in samples if s.name == "gpu.memory_total_bytes"), None)
        for s in samples:
            t = s.t - self.run.t0
            recs.append(
                SampleRecord(
                    run_id=self.run.run_id,
                    t_s=t,
                    source=s.source,
                    name=s.name,
                    value=s.value,
                    labels=dict(s.labels),
                )
            )
            if s.name == "health.up":
                self._on_health(t, s.value >= 0.5)
            else:
                self.detector.on_sample(t, s.name, s.value, total)
        self.run.emit(E.samples(recs))

    def _on_health(self, t: float, up: bool) -> None:
        self.detector.on_health(t, up, 0 if not up else 200)
        if up != self._last_health and self._last_health is not None:
            self.run.emit(E.HEALTH("health OK again" if up else "health check failing", {"ok": up}))
        if not up:
            self.state.health_ever_failed = (
                self.state.health_ever_failed or self.state.failed_at_s is not None
            )
            if self.state.health_down_since_s is None:
                self.state.health_down_since_s = t
        else:
            self.state.health_down_since_s = None
        self.state.health_up = up
        self._last_health = up

    async def _log_loop(self) -> None:
        since = time.time()
        while True:
            lines = (
                await asyncio.to_thread(self.target.logs, since)
                if self.plan.target.kind not in SPAWNED_KINDS
                else self.target.logs(since)
            )
            since = time.time()
            for line in lines:
                t = self.run.now()
                f = self.detector.on_log_line(t, line)
                if f is not None and f.kind in FINDING_EVENTS:
                    # one timeline row per burst: an engine death logs a line per failed request
                    emit = FINDING_EVENTS[f.kind]
                    if t - self._last_log_event.get(emit.kind, -1e9) > 2.0:
                        self.run.emit(emit(f.message[:300], f.data))
                    self._last_log_event[emit.kind] = t
            await asyncio.sleep(0.1 if self.plan.target.kind in SPAWNED_KINDS else 1.0)

    async def _process_loop(self) -> None:
        local = self.plan.target.kind in SPAWNED_KINDS
        while True:
            if self.state.restarting:  # the supervisor's own stop is no exit of the target's
                await asyncio.sleep(0.05)
                continue
            st = self.target.status() if local else await asyncio.to_thread(self.target.status)
            if self.state.restarting:
                continue
            if self.state.running and not st.running:
                from vramlab.drill.evidence import exit_evidence

                t = self.run.now()
                last = _last_log_line(self.target)  # the engine's own last words, quoted as evidence
                detail = st.detail + (f"; its log ends: {last!r}" if last else "")
                self.detector.on_process(t, False, st.exit_code, st.oom_killed, detail)
                self.run.emit(
                    E.PROCESS_EXIT(
                        f"target {exit_evidence(st.exit_code)}",
                        {"exit_code": st.exit_code, "oom_killed": st.oom_killed, "detail": st.detail},
                    )
                )
            self.state.running = st.running
            await asyncio.sleep(0.05 if local else 1.0)

    async def _neighbour_loop(self, n: NeighbourSpec) -> None:
        from vramlab.observe.health import HealthSampler

        probe: Any
        if (
            n.kind == "generate"
        ):  # one token: an engine that cannot grow its memory fails here, not on /health
            from vramlab.drill.probes import GenerateProbe

            probe = GenerateProbe(
                n.url.rstrip("/") + (n.path or "/v1/completions"), n.model or "default", n.timeout_s
            )
        else:
            probe = HealthSampler(n.url.rstrip("/") + (n.path or "/health"), timeout_s=n.timeout_s)
        await probe.open()
        try:
            while True:
                got = {s.name: s for s in await probe.sample()}
                t = got["health.up"].t - self.run.t0
                self.run.emit(
                    E.samples(
                        [
                            SampleRecord(
                                run_id=self.run.run_id,
                                t_s=t,
                                source="health",
                                name=f"neighbour.{n.name}.{what}",
                                value=got[reading].value,
                            )
                            for what, reading in (("ok", "health.up"), ("latency_ms", "health.latency_ms"))
                        ]
                    )
                )
                await asyncio.sleep(n.interval_s)
        finally:
            await probe.close()


def _log_tail_lines(target: Any, nbytes: int = 4096) -> list[str]:
    """The last non-empty lines (within `nbytes`) of a local target's log file (a process or the sim)."""
    path = getattr(target, "log_path", None)
    if not path:
        return []
    from vramlab.errors import ConfigError
    from vramlab.infile import open_input

    try:
        with open_input(path, "target log") as fh:  # a regular file: a FIFO or a device is never opened
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - nbytes))
            return [ln.strip() for ln in fh.read(nbytes).decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, ConfigError):
        return []


def _last_log_line(target: Any) -> str | None:
    """The last non-empty line of a local target's log file (a process or the sim), or None."""
    lines = _log_tail_lines(target)
    return lines[-1][:240] if lines else None


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): \S")
# An error named in advice, not raised: a logger's INFO/WARNING record (vLLM 0.32 warns at start-up that its file
# limit "can cause fd limit errors like `OSError: [Errno 24] Too many open files`"), or a name quoted in backticks.
_NOT_RAISED = re.compile(r"\b(?:DEBUG|INFO|WARNING) +\d\d-\d\d \d\d:\d\d")


def last_error_line(target: Any) -> str | None:
    """The engine's own last error in its log ("ValueError: Requested tokens (2108) exceed context window of
    256"), for a failure whose answers carried no words of the server (a stream cut before any token)."""
    for line in reversed(_log_tail_lines(target, 64 * 1024)):
        m = _ERROR_LINE.search(line)
        if m and line[m.start() - 1 : m.start()] != "`" and not _NOT_RAISED.search(line):
            return line[m.start() :][:240]
    return None
