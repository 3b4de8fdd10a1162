"""Output paths checked before the work: a report that cannot be written is refused up front,
not after a ten-minute drill."""

from __future__ import annotations

import os
from pathlib import Path

from vramlab.errors import ConfigError


def check_writable(path: str | Path, what: str = "output") -> Path:
    """*path* if a file can be written there (creating missing parent folders), else ConfigError."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a directory; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}") from None
    target = p if p.exists() else parent
    if not os.access(target, os.W_OK) or (target is parent and not os.access(parent, os.X_OK)):
        raise ConfigError(f"cannot write {what} {str(p)!r}: permission denied or read-only file system")
    return p
