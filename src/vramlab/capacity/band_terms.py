"""Which terms a KV band was widened for because they are unknown, and which terms move the pool but are not in it.

A band is wide for two reasons: a term whose size is measured but scatters (weights, activation peak), and a
term the planner does not know for this release, card or model ("unknown term, band widened", said in the
component's note or in a plan note). The plan output names the second kind, and the terms the plan cannot
bound at all: memory that other processes hold on the card. That one is not in the band (nothing bounds what a
desktop's display or another server holds) but it moves the pool the same way every time, so it is named with
the flag that makes it known.
"""

from __future__ import annotations

import re

from vramlab.capacity.estimate import Component

UNKNOWN = "unknown term"

# Engines that size the pool from the memory free at start-up. SGLang: model_runner's profile_max_num_token takes
# the free memory after the weights less (1 - mem_fraction_static) x the memory free at init, so memory held by
# others lowers the pool by mem_fraction_static x its size (capacity/engines/sglang.py). TGI: the warm-up reads
# torch.cuda.mem_get_info and keeps back a share of the whole card, so one for one (capacity/engines/tgi.py).
FREE_MEMORY_POOLS = {
    "sglang": "memory other processes hold on the card (a desktop's display, another server): assumed 0 GiB; SGLang "
    "sizes its pool from the memory free at start-up, so it lowers the pool by mem_fraction_static x that "
    "memory (pass --other-processes-gib)",
    "tgi": "memory other processes hold on the card (a desktop's display, another server): assumed 0 GiB; TGI sizes "
    "its pool from the memory free after its warm-up, so it lowers the pool one for one "
    "(pass --other-processes-gib)",
    # vLLM's budget takes off the card's used memory outside torch (torch.cuda.mem_get_info): V1 before 0.9.1 all
    # of it, other processes' included (capacity/engines/vllm_eras.py V1_SNAPSHOT_FROM; the plan takes off what
    # --other-processes-gib says); later releases and V0 only what changes after the start-up snapshot, so a
    # process that allocates or frees memory while vLLM profiles moves the pool by that amount, which no flag says.
    "vllm": "memory other processes allocate or free on the card while vLLM profiles (a desktop's display, "
    "another server): assumed none; vLLM counts it as its own non-torch memory, so the pool moves by that "
    "amount (what they hold before the start: --other-processes-gib; V1 before 0.9.1 takes it off the "
    "pool, later V1 refuses to start when gpu_memory_utilization x the card is not free)",
}


def unknown_terms(
    components: tuple[Component, ...] | list[Component], notes: tuple[str, ...] | list[str]
) -> list[str]:
    """The in-budget terms whose band was widened because they are unknown here: a component whose own note says
    so, or a plan note "unknown term, band widened (<term>)"."""
    names = [c.name for c in components if c.in_budget and c.low_bytes != c.high_bytes and UNKNOWN in c.note]
    for note in notes:
        found = re.match(r"unknown term, band widened \(([^)]+)\)", note)
        if found:
            name = found.group(1).replace(" ", "_")
            if name not in names:
                names.append(name)
    return names


def unbanded_terms(engine: str, other_processes_bytes: int) -> list[str]:
    """Terms that move the pool but that no band can hold: what other processes hold on the card when the plan
    was not told (--other-processes-gib); for vLLM, what they allocate or free while it profiles, which no flag
    tells."""
    term = FREE_MEMORY_POOLS.get(engine)
    if term is None or (other_processes_bytes > 0 and engine != "vllm"):
        return []
    return [term]
