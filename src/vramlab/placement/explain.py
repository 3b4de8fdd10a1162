"""When a plan does not fit: the smallest changes that would make it fit, each one tried.

Every suggestion is a re-pack of the changed inputs through the same demand function (so the
capacity model decides), never a rule of thumb. They are listed from the least disruptive
(a setting of the instances that did not fit) to the most (one more card).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.placement.demand import DemandFn
from vramlab.placement.inputs import TP_CHOICES, Fleet, Instance
from vramlab.placement.pack import PackResult, pack

LEN_STEP = 256  # max_model_len suggestions are multiples of this
MAX_EXTRA_CARDS = 8  # a node rarely takes more; beyond this the answer is a different fleet


@dataclass(frozen=True)
class Change:
    kind: str  # max_model_len | concurrency | kv_cache_dtype | tensor_parallel | quantization | add_card
    instances: tuple[str, ...]
    description: str
    value: object
    cards_used: int


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), assuming ok is monotone (true below a threshold)."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def explain(
    instances: tuple[Instance, ...] | list[Instance],
    fleet: Fleet,
    demand_fn: DemandFn,
    result: PackResult,
    method: str = "auto",
    residency: dict[str, str] | None = None,
) -> list[Change]:
    if result.feasible:
        return []
    targets = tuple(n for n, _ in result.unplaced)
    base = list(instances)

    def attempt(change: Callable[[Instance], Instance], new_fleet: Fleet | None = None) -> PackResult | None:
        trial = [change(i) if i.name in targets else i for i in base]
        r = pack(trial, new_fleet or fleet, demand_fn, method=method, residency=residency)
        return r if r.feasible else None

    out: list[Change] = []
    names = ", ".join(targets)
    by_name = {i.name: i for i in base}

    # 1. a shorter context for the instances that did not fit
    longest = max(by_name[n].context_tokens for n in targets)
    if longest > LEN_STEP:

        def cap_len(k: int) -> Callable[[Instance], Instance]:
            return lambda i: i.with_(context_tokens=min(i.context_tokens, k * LEN_STEP))

        k = _largest(1, (longest - 1) // LEN_STEP, lambda k: attempt(cap_len(k)) is not None)
        if k is not None:
            r = attempt(cap_len(k))
            assert r is not None
            out.append(
                Change(
                    "max_model_len",
                    targets,
                    f"lower max_model_len of {names} to {k * LEN_STEP} (from {longest})",
                    k * LEN_STEP,
                    len(r.cards_used),
                )
            )
    # 2. fp8 KV cache
    if any(
        by_name[n].settings_dict().get("kv_cache_dtype", "auto") in ("auto", "bfloat16", "float16")
        for n in targets
    ):

        def fp8_kv(i: Instance) -> Instance:
            return i.with_(settings=tuple(sorted({**i.settings_dict(), "kv_cache_dtype": "fp8"}.items())))

        r = attempt(fp8_kv)
        if r is not None:
            out.append(
                Change(
                    "kv_cache_dtype",
                    targets,
                    f"use an fp8 KV cache for {names} (--kv-cache-dtype fp8)",
                    "fp8",
                    len(r.cards_used),
                )
            )
    # 3. fewer guaranteed sequences
    most = max(by_name[n].concurrency for n in targets)
    if most > 1:

        def cap_conc(n: int) -> Callable[[Instance], Instance]:
            return lambda i: i.with_(concurrency=min(i.concurrency, n))

        n = _largest(1, most - 1, lambda n: attempt(cap_conc(n)) is not None)
        if n is not None:
            r = attempt(cap_conc(n))
            assert r is not None
            out.append(
                Change(
                    "concurrency",
                    targets,
                    f"guarantee {n} concurrent sequences for {names} (from {most})",
                    n,
                    len(r.cards_used),
                )
            )
    # 4. tensor parallel over more cards of a node
    for tp in TP_CHOICES[1:]:
        if all(tp in by_name[n].tp_options for n in targets):
            continue

        def widen(i: Any, tp: int = tp) -> Any:
            return i.with_(tp_options=tuple(sorted({*i.tp_options, tp})))

        r = attempt(widen)
        if r is not None:
            out.append(
                Change(
                    "tensor_parallel",
                    targets,
                    f"allow tensor parallel {tp} for {names}",
                    tp,
                    len(r.cards_used),
                )
            )
            break
    # 5. smaller weights: fp8 in-flight quantization, then a 4-bit checkpoint
    for method_name, how, text in (
        ("fp8", "settings", "quantize {names} to fp8 at load (--quantization fp8)"),
        ("awq", "checkpoint", "serve a 4-bit AWQ checkpoint of {names}"),
    ):
        if any(
            by_name[n].quantization == method_name or by_name[n].settings_dict().get("quantization")
            for n in targets
        ):
            continue
        if how == "settings":

            def change(i: Instance) -> Instance:
                return i.with_(settings=tuple(sorted({**i.settings_dict(), "quantization": "fp8"}.items())))
        else:

            def change(i: Instance) -> Instance:
                return i.with_(quantization="awq")

        try:
            r = attempt(change)
        except Exception:  # the capacity model may refuse a quantization on this model or card
            r = None
        if r is not None:
            out.append(
                Change("quantization", targets, text.format(names=names), method_name, len(r.cards_used))
            )
            break
    # 6. hardware: the fewest extra cards of one node's kind (one card first)
    best: tuple[int, str, PackResult] | None = None
    for node in fleet.nodes:
        bigger = fleet
        for n in range(1, MAX_EXTRA_CARDS + 1):
            if best is not None and n >= best[0]:
                break
            bigger = bigger.with_extra_card(node)
            r = pack(base, bigger, demand_fn, method=method, residency=residency)
            if r.feasible:
                best = (n, node, r)
                break
    if best is not None:
        n, node, r = best
        gpu = fleet.node_cards(node)[0].gpu_name
        what = f"one more {gpu}" if n == 1 else f"{n} more {gpu} cards"
        out.append(
            Change(
                "add_card", targets, f"add {what} to {node}", {"node": node, "cards": n}, len(r.cards_used)
            )
        )
    return out
