"""The memory map picture: per card, what is resident, what is loaded on demand, and what was not
placed at all.

Residents stack from the bottom (weights, KV cache, activation, overhead, margin) in one solid bar;
what is left under the card's line (dashed) is free. On-demand instances are drawn apart, beside
the card's bar: each hatched bar starts where the residents end, so it shows that the instance
fits the free room when it is loaded, and several of them stand side by side because they take
turns in that room, never all at once. Instances that were not placed are listed under the chart
with the reason. The legend sits outside the bars; the layout engine keeps every text inside the
picture (a long title wraps).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

    from vramlab.placement.pack import Placement
    from vramlab.placement.result import FleetPlan

from vramlab.units import GIB

COLOURS = {
    "weights": "#4c72b0",
    "kv cache": "#55a868",
    "activation": "#c44e52",
    "overhead": "#8172b2",
    "margin": "#ccb974",
    "free": "#eeeeee",
}
RESIDENT_W, ON_DEMAND_W, GAP = 0.5, 0.22, 0.05  # bar widths, in card-slot units
HATCH = "//"
LEGEND_IN = 2.4  # the legend's column, right of the axes


@dataclass(frozen=True)
class CardSlot:
    """Where one card's bars go on the x axis: the resident bar at `x`, its on-demand bars after it."""

    card: int
    x: float
    on_demand: tuple[Placement, ...]

    def on_demand_x(self, k: int) -> float:
        return self.x + RESIDENT_W / 2 + GAP + ON_DEMAND_W / 2 + k * (ON_DEMAND_W + GAP)

    @property
    def right(self) -> float:
        return (
            self.on_demand_x(len(self.on_demand) - 1) + ON_DEMAND_W / 2
            if self.on_demand
            else self.x + RESIDENT_W / 2
        )


def _parts(p: Placement) -> list[tuple[str, int]]:
    d = p.demand
    return [
        ("weights", d.weights_bytes),
        ("kv cache", d.kv_cache_bytes),
        ("activation", d.activation_bytes),
        ("overhead", d.overhead_bytes),
        ("margin", d.margin_bytes),
    ]


def _label(p: Placement) -> str:
    return p.instance + (f" (tp{p.tp})" if p.tp > 1 else "")


def slots(plan: FleetPlan) -> list[CardSlot]:
    """The cards drawn (those used, else all), left to right, each wide enough for its on-demand bars."""
    r = plan.result
    cards = list(r.cards_used) or [c.index for c in plan.inputs.fleet.cards]
    out, x = [], 0.0
    for c in cards:
        od = tuple(sorted(r.on_card(c, "on-demand"), key=lambda p: -p.demand.total_bytes))
        slot = CardSlot(c, x, od)
        out.append(slot)
        x = slot.right + 0.55 + RESIDENT_W / 2
    return out


def _stack(ax: Any, x: float, width: float, bottom: float, p: Placement, hatch: str | None) -> float:
    """One instance's components from *bottom*, outlined as one block; returns its top (GiB)."""
    start = bottom
    for part, nbytes in _parts(p):
        h = nbytes / GIB
        if h > 0:
            ax.bar(
                x,
                h,
                bottom=bottom,
                width=width,
                color=COLOURS[part],
                hatch=hatch,
                edgecolor="white",
                linewidth=0.5,
                alpha=0.55 if hatch else 1.0,
            )
            bottom += h
    ax.bar(
        x,
        bottom - start,
        bottom=start,
        width=width,
        fill=False,
        edgecolor="black",
        linewidth=1.0,
        linestyle="--" if hatch else "-",
        label=f"{'on-demand' if hatch else 'resident'}: {p.instance}",
    )
    return bottom


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    """Wrap *text* to the figure's width (a character is about 0.55 of the font size wide)."""
    chars = max(20, int(width_in * 72 / (fontsize * 0.55)))
    return "\n".join(textwrap.wrap(text, chars))


def not_placed_text(plan: FleetPlan) -> str:
    """The instances pack could not place, with the first clause of why."""
    items = [f"{name} ({why.split(' (')[0]})" for name, why in plan.result.unplaced]
    return "Not placed: " + "; ".join(items) if items else ""


def _draw_card(ax: Any, plan: FleetPlan, slot: CardSlot) -> list[tuple[float, float, float, str]]:
    """One card: the residents' solid stack, the free room up to the card's line, each on-demand
    instance hatched beside it from the residents' top. Returns the on-demand bars (x, bottom, top,
    label), labelled once the axis' height is known."""
    cap = plan.inputs.fleet.cards[slot.card].memory_bytes / GIB
    bottom, bars = 0.0, []
    for p in sorted(plan.result.on_card(slot.card, "resident"), key=lambda p: -p.demand.total_bytes):
        start = bottom
        bottom = _stack(ax, slot.x, RESIDENT_W, bottom, p, None)
        ax.text(
            slot.x,
            (start + bottom) / 2,
            _label(p),
            ha="center",
            va="center",
            fontsize=7,
            color="white",
            fontweight="bold",
            clip_on=True,
        )
    if bottom < cap:
        ax.bar(
            slot.x,
            cap - bottom,
            bottom=bottom,
            width=RESIDENT_W,
            color=COLOURS["free"],
            edgecolor="grey",
            linewidth=0.5,
        )
    for k, p in enumerate(slot.on_demand):
        x = slot.on_demand_x(k)
        bars.append((x, bottom, _stack(ax, x, ON_DEMAND_W, bottom, p, HATCH), _label(p)))
    ax.hlines(
        cap,
        slot.x - RESIDENT_W / 2 - 0.05,
        slot.right + 0.05,
        colors="black",
        linestyles="dashed",
        linewidth=1,
    )
    return bars


def _legend(fig: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = [Patch(color=v, label=k) for k, v in COLOURS.items()]
    handles += [
        Patch(facecolor="white", edgecolor="black", label="resident: room kept for it"),
        Patch(
            facecolor="white",
            edgecolor="black",
            hatch=HATCH,
            linestyle="--",
            label="on-demand: loaded into the\nfree room, one at a time",
        ),
        Line2D([], [], color="black", linestyle="--", label="card memory"),
    ]
    fig.legend(handles=handles, fontsize=7, loc="outside right upper")


def draw_memory_map(plan: FleetPlan) -> Figure:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    fleet, r = plan.inputs.fleet, plan.result
    cards = slots(plan)
    span = cards[-1].right - cards[0].x + RESIDENT_W if cards else 1.0
    width_in = max(6.5, 2.2 * span + LEGEND_IN + 1.2)
    fig, ax = plt.subplots(figsize=(width_in, 6.2), layout="constrained")
    bars = [bar for slot in cards for bar in _draw_card(ax, plan, slot)]
    tops = [fleet.cards[s.card].memory_bytes / GIB for s in cards] + [hi for _, _, hi, _ in bars]
    top_gib = max(tops, default=1.0) * 1.12  # room for the labels above short bars
    ax.set_ylim(0, top_gib)
    for x, lo, hi, label in bars:  # inside a tall bar, above a short one
        inside = hi - lo >= 0.12 * top_gib
        ax.text(
            x,
            (lo + hi) / 2 if inside else hi + 0.01 * top_gib,
            label,
            ha="center",
            va="center" if inside else "bottom",
            rotation=90,
            fontsize=7,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0} if inside else None,
        )
    ax.set_xticks([s.x for s in cards])
    ax.set_xticklabels(
        [f"{fleet.cards[s.card].label}\n{fleet.cards[s.card].gpu_name}" for s in cards], fontsize=8
    )
    if cards:
        ax.set_xlim(cards[0].x - 0.6, cards[-1].right + 0.4)
    ax.set_ylabel("GiB (2^30 bytes) per GPU")
    placed = sum(1 for i in plan.inputs.instances if r.placement(i.name))
    title = (
        f"vramlab pack: memory map per card. {placed} of {len(plan.inputs.instances)} instances placed on "
        f"{len(r.cards_used)} of {len(fleet.cards)} cards"
    )
    ax.set_title(_wrap(title, width_in - LEGEND_IN, 10), fontsize=10)  # over the axes, clear of the legend
    _legend(fig)
    missing = not_placed_text(plan)
    if missing:
        fig.supxlabel(_wrap(missing, width_in, 8), fontsize=8, color="#b22222", ha="left", x=0.01)
    return fig


def plot_memory_map(plan: FleetPlan, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = draw_memory_map(plan)
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
