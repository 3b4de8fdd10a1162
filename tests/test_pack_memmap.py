"""Pack's memory map and residency table say what was placed and what was not: residents stacked in
the card's bar, on-demand instances drawn beside it (each from the residents' top, never stacked on
each other as if all loaded at once), instances without room listed, and no text cut off."""

from __future__ import annotations

from typing import Any

import pytest

from placement_fakes import TableDemand, fleet, inst
from vramlab.placement.inputs import Inputs
from vramlab.placement.memmap import draw_memory_map
from vramlab.placement.result import FleetPlan, plan_fleet, render_table

TABLE = {"res": {1: 12.0}, "od1": {1: 8.0}, "od2": {1: 8.0}, "a-model-with-a-long-name": {1: 40.0}}


def _plan(cards: int = 2) -> FleetPlan:
    insts = (
        inst("res"),
        inst("od1", residency="on-demand"),
        inst("od2", residency="on-demand"),
        inst("a-model-with-a-long-name"),  # 40 GiB: no 22 GiB card holds it
    )
    return plan_fleet(Inputs(fleet(("a", "l4", cards, 22.0)), insts), TableDemand(TABLE))


@pytest.fixture
def drawn():
    import matplotlib.pyplot as plt

    fig = draw_memory_map(_plan())
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def _outlines(fig: Any) -> dict[str, Any]:
    """Each instance's outline (the bar drawn around its components), by its legend label."""
    ax = fig.axes[0]
    return {
        c.get_label(): c.patches[0]
        for c in ax.containers
        if c.get_label().startswith(("resident: ", "on-demand: "))
    }


def test_on_demand_instances_stand_beside_the_residents_from_their_top(drawn):
    box = _outlines(drawn)
    assert set(box) == {"resident: res", "on-demand: od1", "on-demand: od2"}
    res, od1, od2 = box["resident: res"], box["on-demand: od1"], box["on-demand: od2"]
    assert (res.get_y(), res.get_height()) == (0.0, pytest.approx(12.0))
    # both loaded into the same free room: each starts where the residents end, neither on the other
    for od in (od1, od2):
        assert od.get_y() == pytest.approx(12.0) and od.get_height() == pytest.approx(8.0)
        assert od.get_y() + od.get_height() <= 22.0  # fits under the card's line when loaded
        assert od.get_linestyle() == "--"
    # apart: no two bars share x
    spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in (res, od1, od2))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    # the components of the on-demand ones are hatched, the residents' solid
    ax = drawn.axes[0]
    hatched = [p for p in ax.patches if p.get_hatch() == "//" and p.get_fill()]
    assert {round(p.get_x(), 3) for p in hatched} == {round(od1.get_x(), 3), round(od2.get_x(), 3)}
    # the stacked height the old picture drew (12 + 8 + 8 = 28 GiB over a 22 GiB card) is nowhere
    assert max(p.get_y() + p.get_height() for p in ax.patches) <= 22.0 + 1e-9


def test_the_picture_says_what_was_not_placed_and_the_legend_says_what_hatching_means(drawn):
    texts = [t.get_text() for t in drawn.findobj(lambda a: hasattr(a, "get_text"))]
    joined = " ".join(" ".join(texts).split())
    assert "3 of 4 instances placed on 1 of 2 cards" in joined
    assert (
        "Not placed: a-model-with-a-long-name (does not fit alone on any card: at TP 1 on l4 it needs "
        "40.00 GiB per GPU)" in joined
    )
    legend = [t.get_text() for t in drawn.legends[0].get_texts()]
    assert "on-demand: loaded into the\nfree room, one at a time" in legend and "card memory" in legend


@pytest.mark.parametrize("cards", [1, 2])
def test_no_text_is_cut_off(cards):
    """A one-card fleet is the narrowest picture: its title used to run past both edges."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    fig = draw_memory_map(_plan(cards))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        w, h = fig.bbox.width, fig.bbox.height
        shown = [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]
        assert len(shown) > 10
        for t in shown:
            e = t.get_window_extent(renderer)
            assert e.x0 >= -1 and e.y0 >= -1 and e.x1 <= w + 1 and e.y1 <= h + 1, (t.get_text()[:60], e, w, h)
    finally:
        plt.close(fig)


def test_the_residency_table_never_calls_an_instance_it_did_not_place_resident():
    text = render_table(_plan())
    block = text.split("\nresidency:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = {line.split()[0]: line for line in block}
    assert rows["res"].split()[1] == "resident"
    assert rows["od1"].split()[1] == "on-demand"
    unplaced = rows["a-model-with-a-long-name"]
    assert unplaced.split()[1:3] == ["not", "placed"] and "(would be resident:" in unplaced
    assert "pack: 1 of 2 cards used, 3 of 4 instances placed" in text
    # a placed instance's table row and its residency line agree
    assert "= 12.00  resident" in text and "= 8.00  on-demand" in text
