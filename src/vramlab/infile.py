"""The one reader for every file a command opens: plans, fleet and models files, model configs,
calibration profiles, traces, measurement files and engine logs.

Every read is bounded, in size and in time:

- a path is looked at with `os.stat` before it is opened: a folder, a device (`/dev/zero`, or a
  symlink to it), a socket is refused with one line, so nothing is opened that could never end;
- a regular file is opened with O_NONBLOCK and checked again (the path may change in between), and
  read up to a cap: a file bigger than the cap is refused, not read into memory;
- a pipe (standard input given as `-`, or a FIFO where *pipes* allows one: a log streamed by
  `kubectl logs`) is read with a timeout: a FIFO nobody opens for writing, or a writer that goes
  quiet, ends the read with one line instead of blocking forever. A terminal on standard input is
  refused (a log is piped in, not typed).

    text = read_text("plan.yaml", "plan")                 # str, UTF-8, at most DOCUMENT_BYTES
    data = read_bytes("m.safetensors.index.json", "safetensors index")
    with open_input(path, "log", pipes=True) as fh:       # a binary stream with readline()
        ...

Like `vramlab.errors`, every package may import this module.
"""

from __future__ import annotations

import io
import os
import select
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from vramlab.errors import ConfigError

MIB = 1 << 20
# A plan, a fleet, a config.json or a profile is a few KB; 16 MiB leaves room for a safetensors
# index of a huge checkpoint and refuses a pasted data set (or /proc/kcore) before it is parsed.
DOCUMENT_BYTES = 16 * MIB
# YAML (plans, fleets, models files) is parsed in Python, twice (values and their lines): a plan is
# a few dozen settings, so 1 MiB is generous and keeps a refusal instant.
YAML_BYTES = 1 * MIB
# Line-oriented data (request traces, measurement JSONL): many rows, still bounded.
DATA_BYTES = 256 * MIB


# How long a pipe may stay silent: until a FIFO's writer opens it, or between two reads.
def _wait_s() -> float:
    try:
        value = float(os.environ.get("VRAMLAB_PIPE_WAIT_S", "10"))
    except ValueError:
        return 10.0
    return value if 0 < value <= 3600 else 10.0  # nan, 0, negative or absurd: the default


PIPE_WAIT_S = _wait_s()


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input(path: str | Path, what: str, *, pipes: bool = False) -> os.stat_result:
    """The stat of *path* if it may be read as *what*: a regular file (or a FIFO when *pipes*)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such {what} file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the {what} file: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode) or (pipes and stat.S_ISFIFO(st.st_mode)):
        return st
    hint = " (pipe it into `-`, standard input, instead)" if pipes and stat.S_ISCHR(st.st_mode) else ""
    return _refuse(p, f"is {_kind(st.st_mode)}, not a {what} file{hint}")


def is_folder(path: str | Path) -> bool:
    """Whether *path* names a folder; False for anything that cannot be one, a name longer than the
    file system allows (ENAMETOOLONG) included, where `Path.is_dir` raises on Python 3.11."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return False


def exists(path: str | Path) -> bool:
    """Whether *path* names anything; False where it cannot (a name too long, a NUL byte)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _refuse(p: Path, why: str) -> os.stat_result:
    raise ConfigError(f"{p}: {why}")


def open_input(path: str | Path, what: str, *, pipes: bool = False, stdin: bool = False) -> BinaryIO:
    """A binary stream of *path*, checked as `check_input` does; '-' is standard input when *stdin*.

    A pipe (a FIFO, or standard input that is one) is read through a timeout: `PipeTimeout`
    (a ConfigError) when it stays silent for PIPE_WAIT_S seconds."""
    if stdin and str(path) == "-":
        fd = sys.stdin.fileno() if sys.stdin is not None else -1
        if fd < 0:
            raise ConfigError(f"no standard input to read the {what} from")
        if os.isatty(fd):
            raise ConfigError(
                f"standard input is a terminal: pipe the {what} into it "
                f"(e.g. `kubectl logs POD | vramlab check-log -`)"
            )
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            return os.fdopen(os.dup(fd), "rb")
        return io.BufferedReader(_PipeReader(os.dup(fd), "standard input", what), 1 << 16)
    p = Path(path)
    check_input(p, what, pipes=pipes)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the {what} file: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if stat.S_ISFIFO(st.st_mode) and pipes:
        return io.BufferedReader(_PipeReader(fd, str(p), what), 1 << 16)
    if not stat.S_ISREG(st.st_mode):  # the path changed between stat and open
        os.close(fd)
        _refuse(p, f"is {_kind(st.st_mode)}, not a {what} file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class PipeTimeout(ConfigError):
    """A pipe stayed silent for PIPE_WAIT_S seconds."""


class _PipeReader(io.RawIOBase):
    """A pipe read with a timeout per read, so a FIFO with no writer cannot block forever."""

    def __init__(self, fd: int, name: str, what: str) -> None:
        self.fd, self.name, self.what = fd, name, what
        self.started = False  # a first byte came: silence from now on means a writer that went quiet
        os.set_blocking(fd, False)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        woke = False  # select() said the pipe is ready: an empty read now is a writer that closed
        while True:
            try:
                n: int | None = os.readv(self.fd, [buf])
            except BlockingIOError:
                n = None
            # An empty read is the end, except on a FIFO opened with O_NONBLOCK before any writer.
            if n is not None and (n > 0 or self.started or woke or self.name == "standard input"):
                self.started = self.started or n > 0
                return n
            woke = bool(select.select([self.fd], [], [], PIPE_WAIT_S)[0])
            if not woke:
                said = "sent nothing more" if self.started else "had no writer"
                raise PipeTimeout(
                    f"{self.name}: the pipe {said} for {PIPE_WAIT_S:g} s; stopped reading the {self.what}"
                )

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self.fd)
            finally:
                super().close()


def read_bytes(path: str | Path, what: str, cap: int = DOCUMENT_BYTES) -> bytes:
    """The content of the regular file *path*, refused when it holds more than *cap* bytes."""
    p = Path(path)
    with open_input(p, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > cap:
            raise ConfigError(f"{p}: {_size(size)} is more than a {what} file may have ({_size(cap)})")
        try:
            data = fh.read(cap + 1)  # /proc files say size 0: the cap holds for them too
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the {what} file: {exc.strerror or exc}") from None
    if len(data) > cap:
        raise ConfigError(f"{p}: more than a {what} file may have ({_size(cap)})")
    return data


def read_text(path: str | Path, what: str, cap: int = DOCUMENT_BYTES, *, expect: str = "") -> str:
    """`read_bytes` decoded as UTF-8; a binary file is one line naming what was expected."""
    data = read_bytes(path, what, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = f"; {expect}" if expect else ""
        raise ConfigError(f"{Path(path)}: not UTF-8 text (byte {exc.start}){hint}") from None


def _size(n: int) -> str:
    return f"{n / MIB:,.1f} MiB" if n >= MIB else f"{n:,} bytes"


__all__ = [
    "DATA_BYTES",
    "DOCUMENT_BYTES",
    "PIPE_WAIT_S",
    "YAML_BYTES",
    "PipeTimeout",
    "check_input",
    "open_input",
    "read_bytes",
    "read_text",
]
