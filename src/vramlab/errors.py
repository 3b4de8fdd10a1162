"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class VramlabError(Exception):
    """A problem with the user's input or environment, worded for the user."""

    exit_code = 2


class NotFoundError(VramlabError):
    """A named thing (model, GPU, run) does not exist; the message suggests near matches."""


class ConfigError(VramlabError):
    """A file or setting is malformed or impossible."""


def near_matches(name: str, choices: list[str], n: int = 3) -> list[str]:
    """Closest names to *name*, for 'did you mean' hints."""
    import difflib

    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    contained = [c for c in choices if name.lower() in c.lower() and c not in hits]
    return ([lowered[h] for h in hits] + contained)[:n]


def unknown(kind: str, name: str, choices: list[str]) -> NotFoundError:
    hint = near_matches(name, choices)
    msg = f"unknown {kind} {name!r}"
    if hint:
        msg += "; did you mean " + ", ".join(repr(h) for h in hint) + "?"
    return NotFoundError(msg)


class OutputError(VramlabError):
    """A result could not be written after the work was done; the message says what was kept."""

    exit_code = 1
