"""Line charts as inline SVG: no plotting library, so the HTML report is one small file."""

from __future__ import annotations

import math
from html import escape

from vramlab.report.blocks import Chart

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 170, 30, 45
# Phases own blue / red / green (stripe fill, band colour, the caption's words); the series use the
# other colours so a line is never mistaken for a phase.
PHASE_COLOURS = {
    "baseline": ("#dbe9f8", "#1f77b4", "blue"),
    "treatment": ("#fbdedb", "#d62728", "red"),
    "ramp": ("#fbdedb", "#d62728", "red"),
    "recovery": ("#dcf2dc", "#2ca02c", "green"),
}
PALETTE = ("#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79")
SHADES = {k: v[0] for k, v in PHASE_COLOURS.items()}
OTHER = ("#eeeeee", "#555555", "grey")


def phase_of(label: str) -> str:
    """The phase a shade or band is of: `r1 baseline` -> baseline, `baseline P95 range` -> baseline."""
    return next((w for w in label.split() if w in PHASE_COLOURS), "")


def shade_caption(phases: list[str]) -> str:
    """The chart caption's colour key, from the same table the SVG paints with."""
    seen = list(dict.fromkeys(p for p in phases if p in PHASE_COLOURS))
    return ", ".join(f"{p} ({PHASE_COLOURS[p][2]})" for p in seen)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering lo..hi (none for a range no float can step through:
    non-finite, or so far from 0 that adding a step changes nothing, as a stored 1e30 would)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + max(1.0, abs(lo) * 1e-6)
    raw = (hi - lo) / n
    if not math.isfinite(raw) or raw <= 0:
        return []
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    if last - first > 4 * n:  # a step too small for these magnitudes
        return []
    return [round(k * step, 10) for k in range(first, last + 1)]


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return f"{v:.3g}"
    return f"{v:g}"


def _span(lo: float, hi: float) -> tuple[float, float]:
    """An axis from lo to hi that floats can divide: hi above lo even where lo is so large (a
    stored 1e30) that adding 1 changes nothing."""
    if not hi > lo:
        hi = lo + max(1.0, abs(lo) * 1e-9)
    return lo, hi


def render_svg(chart: Chart) -> str:
    xs = [x for s in chart.series for x, _ in s.points] + [m.x for m in chart.markers]
    xs = [x for x in xs + [v for sh in chart.shades for v in (sh.start, sh.end)] if math.isfinite(x)]
    ys = [y for s in chart.series for _, y in s.points] + [v for b in chart.bands for v in (b.lo, b.hi)]
    ys = [y for y in ys if math.isfinite(y)]
    if not xs or not ys:
        return f'<p class="empty">{escape(chart.title)}: no data</p>'
    x0, x1 = _span(min(xs) - 1, max(xs) + 1) if min(xs) == max(xs) else _span(min(xs), max(xs))
    y0, y1 = _span(0.0 if chart.y_min_zero else min(ys), max(ys))
    y1 = _span(y0, y1 + (y1 - y0) * 0.05)[1]
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{escape(chart.title)}">',
        f"<title>{escape(chart.title)}</title>",
        f'<text x="{LEFT}" y="18" class="ct">{escape(chart.title)}</text>',
    ]
    for sh in chart.shades:
        a, b = px(sh.start), px(sh.end)
        color = PHASE_COLOURS.get(phase_of(sh.label), OTHER)[0]
        out.append(
            f'<rect x="{a:.1f}" y="{TOP}" width="{max(b - a, 0.5):.1f}" height="{ph}" fill="{color}">'
            f"<title>{escape(sh.label)}</title></rect>"
        )
    for i, band in enumerate(chart.bands):
        # The first band (the baseline, the reference) is filled; later ones (recovery) are drawn as
        # their two edges only, so overlapping ranges stay readable instead of mixing colours.
        top, bot = py(band.hi), py(band.lo)
        color = PHASE_COLOURS.get(phase_of(band.label), OTHER)[1]
        if i == 0:
            out.append(
                f'<rect x="{LEFT}" y="{top:.1f}" width="{pw}" height="{max(bot - top, 1.5):.1f}" '
                f'fill="{color}" fill-opacity="0.18"><title>{escape(band.label)}</title></rect>'
            )
        else:
            out += [
                f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
                f'stroke-width="1.2" stroke-dasharray="8,4"><title>{escape(band.label)}</title></line>'
                for y in (top, bot)
            ]
    for t in nice_ticks(y0, y1):
        y = py(t)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tk">{fmt_tick(t)}</text>')
    for t in nice_ticks(x0, x1, 8):
        x = px(t)
        out.append(
            f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle" class="tk">{fmt_tick(t)}</text>'
        )
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append(
        f'<text x="{LEFT + pw / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle" class="al">'
        f"{escape(chart.x_label)}</text>"
    )
    out.append(
        f'<text x="14" y="{TOP + ph / 2:.1f}" text-anchor="middle" class="al" '
        f'transform="rotate(-90 14 {TOP + ph / 2:.1f})">{escape(chart.y_label)}</text>'
    )
    for m in chart.markers:
        x = px(m.x)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="#555" '
            f'stroke-dasharray="3,3"><title>{escape(m.label)}</title></line>'
        )
    legend_y = TOP + 8
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(s.points)
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8"{dash}>'
            f"<title>{escape(s.name)}</title></polyline>"
        )
        if len(pts) <= 40:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
        out.append(
            f'<line x1="{LEFT + pw + 10}" x2="{LEFT + pw + 28}" y1="{legend_y}" y2="{legend_y}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{LEFT + pw + 32}" y="{legend_y + 4}" class="lg">{escape(s.name)}</text>')
        legend_y += 16
    for i, band in enumerate(chart.bands):
        color = PHASE_COLOURS.get(phase_of(band.label), OTHER)[1]
        swatch = (
            f'<rect x="{LEFT + pw + 10}" y="{legend_y - 5}" width="18" height="10" fill="{color}" '
            'fill-opacity="0.3"/>'
            if i == 0
            else f'<line x1="{LEFT + pw + 10}" x2="{LEFT + pw + 28}" y1="{legend_y}" y2="{legend_y}" '
            f'stroke="{color}" stroke-dasharray="8,4"/>'
        )
        out.append(
            swatch + f'<text x="{LEFT + pw + 32}" y="{legend_y + 4}" class="lg">{escape(band.label)}</text>'
        )
        legend_y += 16
    for name in dict.fromkeys(phase_of(sh.label) for sh in chart.shades):
        fill = PHASE_COLOURS.get(name, OTHER)[0]
        out.append(
            f'<rect x="{LEFT + pw + 10}" y="{legend_y - 5}" width="18" height="10" fill="{fill}" '
            f'stroke="#bbb"/><text x="{LEFT + pw + 32}" y="{legend_y + 4}" class="lg">'
            f"{escape(name or 'other')} (shaded)</text>"
        )
        legend_y += 16
    out.append("</svg>")
    return "\n".join(out)
