"""Output paths: checked before the work, written after it without leaving half a file.

`check_writable` runs before any work for every `-o`, `--plot` and report path: a missing
folder, a folder given as the file, a device (`/dev/full`), a file or folder that cannot be
written, a full file system is one line and exit 2, not a traceback after a ten-minute drill.
`check_store` does the same for a SQLite `--db` path. `output_file` writes the result through
a temporary file beside the target (renamed into place), so a write that fails after the work
(the disk filled meanwhile) leaves the old file as it was and ends in exit 1, saying what was kept.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from vramlab.errors import ConfigError, OutputError


def check_writable(path: str | Path, what: str = "output") -> Path:
    """*path* if a file can be written there, else ConfigError (exit 2) saying why."""
    p = Path(path).expanduser()
    if str(p) == os.devnull:
        return p
    try:
        st: os.stat_result | None = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a path through a file ("x.txt/out.png"), a loop of links
        raise ConfigError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {str(p)!r} is a folder; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {str(p)!r} is not a regular file (a device or a pipe); give a file name")
    parent = p.parent
    if not parent.is_dir():
        why = "does not exist" if not parent.exists() else "is not a folder"
        raise ConfigError(f"cannot write {what} {str(p)!r}: the folder {str(parent)!r} {why}")
    _probe(p if st is not None else parent, p, what)
    try:
        full = os.statvfs(parent).f_bavail == 0
    except OSError:
        full = False
    if full:
        raise ConfigError(f"cannot write {what} {str(p)!r}: the file system is full")
    return p


def _probe(target: Path, p: Path, what: str) -> None:
    """Try what the write will do: open the existing file for appending (nothing written), or
    create and remove a file in the folder. Permission bits alone mislead (root, read-only mounts)."""
    try:
        if target == p:
            with open(p, "ab"):
                pass
        else:
            fd, name = _temp_in(target, p.name)
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        raise ConfigError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}") from None


def _temp_in(folder: Path, name: str) -> tuple[int, str]:
    """A new hidden file beside the target, with the target's extension (a plotter picks its
    format from it)."""
    import tempfile

    stem, dot, ext = name.rpartition(".")
    return tempfile.mkstemp(
        prefix=f".{stem or ext}.", suffix=f".part{dot}{ext}" if stem else ".part", dir=folder
    )


@contextlib.contextmanager
def output_file(path: str | Path, what: str, kept: str = "nothing else was written") -> Iterator[Path]:
    """A temporary path to write *what* to; renamed onto *path* when the block ends.

    An OSError (from the block or the rename) removes the temporary file and becomes an
    OutputError (exit 1): "cannot write report r.html: No space left on device; <kept>"."""
    p = Path(path).expanduser()
    if str(p) == os.devnull:
        yield p
        return
    try:
        fd, name = _temp_in(p.parent, p.name)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}; {kept}") from None
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(p))
        os.replace(tmp, p)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}; {kept}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _mode_for(p: Path) -> int:
    """The file mode a plain open() would give: the old file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def write_output(
    path: str | Path, data: str | bytes, what: str, kept: str = "nothing else was written"
) -> None:
    """Write *data* (text as UTF-8) to *path* through `output_file`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with output_file(path, what, kept) as tmp, open(tmp, "wb") as fh:
        fh.write(raw)
        fh.flush()
        os.fsync(fh.fileno())  # a full disk shows here, not after the rename


def check_store(db: str | None) -> None:
    """The SQLite file a `--db` value (or $VRAMLAB_DB, or ./vramlab.db) names, checked before any
    work: its folder can be made and written, and the file, if there, is a regular file. A
    PostgreSQL URL is left to the connection."""
    from vramlab.store import DEFAULT_PATH, ENV_VAR

    raw = (db or os.environ.get(ENV_VAR) or DEFAULT_PATH).strip()
    if raw.startswith("sqlite:") and ":///" in raw:
        raw = raw.split(":///", 1)[1]
    elif "://" in raw or raw.startswith("sqlite:") or raw in ("", ":memory:"):
        return  # a server URL, or a form the store refuses with its own line
    p = Path(raw).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"cannot open the store {raw!r}: {exc.strerror or exc}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError(f"the store {raw!r} is {kind}; give a SQLite file path")
        return  # an existing file: the store opens it and says what is wrong with it
    try:
        p.parent.mkdir(
            parents=True, exist_ok=True
        )  # the store creates missing folders (docs/store-and-reports.md)
    except OSError as exc:
        raise ConfigError(f"cannot create the store {raw!r}: {exc.strerror or exc}") from None
    _probe(p.parent, p, "the store")
