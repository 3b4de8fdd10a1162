"""The report's charts: latency and errors per step, GPU memory and KV cache over time.

One of them is the key chart, drawn on the report's first screen beside the verdict (the `answer`
section): an experiment's latency per step (what its hypothesis is about), a drill's GPU memory
over time (the failure on the card). The "Charts" section draws the others, so none is drawn twice.
"""

from __future__ import annotations

from typing import Any

from vramlab.records.events import EventKind
from vramlab.report import fmt
from vramlab.report.blocks import Band, Block, Chart, Marker, Series, Shade, Text
from vramlab.report.sections import ReportContext, Section
from vramlab.report.svg import phase_of, shade_caption

K = EventKind
MARKED_EVENTS = (K.STOP_CONDITION, K.ROLLBACK, K.OOM, K.ALERT, K.RECOVERED, K.ERROR)
# A local engine's model loads and unloads (Ollama's /api/ps): GPU memory moves with them.
MODEL_EVENTS = (K.MODEL_LOAD, K.MODEL_UNLOAD, K.MODEL_OFFLOAD)
GPU_MEMORY_TITLE = "GPU memory used over time (fullest GPU)"


def _step_charts(ctx: ReportContext) -> list[Chart]:
    a = ctx.analysis
    if not a.step_points:
        return []
    var = ctx.run.change.get("variable", "step")

    def x(p: Any) -> float:
        return p.step_value if p.step_value is not None else float(p.step)

    lat, err = [], []
    for rnd in a.rounds:
        pts = [p for p in a.step_points if p.round == rnd]
        lat.append(
            Series(f"round {rnd} E2E P95", [(x(p), p.e2e_p95_ms) for p in pts if p.e2e_p95_ms is not None])
        )
        err.append(Series(f"round {rnd} error %", [(x(p), p.error_rate * 100) for p in pts]))
    lat_bands = [Band(f"{b.phase} P95 range", *b.e2e_p95_ms) for b in a.bands if b.e2e_p95_ms]
    err_bands = [
        Band(f"{b.phase} error range", b.error_rate[0] * 100, b.error_rate[1] * 100) for b in a.bands
    ]
    return [
        Chart(f"E2E latency P95 per {var}", var, "ms", lat, bands=lat_bands),
        Chart(f"Error rate per {var}", var, "%", err, bands=err_bands),
    ]


def _time_charts(ctx: ReportContext) -> list[Chart]:
    a = ctx.analysis
    shades = [
        Shade(f"r{p.window.round} {p.window.phase}", p.window.start_s, p.window.end_s) for p in a.phases
    ]
    markers = [
        Marker(e.t_s, f"{e.kind}: {e.message}") for e in a.events if e.kind in (*MARKED_EVENTS, *MODEL_EVENTS)
    ]
    out = []
    for name, title, y_label, label, scale, zero in (
        ("gpu.memory_used_bytes", GPU_MEMORY_TITLE, "GiB", "GPU memory used", 1 / fmt.GIB, False),
        ("engine.kv_cache_usage_perc", "KV cache usage over time", "%", "KV cache usage", 100.0, True),
        (
            "ollama.vram_bytes",
            "Ollama's loaded models on the GPU over time (/api/ps size_vram)",
            "GiB",
            "loaded models' GPU memory",
            1 / fmt.GIB,
            True,
        ),
    ):
        points = a.timeline.get(name)
        if points:
            series = [Series(label, [(t, v * scale) for t, v in points])]
            out.append(
                Chart(
                    title,
                    "seconds from start",
                    y_label,
                    series,
                    shades=shades,
                    markers=markers,
                    y_min_zero=zero,
                )
            )
    return out


def all_charts(ctx: ReportContext) -> list[Chart]:
    """Every chart of the report, in reading order, built once per report."""
    return ctx.memo("charts", lambda: _step_charts(ctx) + _time_charts(ctx))


def key_chart(ctx: ReportContext) -> Chart | None:
    """The one chart the answer shows: a drill's GPU memory over time (the failure on the card),
    else the first (an experiment's latency per step, what its hypothesis is about)."""
    charts = all_charts(ctx)
    if ctx.run.kind == "drill":
        gpu = next((c for c in charts if c.title == GPU_MEMORY_TITLE), None)
        if gpu is not None:
            return gpu
    return charts[0] if charts else None


def colour_key(shown: list[Chart]) -> str:
    """How the shown charts are coloured, in words: the phases' stripes and bands, the markers."""
    phases = [phase_of(sh.label) for c in shown for sh in c.shades]
    phases += [phase_of(b.label) for c in shown for b in c.bands]
    key = shade_caption(phases)
    parts = [f"Shaded and banded by phase: {key}." if key else ""]
    if any(c.markers for c in shown):
        parts.append("Grey dashed vertical lines: stop conditions, rollbacks, OOMs, alerts.")
    if any(len(c.series) > 1 for c in shown):
        parts.append("The lines per round are in the other colours.")
    return " ".join(p for p in parts if p)


def charts(ctx: ReportContext) -> list[Block]:
    key = key_chart(ctx)
    rest = [c for c in all_charts(ctx) if c is not key]
    if not rest:
        return []
    key_text = colour_key(rest)
    return [*([Text(key_text)] if key_text else []), *rest]


SECTIONS = (Section("charts", "Charts", charts, order=60),)
