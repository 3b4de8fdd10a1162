"""Evidence for naming a failure: is there an out-of-memory anywhere, and how did a process end?

A drill calls a failure an OOM only when it *saw* one: the engine's own error text in a
response or its log, a CUDA/HIP out-of-memory signature, or the kernel's OOM killer. A process
that died by SIGKILL with none of these is "killed by signal", whoever sent it.

- `oom_text(text)`: the OOM wording in a response body or a log line (the engines' signatures in
  `vramlab.logs.signatures`, plus the kernel OOM killer's and HIP's own words), or None.
- `exit_evidence(code)`: a process's exit code in words: a signal (Popen's negative code, or a
  shell's 128+N), or an exit status.
- `oom_kill_count(pid)`: the kernel OOM killer's counter for the cgroup a process runs in
  (cgroup v2 `memory.events`, v1 `memory.oom_control`); read before the start and after the exit,
  a rise is the kernel's evidence that it killed something there.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

# The kernel's own words (mm/oom_kill.c): "Out of memory: Killed process 1234 (python)" and
# "oom-kill:constraint=..."; "Memory cgroup out of memory: Killed process ..." for a cgroup limit.
_KERNEL_OOM = re.compile(
    r"Out of memory: Kill(?:ed)? process \d+|oom-kill:constraint=|oom_reaper: reaped process"
)
# HIP's error names (hipErrorOutOfMemory = 2) and the ROCm allocator's wording.
_HIP_OOM = re.compile(
    r"hipErrorOutOfMemory|HIP out of memory|hip(?:Malloc|MallocAsync) failed.*out of memory", re.I
)
_GENERIC_OOM = re.compile(r"\bout of memory\b|OutOfMemoryError|cudaErrorMemoryAllocation", re.I)


def oom_text(text: str | None, engine: str | None = None) -> str | None:
    """The name of the OOM signature *text* carries, or None (no OOM was said)."""
    if not text:
        return None
    from vramlab.logs.signatures import OOM, classify_line

    for line in text.splitlines() or [text]:
        sig = classify_line(line, engine)
        if sig is not None and sig.kind == OOM:
            return sig.name
        if _KERNEL_OOM.search(line):
            return "kernel.oom_killer"
        if _HIP_OOM.search(line):
            return "hip.out_of_memory"
        if _GENERIC_OOM.search(line):
            return "text.out_of_memory"
    return None


def signal_of(exit_code: int | None) -> tuple[int, str] | None:
    """(signal number, how it was read) when *exit_code* says a signal ended the process."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code, "exit code"
    if 128 < exit_code < 128 + 65:  # sh/bash report a child killed by signal N as 128+N
        return exit_code - 128, "shell exit status 128+N"
    return None


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def exit_evidence(exit_code: int | None) -> str:
    """A process's end in words, e.g. 'killed by signal 9 (SIGKILL)' or 'exited with code 1'."""
    sig = signal_of(exit_code)
    if sig is not None:
        num, how = sig
        via = "" if how == "exit code" else f", {how} {exit_code}"
        return f"killed by signal {num} ({signal_name(num)}{via})"
    return "exit code unknown" if exit_code is None else f"exited with code {exit_code}"


def _cgroup_files(pid: int) -> list[Path]:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    out: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":  # cgroup v2
            out += [
                Path("/sys/fs/cgroup" + path.rstrip("/")) / "memory.events",
                Path("/sys/fs/cgroup/memory.events"),
            ]
        elif "memory" in ctrls.split(","):
            out += [
                Path("/sys/fs/cgroup/memory" + path.rstrip("/")) / "memory.oom_control",
                Path("/sys/fs/cgroup/memory/memory.oom_control"),
            ]  # a cgroup namespace shows ours at the root
    return out


def oom_kill_count(pid: int) -> tuple[int, str] | None:
    """(oom_kill counter, the file it came from) for *pid*'s memory cgroup, or None if unreadable."""
    for f in _cgroup_files(pid):
        try:
            text = f.read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        if m:
            return int(m.group(1)), str(f)
    return None


__all__ = ["exit_evidence", "oom_kill_count", "oom_text", "signal_name", "signal_of"]
