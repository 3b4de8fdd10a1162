"""Hand-made demands and fleets for the placement tests (no capacity model involved)."""

from __future__ import annotations

from typing import Any

from vramlab.placement.demand import Demand
from vramlab.placement.inputs import Card, Fleet, Instance

GIB = 1 << 30


def fleet(*nodes: tuple[str, str, int, float]) -> Fleet:
    """fleet(("a", "l4", 2, 22.0), ...): node name, gpu name, count, GiB per card."""
    cards: list[Any] = []
    for node, gpu, count, gib in nodes:
        for j in range(count):
            cards.append(Card(len(cards), node, gpu, int(gib * GIB), 25.0, local_index=j))
    return Fleet(tuple(cards))


class TableDemand:
    """Per-GPU bytes by instance name and TP size; a TP size missing from the table does not fit."""

    def __init__(self, table: dict[str, dict[int, float]], weights_share: float = 0.6) -> None:
        self.table = table
        self.share = weights_share

    def __call__(self, inst: Instance, card: Card, tp: int, other_processes_bytes: int = 0) -> Demand:
        gib = self.table.get(inst.name, {}).get(tp)
        if gib is None:
            return Demand(inst.name, card.gpu_name, tp, False, reason=f"no TP {tp} in the table")
        b = int(gib * GIB)
        w, o = int(b * self.share), b // 10
        return Demand(
            inst.name, card.gpu_name, tp, True, weights_bytes=w, kv_cache_bytes=b - w - o, overhead_bytes=o
        )


def inst(name: str, **kw: object) -> Instance:
    kw.setdefault("tp_options", (1,))
    return Instance(name=name, model=name, **kw)  # type: ignore[arg-type]
