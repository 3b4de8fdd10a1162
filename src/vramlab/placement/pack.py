"""Placement: put instances on cards, fewest cards first, then the most even fill.

Each instance has options (a TP size on a node's cards, with a per-GPU demand from a
`DemandFn`). A TP-k option takes k cards of one node (tensor parallel stays inside a node).
Resident instances get guaranteed room; on-demand ones get a *home* card where they fit next to
the residents, and may share that spare room with other on-demand instances (the residency
simulation decides who is loaded when).

Methods: `ffd` (first-fit decreasing, then an improvement pass that tries to empty cards and
even out the fill), `exact` (branch and bound over all assignments, with symmetric unused cards
collapsed; for small cases) and `auto` (exact up to `exact_limit` instances).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from vramlab.placement.demand import Demand, DemandFn
from vramlab.placement.inputs import Card, Fleet, Instance

EXACT_NODE_LIMIT = 200_000  # DFS nodes before exact search gives up and keeps the greedy answer


@dataclass(frozen=True)
class Placement:
    instance: str
    tp: int
    cards: tuple[int, ...]  # card indices in the fleet
    demand: Demand  # per GPU, on each of `cards`
    residency: str = "resident"


@dataclass(frozen=True)
class PackResult:
    fleet: Fleet
    placements: tuple[Placement, ...]
    unplaced: tuple[tuple[str, str], ...]  # (instance, why)
    method: str
    notes: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.unplaced

    def on_card(self, index: int, residency: str | None = None) -> list[Placement]:
        return [
            p for p in self.placements if index in p.cards and (residency is None or p.residency == residency)
        ]

    def resident_bytes(self, index: int) -> int:
        return sum(p.demand.total_bytes for p in self.on_card(index, "resident"))

    @property
    def cards_used(self) -> tuple[int, ...]:
        return tuple(sorted({c for p in self.placements for c in p.cards}))

    def max_fill(self) -> float:
        used = self.cards_used
        if not used:
            return 0.0
        return max(self.resident_bytes(c) / self.fleet.cards[c].memory_bytes for c in used)

    def placement(self, name: str) -> Placement | None:
        return next((p for p in self.placements if p.instance == name), None)


@dataclass(frozen=True)
class _Option:
    tp: int
    node: str
    demand: Demand


@dataclass(frozen=True)
class _Item:
    inst: Instance
    options: tuple[_Option, ...]

    @property
    def size(self) -> int:
        return min((o.demand.total_bytes * o.tp for o in self.options), default=0)


def _options(inst: Instance, fleet: Fleet, demand_fn: DemandFn) -> tuple[tuple[_Option, ...], str]:
    """Every (tp, node) at which the instance fits on an empty card; else why none does."""
    opts: list[_Option] = []
    smallest: Demand | None = None
    for node in fleet.nodes:
        cards = fleet.node_cards(node)
        for tp in inst.tp_options:
            if tp > len(cards):
                continue
            d = demand_fn(inst, cards[0], tp)
            if d.fits and d.total_bytes <= cards[0].memory_bytes:
                opts.append(_Option(tp, node, d))
                break  # a bigger TP on the same node only costs more cards
            if smallest is None or d.total_bytes < smallest.total_bytes:
                smallest = d
    if opts:
        return tuple(sorted(opts, key=lambda o: o.tp)), ""
    if smallest is None:
        return (), f"no node has {min(inst.tp_options)} cards for its TP options {list(inst.tp_options)}"
    gib = 1 << 30
    why = smallest.reason or "does not fit"
    return (), (
        f"does not fit alone on any card: at TP {smallest.tp} on {smallest.gpu} it needs "
        f"{smallest.total_bytes / gib:.2f} GiB per GPU ({why})"
    )


class _State:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.cap = [c.memory_bytes for c in fleet.cards]
        self.load = [0] * len(fleet.cards)
        self.count = [0] * len(fleet.cards)  # placements per card; a card is open while > 0

    def opened(self) -> list[int]:
        return [i for i, n in enumerate(self.count) if n]

    def room(self, card: Card, nbytes: int) -> bool:
        return self.load[card.index] + nbytes <= self.cap[card.index]

    def add(self, cards: tuple[int, ...], nbytes: int, sign: int = 1) -> None:
        for c in cards:
            self.load[c] += sign * nbytes
            self.count[c] += sign

    def max_fill(self) -> float:
        return max((self.load[i] / self.cap[i] for i in self.opened()), default=0.0)

    def score(self) -> tuple[int, float]:
        return len(self.opened()), round(self.max_fill(), 9)


def _candidates(state: _State, opt: _Option) -> list[tuple[int, ...]]:
    """Card sets for an option: open cards with room, plus the lowest unused ones (all alike)."""
    cards = state.fleet.node_cards(opt.node)
    open_ok = [c.index for c in cards if state.count[c.index] and state.room(c, opt.demand.total_bytes)]
    unused = [c.index for c in cards if not state.count[c.index]][: opt.tp]
    out = []
    for combo in combinations(open_ok + unused, opt.tp):
        new = [c for c in combo if c in unused]
        if new == unused[: len(new)]:
            out.append(combo)
    return out


def _ffd(items: list[_Item], state: _State) -> tuple[list[Placement], list[tuple[str, str]]]:
    placed: list[Placement] = []
    unplaced: list[tuple[str, str]] = []
    for item in sorted(items, key=lambda it: (-it.size, it.inst.name)):
        best: tuple[tuple[int, float, int], _Option, tuple[int, ...]] | None = None
        for opt in item.options:
            for combo in _candidates(state, opt):
                new = sum(1 for c in combo if not state.count[c])
                # fewest new cards; when opening, the biggest card (room for the next items)
                key = (new, -float(state.cap[combo[0]]) if new else 0.0, opt.tp)
                if best is None or key < best[0]:
                    best = (key, opt, combo)
                if new == 0:
                    break  # first fit among open cards
        if best is None:
            unplaced.append((item.inst.name, "no room left on the fleet's cards"))
            continue
        _, opt, combo = best
        state.add(combo, opt.demand.total_bytes)
        placed.append(Placement(item.inst.name, opt.tp, combo, opt.demand))
    return placed, unplaced


def _improve(items: dict[str, _Item], placed: list[Placement], state: _State) -> list[Placement]:
    """Empty the lightest cards into the others, then move instances off the fullest card."""
    changed = True
    while changed:
        changed = False
        for c in sorted(state.opened(), key=lambda i: state.load[i]):
            mine = [p for p in placed if c in p.cards]
            if any(p.tp > 1 for p in mine):
                continue
            trial = list(placed)
            for p in mine:
                state.add(p.cards, p.demand.total_bytes, -1)
            moved: list[Placement] = []
            for p in sorted(mine, key=lambda p: -p.demand.total_bytes):
                dest = _move_target(items[p.instance], state, exclude={c}, best_fit=True)
                if dest is None:
                    break
                opt, card = dest
                state.add((card,), opt.demand.total_bytes)
                moved.append(Placement(p.instance, 1, (card,), opt.demand))
            if len(moved) == len(mine):
                placed = [p for p in trial if c not in p.cards] + moved
                changed = True
                break
            for m in moved:
                state.add(m.cards, m.demand.total_bytes, -1)
            for p in mine:
                state.add(p.cards, p.demand.total_bytes)
    for _ in range(4 * len(placed)):  # balance: each move strictly lowers the fullest card pair
        if not _balance_step(items, placed, state):
            break
    return placed


def _move_target(item: _Item, state: _State, exclude: set[int], best_fit: bool) -> tuple[_Option, int] | None:
    best: tuple[float, _Option, int] | None = None
    for opt in item.options:
        if opt.tp != 1:
            continue
        for card in state.fleet.node_cards(opt.node):
            i = card.index
            if i in exclude or not state.count[i] or not state.room(card, opt.demand.total_bytes):
                continue
            free = state.cap[i] - state.load[i] - opt.demand.total_bytes
            key = float(free) if best_fit else -float(free)
            if best is None or key < best[0]:
                best = (key, opt, i)
    return (best[1], best[2]) if best else None


def _balance_step(items: dict[str, _Item], placed: list[Placement], state: _State) -> bool:
    opened = state.opened()
    if len(opened) < 2:
        return False
    fill = {i: state.load[i] / state.cap[i] for i in opened}
    top = max(opened, key=lambda i: fill[i])
    for k, p in enumerate(placed):
        if p.cards != (top,) or state.count[top] < 2:
            continue
        for opt in items[p.instance].options:
            if opt.tp != 1:
                continue
            for card in state.fleet.node_cards(opt.node):
                t = card.index
                if t == top or not state.count[t] or not state.room(card, opt.demand.total_bytes):
                    continue
                after_src = (state.load[top] - p.demand.total_bytes) / state.cap[top]
                after_dst = (state.load[t] + opt.demand.total_bytes) / state.cap[t]
                if max(after_src, after_dst) < fill[top] - 1e-9:
                    state.add((top,), p.demand.total_bytes, -1)
                    state.add((t,), opt.demand.total_bytes)
                    placed[k] = Placement(p.instance, 1, (t,), opt.demand)
                    return True
    return False


def _exact(
    items: list[_Item],
    fleet: Fleet,
    incumbent: tuple[tuple[int, float], list[Placement]] | None,
) -> tuple[tuple[tuple[int, float], list[Placement]] | None, bool]:
    """Branch and bound on (cards used, max fill). Returns (best, finished within the limit)."""
    order = sorted(items, key=lambda it: (-it.size, it.inst.name))
    state = _State(fleet)
    best = incumbent
    visited = 0
    chosen: list[Placement] = []

    def dfs(i: int) -> bool:
        nonlocal best, visited
        visited += 1
        if visited > EXACT_NODE_LIMIT:
            return False
        score = state.score()
        if best is not None and score >= best[0]:
            return True  # cards and max fill only grow as items are added
        if i == len(order):
            best = (score, list(chosen))
            return True
        for opt in order[i].options:
            for combo in _candidates(state, opt):
                state.add(combo, opt.demand.total_bytes)
                chosen.append(Placement(order[i].inst.name, opt.tp, combo, opt.demand))
                ok = dfs(i + 1)
                chosen.pop()
                state.add(combo, opt.demand.total_bytes, -1)
                if not ok:
                    return False
        return True

    finished = dfs(0)
    return best, finished


def pack(
    instances: tuple[Instance, ...] | list[Instance],
    fleet: Fleet,
    demand_fn: DemandFn,
    method: str = "auto",
    exact_limit: int = 8,
    residency: dict[str, str] | None = None,
) -> PackResult:
    """Place every instance. `residency` maps names to 'resident' or 'on-demand' (default resident)."""
    if method not in ("auto", "ffd", "exact"):
        raise ValueError(f"unknown packing method {method!r}")
    residency = residency or {}
    items: dict[str, _Item] = {}
    unplaced: list[tuple[str, str]] = []
    for inst in instances:
        opts, why = _options(inst, fleet, demand_fn)
        if opts:
            items[inst.name] = _Item(inst, opts)
        else:
            unplaced.append((inst.name, why))
    residents = [it for n, it in items.items() if residency.get(n, "resident") == "resident"]
    on_demand = [it for n, it in items.items() if residency.get(n, "resident") == "on-demand"]

    state = _State(fleet)
    placed, left = _ffd(residents, state)
    if not left:
        placed = _improve(items, placed, state)
    used_method, notes = "ffd", []
    if method == "exact" or (method == "auto" and len(residents) <= exact_limit):
        incumbent = (state.score(), placed) if not left else None
        best, finished = _exact(residents, fleet, incumbent)
        if best is not None:
            placed, left = best[1], []
        used_method = "exact" if finished else "ffd"
        if not finished:
            notes.append(f"exact search stopped after {EXACT_NODE_LIMIT} nodes; kept the greedy plan")
    unplaced += left
    placed = sorted(placed, key=lambda p: (p.cards, p.instance))
    placed += _homes(on_demand, fleet, placed, unplaced)
    return PackResult(fleet, tuple(placed), tuple(unplaced), used_method, tuple(notes))


def _homes(
    items: list[_Item], fleet: Fleet, placed: list[Placement], unplaced: list[tuple[str, str]]
) -> list[Placement]:
    """On-demand instances: the open card with the most room after residents; else open one."""
    state = _State(fleet)
    for p in placed:
        state.add(p.cards, p.demand.total_bytes)
    homes: list[Placement] = []
    shared = [0] * len(fleet.cards)  # on-demand instances already homed on a card
    for item in sorted(items, key=lambda it: (-it.size, it.inst.name)):
        best: tuple[tuple[int, int, float], _Option, tuple[int, ...]] | None = None
        for opt in item.options:
            for combo in _candidates(state, opt):
                new = sum(1 for c in combo if not state.count[c])
                free = min(state.cap[c] - state.load[c] for c in combo)
                key = (new, sum(shared[c] for c in combo), -float(free))
                if best is None or key < best[0]:
                    best = (key, opt, combo)
        if best is None:
            unplaced.append(
                (item.inst.name, "no card has room for it even with every on-demand model unloaded")
            )
            continue
        _, opt, combo = best
        for c in combo:
            state.count[c] += 1  # opens the card; its room stays free for on-demand loads
            shared[c] += 1
        homes.append(Placement(item.inst.name, opt.tp, combo, opt.demand, residency="on-demand"))
    return homes
