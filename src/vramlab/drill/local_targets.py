"""Targets the drill runs itself: a local process it spawns, and the rehearsal server `vramlab sim`.

Both keep their port across restarts, so load generators and probes keep one URL, as a real
service behind a fixed address does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from vramlab.drill.target import (
    CommandTarget,
    Target,
    TargetCommandError,
    TargetSpec,
    TargetStatus,
    _read_new_lines,
    render,
)
from vramlab.errors import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessTarget:
    """A command the drill spawns in its own process group; its output goes to a log file."""

    def __init__(self, spec: TargetSpec, workdir: Path):
        self.spec = spec
        self._log_offset = 0
        self.log_path = Path(spec.log_file) if spec.log_file else workdir / "target.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._oom_kills: tuple[int, str] | None = None  # the cgroup's OOM-kill counter at the start
        self.last_stop: str | None = None  # how the last stop went (SIGTERM, or SIGKILL and why)

    @property
    def url(self) -> str:
        assert self.spec.base_url
        return self.spec.base_url

    @property
    def pid(self) -> int | None:
        """The running command's pid (its process group's leader); None when it is not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        assert self.spec.command
        cmd = render(self.spec.command, {"port": _port_of(self.spec.base_url)})
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                ["/bin/sh", "-c", cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        from vramlab.drill.evidence import oom_kill_count

        self._oom_kills = oom_kill_count(self._proc.pid) or oom_kill_count(os.getpid())
        self.starts += 1

    def stop(self) -> None:
        proc = self._proc
        self.last_stop = None
        if proc is None or proc.poll() is not None:
            return
        self.last_stop = stop_group(proc, self.stop_grace_s())

    def stop_grace_s(self) -> float:
        """How long SIGTERM may take before SIGKILL: the plan's `target.timeouts_s.stop`, else
        STOP_GRACE_S (not the 60 s command timeout: a hung engine must be gone inside the recovery limit)."""
        return float(self.spec.timeouts_s.get("stop", STOP_GRACE_S))

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> TargetStatus:
        if self._proc is None:
            return TargetStatus(False, "not started")
        code = self._proc.poll()
        if code is None:
            return TargetStatus(True, f"pid {self._proc.pid}")
        # it ended: did the kernel's OOM killer act in its cgroup meanwhile? (the child shares ours)
        from vramlab.drill.evidence import oom_kill_count

        now = oom_kill_count(os.getpid())
        if self._oom_kills is None or now is None:
            return TargetStatus(
                False, f"pid {self._proc.pid}; the cgroup OOM-kill counter is not readable here", code
            )
        before = self._oom_kills[0]
        return TargetStatus(
            False,
            f"pid {self._proc.pid}; cgroup oom_kill {before} -> {now[0]} ({Path(now[1]).name})",
            code,
            oom_killed=now[0] > before,
        )

    def logs(self, since_epoch: float) -> list[str]:
        return _read_new_lines(self, str(self.log_path))

    def close(self) -> None:
        self.stop()


class VllmTarget(ProcessTarget):
    """A vLLM API server the drill spawns (`python -m vllm.entrypoints.openai.api_server ...`): a process
    target whose stop acts on the whole process group even when its leader is gone, and cleans what the
    engine leaves behind.

    vLLM 0.32.0 (the CPU build here) serves from the API server, an engine core and its worker: a SIGKILL of the
    API server alone leaves the other two running (2.4 GB of host memory, found here), so `stop` signals the
    group whether or not the leader lives and waits until no process of it is left. Every start leaves
    `/tmp/vllm_dist_<hex>` (the gloo rendezvous file its log names in `distributed_init_method=file://...`), and
    a SIGKILL leaves its shared-memory segments `/dev/shm/psm_<hex>`; both are removed once the group is gone:
    the dist files this target's log names, and the segments made since its first start that no process maps.
    """

    def __init__(self, spec: TargetSpec, workdir: Path):
        super().__init__(spec, workdir)
        self._first_start: float | None = None
        self.cleaned: list[str] = []  # what the last stops removed, for the timeline and the tests

    def start(self) -> None:
        if self._first_start is None:
            self._first_start = time.time()
        super().start()

    def stop(self) -> None:
        proc = self._proc
        self.last_stop = None
        if proc is None:
            return
        if proc.poll() is None:
            self.last_stop = stop_group(proc, self.stop_grace_s())
        left = group_members(proc.pid)
        if left:  # the leader is gone, the engine core and its worker are not
            _signal_group(proc.pid, signal.SIGTERM)
            if not _wait_group_gone(proc.pid, self.stop_grace_s()):
                _signal_group(proc.pid, signal.SIGKILL)
                _wait_group_gone(proc.pid, 10.0)
            self.last_stop = (self.last_stop or "the API server had exited") + (
                f"; {len(left)} process(es) of its group were still running (the engine core and worker): "
                "signalled and gone"
            )
        self.cleaned = clean_vllm_leftovers(self.log_path, self._first_start or time.time())


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (zombies excluded), from /proc."""
    out: list[int] = []
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.append(int(pid))
    return out


def _wait_group_gone(pgid: int, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _in_use(paths: set[str]) -> set[str]:
    """Which of *paths* a live process has open or mapped (/proc/PID/fd and /proc/PID/maps)."""
    used: set[str] = set()
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                used.update(p for p in paths if p in fh.read())
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link in paths:
                    used.add(link)
        except OSError:
            continue
    return used


def clean_vllm_leftovers(log_path: Path, since_epoch: float) -> list[str]:
    """Remove the rendezvous files the log names and the orphaned shared-memory segments made since
    *since_epoch*; returns what was removed."""
    import re

    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    dist = {f"/tmp/{name}" for name in re.findall(r"file:///tmp/(vllm_dist_[0-9a-f]+)", text)}
    shm: set[str] = set()
    try:
        for name in os.listdir("/dev/shm"):
            path = f"/dev/shm/{name}"
            if name.startswith("psm_") and os.stat(path).st_mtime >= since_epoch - 1:
                shm.add(path)
    except OSError:
        pass
    candidates = {p for p in dist if os.path.exists(p)} | shm
    removed: list[str] = []
    # a process killed a moment ago can still hold its mappings while the kernel tears it down: what is still
    # mapped is looked at again for a short while before it is left to its live owner
    deadline = time.monotonic() + LEFTOVER_SETTLE_S
    while candidates:
        for path in sorted(candidates - _in_use(candidates)):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
        candidates = {p for p in candidates if p not in removed and os.path.exists(p)}
        if not candidates or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return removed


LEFTOVER_SETTLE_S = 2.0  # how long a segment still mapped at a stop is looked at again


STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL for a target the drill spawned, unless target.timeouts_s.stop says


def group_stopped(pgid: int) -> bool:
    """True when a process of the group is stopped (SIGSTOP, state 'T' or 't' in /proc/PID/stat):
    it would act on SIGTERM only once continued, so waiting for it is waiting for nothing."""
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] in ("T", "t"):
            return True
    return False


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> str:
    """Stop a process group the drill started: SIGKILL at once when a process of it is stopped,
    else SIGTERM and SIGKILL after `grace_s`. Returns how it went, for the timeline."""
    t = time.monotonic()
    if group_stopped(proc.pid):
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        return "SIGKILL at once: the process was stopped (state T) and would never act on SIGTERM"
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        return f"SIGTERM; it exited in {time.monotonic() - t:.2f} s"
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        return f"SIGTERM, then SIGKILL after {grace_s:g} s without an exit"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _port_of(url: str | None) -> int | None:
    from urllib.parse import urlparse

    return urlparse(url).port if url else None


class SimTarget:
    """`vramlab sim serve` in its own process (the sim's `start_sim`), or an already running sim
    at `base_url` (then the drill can load and probe it but not restart it)."""

    def __init__(self, spec: TargetSpec, workdir: Path):
        from vramlab.plandoc import SimSettings

        self.spec = spec
        self.settings = spec.sim or SimSettings()
        self.workdir = workdir
        self.device = self.settings.device or str(workdir / "sim-gpu0.ledger")
        self._log_offset = 0
        self._proc: Any = None
        self._port = _port_of(spec.base_url) or free_port()
        self.attached = spec.base_url is not None and spec.sim is None
        self.starts = 0
        self.last_exit_code: int | None = None
        self.last_stop: str | None = None

    @property
    def url(self) -> str:
        return (
            self.spec.base_url if self.attached and self.spec.base_url else f"http://127.0.0.1:{self._port}"
        )

    @property
    def log_path(self) -> str | None:
        return str(self._proc.log_path) if self._proc is not None else None

    def start(self, wait_ready: bool = True, extra_args: list[str] | None = None) -> None:
        if self.attached:
            return
        from vramlab.sim.launch import SimStartError, start_sim

        args = self.settings.argv() + ["--allow-fault-injection"] + (extra_args or [])
        try:
            self._proc = start_sim(args, device=self.device, port=self._port, wait_ready=wait_ready)
        except SimStartError as exc:
            self.last_exit_code = getattr(exc, "exit_code", None)
            lines = (getattr(exc, "log_tail", "") or "").strip().splitlines() or [""]
            # the root cause, not vLLM's generic wrapper line ("Engine core initialization failed")
            cause = next(
                (ln for ln in lines if "Error:" in ln and "initialization failed" not in ln), lines[-1]
            )
            raise TargetCommandError(
                f"sim did not start (exit {self.last_exit_code}): {cause.strip()[:240]}"
            ) from None
        self._log_offset = 0
        self.starts += 1

    def stop(self) -> None:
        self.last_stop = None
        if self._proc is not None and self._proc.poll() is None:
            if group_stopped(self._proc.pid):  # a stopped sim never acts on SIGTERM
                self.last_exit_code = self._proc.kill()
                self.last_stop = (
                    "SIGKILL at once: the process was stopped (state T) and would never act on SIGTERM"
                )
            else:
                self.last_exit_code = self._proc.stop(timeout_s=STOP_GRACE_S)
                self.last_stop = f"SIGTERM (SIGKILL after {STOP_GRACE_S:g} s)"

    def restart(self) -> None:
        if self.attached:
            raise TargetCommandError(
                "the drill attached to a running sim (target.base_url) and cannot restart it"
            )
        self.stop()
        self.start(wait_ready=False)

    def status(self) -> TargetStatus:
        if self.attached:
            return TargetStatus(True, "attached; not managed by the drill")
        if self._proc is None:
            return TargetStatus(False, "not started")
        code = self._proc.poll()
        if code is not None:
            self.last_exit_code = code
        return TargetStatus(code is None, f"pid {self._proc.pid}", code)

    def logs(self, since_epoch: float) -> list[str]:
        path = self.log_path
        return _read_new_lines(self, path) if path else []

    def close(self) -> None:
        self.stop()
        time.sleep(0)  # nothing else to undo: the ledger entry goes with the process


def open_target(spec: TargetSpec, workdir: Path) -> Target:
    if spec.kind == "sim":
        return SimTarget(spec, workdir)
    if spec.kind == "process":
        return ProcessTarget(spec, workdir)
    if spec.kind == "vllm":
        return VllmTarget(spec, workdir)
    if spec.kind in ("command", "systemd", "docker", "kubectl", "ollama"):
        return CommandTarget(spec)
    raise ConfigError(f"unknown target kind {spec.kind!r}")


__all__ = [
    "STOP_GRACE_S",
    "ProcessTarget",
    "SimTarget",
    "VllmTarget",
    "clean_vllm_leftovers",
    "group_members",
    "free_port",
    "group_stopped",
    "open_target",
    "stop_group",
]
