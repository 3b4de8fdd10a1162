"""Terminal progress as an event subscriber: a live status line with rich on a terminal, plain
lines otherwise (CI logs, pipes). Only phase ends, stops, warnings, notes and rollbacks print."""

from __future__ import annotations

import sys
from typing import TextIO

from vramlab.records import RequestRecord
from vramlab.run.events import Event, EventKind

K = EventKind
_LINE_KINDS = {K.PHASE_END, K.STOP_CONDITION, K.WARNING, K.NOTE, K.ROLLBACK, K.ERROR, K.RUN_END, K.STEP}
_TAGS: dict[str, str] = {
    K.STOP_CONDITION: "STOP ",
    K.WARNING: "warn ",
    K.ERROR: "error",
    K.NOTE: "note ",
    K.ROLLBACK: "rollback",
}


def _tag(ev: Event) -> str:
    return _TAGS.get(ev.kind, "")


class PlainProgress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def __call__(self, ev: Event) -> None:
        if ev.kind == K.RUN_START:
            print(f"[{ev.t_s:7.1f}s] {ev.message}", file=self.stream, flush=True)
        elif ev.kind in _LINE_KINDS and ev.message:
            tag = _tag(ev)
            print(f"[{ev.t_s:7.1f}s] {tag + ': ' if tag else ''}{ev.message}", file=self.stream, flush=True)

    def close(self) -> None:
        return None


class RichProgress:
    """Lines above, one live line below: the current window's requests, errors and elapsed time."""

    def __init__(self, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream or sys.stdout)
        self.live = Live("", console=self.console, refresh_per_second=4, transient=True)
        self.live.start()
        self.phase = ""
        self.n = self.err = 0
        self.started = 0.0

    def __call__(self, ev: Event) -> None:
        if ev.kind == K.PHASE_START:
            self.phase, self.n, self.err, self.started = ev.message, 0, 0, ev.t_s
        elif ev.kind == K.REQUEST and isinstance(rec := ev.payload, RequestRecord):
            if rec.error_class != "cancelled":
                self.n += 1
                self.err += 0 if rec.ok else 1
            self.live.update(
                f"[bold]{self.phase}[/]  {ev.t_s - self.started:5.1f} s  {self.n} requests  {self.err} errors"
            )
        if ev.kind == K.RUN_START or (ev.kind in _LINE_KINDS and ev.message):
            tag = _tag(ev)
            style = {"STOP ": "bold red", "warn ": "yellow", "error": "red"}.get(tag, "")
            text = f"[{ev.t_s:7.1f}s] {tag + ': ' if tag else ''}{ev.message}"
            self.console.print(text, style=style or None, markup=False, highlight=False)
        if ev.kind == K.RUN_END:
            self.close()

    def close(self) -> None:
        self.live.stop()


def make_progress(stream: TextIO | None = None) -> PlainProgress | RichProgress:
    s = stream or sys.stdout
    return RichProgress(s) if s.isatty() else PlainProgress(s)
