"""Where the store lives: option, then $VRAMLAB_DB, then ./vramlab.db; URL normalisation."""

from __future__ import annotations

import os
import re
from pathlib import Path

from vramlab.errors import ConfigError

DEFAULT_PATH = "vramlab.db"
ENV_VAR = "VRAMLAB_DB"


def resolve_url(url: str | None = None) -> str:
    """A SQLAlchemy URL from a user's `--db` value (or $VRAMLAB_DB, or ./vramlab.db).

    Plain paths become SQLite files (parent folders created); `postgresql://` and `postgres://`
    become `postgresql+psycopg://` (psycopg 3).
    """
    if url is not None and not url.strip():  # given, and empty: an unset variable, not "the default"
        raise ConfigError("an empty store: give a file path, sqlite:///PATH or postgresql://...")
    raw = (url or os.environ.get(ENV_VAR) or DEFAULT_PATH).strip()
    if raw.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + raw.split("://", 1)[1]
    if raw.startswith("postgresql+"):
        return raw
    if raw.startswith("sqlite:"):
        if not raw.startswith("sqlite:///") and raw not in ("sqlite:", "sqlite://"):
            rest = raw.split(":", 1)[1].lstrip("/")
            raise ConfigError(
                f"store URL {raw!r}: a SQLite URL has three slashes before a relative path and four "
                f"before an absolute one (sqlite:///{rest} or sqlite:////{rest}), or give the path alone"
            )
        path = raw.split(":///", 1)[1] if ":///" in raw else ""
    elif "://" in raw:
        scheme = raw.split("://", 1)[0]
        raise ConfigError(
            f"unsupported store URL scheme {scheme!r}: use a file path, sqlite:///PATH or postgresql://..."
        )
    else:
        path = raw
    if not path or path == ":memory:":
        raise ConfigError("the store needs a file (an in-memory SQLite database would vanish at exit)")
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{p}"


def describe_url(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
