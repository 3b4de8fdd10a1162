"""The memory map picture: one stacked bar per card, instance by instance, component by component.

Residents stack from the bottom (weights, KV cache, activation, overhead, margin); what is left
is free. On-demand instances are drawn hatched above the residents: they share that free room,
so their stack may rise above the card's line, which is the point of showing them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def plot_memory_map(plan: FleetPlan, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fleet, r = plan.inputs.fleet, plan.result
    cards = list(r.cards_used) or [c.index for c in fleet.cards]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.9 * len(cards) + 2), 6))
    for x, c in enumerate(cards):
        card = fleet.cards[c]
        bottom = 0.0
        for residency, hatch in (("resident", None), ("on-demand", "//")):
            for p in sorted(r.on_card(c, residency), key=lambda p: -p.demand.total_bytes):
                d = p.demand
                start = bottom
                for part, nbytes in (
                    ("weights", d.weights_bytes),
                    ("kv cache", d.kv_cache_bytes),
                    ("activation", d.activation_bytes),
                    ("overhead", d.overhead_bytes),
                    ("margin", d.margin_bytes),
                ):
                    h = nbytes / GIB
                    if h > 0:
                        ax.bar(
                            x,
                            h,
                            bottom=bottom,
                            width=0.6,
                            color=COLOURS[part],
                            hatch=hatch,
                            edgecolor="white",
                            linewidth=0.5,
                            alpha=0.55 if hatch else 1.0,
                        )
                        bottom += h
                ax.bar(
                    x, bottom - start, bottom=start, width=0.6, fill=False, edgecolor="black", linewidth=1.0
                )
                label = p.instance + (f" (tp{p.tp})" if p.tp > 1 else "") + (" od" if hatch else "")
                ax.text(x + 0.33, (start + bottom) / 2, label, va="center", fontsize=7)
            if residency == "resident":
                cap = card.memory_bytes / GIB
                if bottom < cap:
                    ax.bar(
                        x,
                        cap - bottom,
                        bottom=bottom,
                        width=0.6,
                        color=COLOURS["free"],
                        edgecolor="grey",
                        linewidth=0.5,
                    )
        ax.hlines(card.memory_bytes / GIB, x - 0.4, x + 0.4, colors="black", linestyles="dashed", linewidth=1)
    ax.set_xticks(range(len(cards)))
    ax.set_xticklabels([f"{fleet.cards[c].label}\n{fleet.cards[c].gpu_name}" for c in cards], fontsize=8)
    ax.set_xlim(-0.6, len(cards) - 0.4 + 0.9)
    ax.set_ylabel("GiB (2^30 bytes) per GPU")
    ax.set_title("vramlab pack: memory map per card (hatched = on-demand; dashed = card memory)", fontsize=9)
    ax.legend(handles=[Patch(color=v, label=k) for k, v in COLOURS.items()], fontsize=7, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
