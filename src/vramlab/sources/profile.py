"""Reading a calibration profile file (TOML) into `vramlab.capacity.calibration.Profile`.

The profile's structure, and turning parsed TOML into one, stay in `capacity` (no I/O there);
the file read lives here with the other readers of facts from disk. TOML is read with the
standard library's `tomllib` on Python 3.11+ and with `tomli` (the same parser, a declared
dependency on 3.10) before that.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vramlab.capacity.calibration import Profile, profile_from_dict
from vramlab.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def load_profile(path: Any) -> Profile:
    """Read a profile file; a missing, unreadable or malformed one raises ConfigError."""
    from vramlab.infile import read_text

    p = Path(path)
    text = read_text(p, "calibration profile", expect="a calibration profile is TOML")
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a calibration profile") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None
    return profile_from_dict(data, p.name)


__all__ = ["load_profile"]
