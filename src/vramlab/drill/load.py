"""The load one drill window sends: one closed-loop lane per user (the ramp's knob sets the users or the
prompt length), plus a burst of simultaneous requests when the knob is `batch`; the plan's client retry
policy. The drill kind (drill/kind.py) runs them on the experiment's window executor and records each answer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from vramlab.run.window import Lane

if TYPE_CHECKING:
    from vramlab.drill.plan import DrillPlan
    from vramlab.load.client import RequestResult
    from vramlab.load.prompts import FreshPrompts, Prompt
    from vramlab.load.retry import RetryPolicy

# In the recovery phase a user whose connection was refused tries again within this: the first
# successful request after a restart ("serving again") is timed to it, not to the user's back-off.
PROBE_RESOLUTION_S = 0.25

Record = Callable[["RequestResult", int], None]  # (an answer, the user that sent it)


DRAIN_MARGIN_S = 0.5  # past a request's own timeout: its timeout is recorded before the window ends
# distinct prompts a window cycles through where fresh prompts cannot be sized (heads of other digits
# count differently in the target's tokenizer); otherwise every request's prompt is new (FreshPrompts)
PROMPTS_PER_WINDOW = 64
RECOVERY_SEED = 999  # the recovery window's own prompts (at the baseline's length) when the ramp is undone


def window_prompts_key(
    plan: DrillPlan, value: float | None, phase: str, rnd: int, step: int
) -> tuple[int, int]:
    """(prompt tokens, seed) of a window's input set: the ramp's value when the knob is the context,
    else the plan's length; each round's baseline, steps and recovery have their own prompts (and
    heads: a step's prompts sharing the baseline's seed began with the baseline's words, which a
    prefix cache served). *step*: the ramp value's index, from 0."""
    prompt_tokens = int(value) if (plan.ramp.knob == "context" and value) else plan.load.prompt_tokens
    if phase == "baseline":
        k = 0
    elif phase == "recovery" and value is None:
        k = RECOVERY_SEED
    else:
        k = step + 1
    return prompt_tokens, rnd * 1000 + k


def window_lanes(
    plan: DrillPlan,
    value: float | None,
    prompts: list[Prompt] | FreshPrompts,
    duration_s: float,
    phase: str,
    rnd: int,
    step: int,
    record: Record,
) -> tuple[list[Lane], RetryPolicy]:
    """The lanes of one window at *value* of the ramp's knob (None: the plan's own load), each
    sending *prompts* (built for this window: window_prompts_key), and the retry policy."""
    from vramlab.load.driver import LoadShape, Window
    from vramlab.load.retry import RetryPolicy

    knob, load = plan.ramp.knob, plan.load
    users = int(value) if (knob == "concurrency" and value) else load.concurrency
    # every ramp request ends as what it was: a step's end sends nothing new, and what is in flight is
    # answered, fails or times out by its own timeout (a hung engine's requests are timeouts at the
    # step where the hang began, never "cancelled" by the next step). The baseline judges the target
    # before anything is ramped: requests still open a second after it are "never came back".
    drain_s = load.request_timeout_s + DRAIN_MARGIN_S if phase == "ramp" else min(1.0, load.request_timeout_s)
    window = Window(duration_s=duration_s, drain_s=drain_s)

    def recorder_for(user: int) -> Callable[[RequestResult], None]:
        return lambda res: record(res, user)

    tag = "b" if phase == "baseline" else ("r" if phase == "recovery" else "s")
    # one lane per closed-loop user (each its own seed and request ids), all in one window
    cap = PROBE_RESOLUTION_S if phase == "recovery" else None  # recovery is timed to this, not to a back-off
    lanes = [
        Lane(
            prompts,
            LoadShape(
                mode="closed",
                concurrency=1,
                max_tokens=load.max_tokens,
                seed=u,
                think_s=load.think_time_s,
                error_backoff_max_s=cap,
            ),
            window,
            recorder_for(u),
            f"u{u}:{rnd}{tag}{step}-",
        )
        for u in range(users)
    ]
    if knob == "batch" and value and phase == "ramp":
        # a burst of `value` simultaneous requests at the start of the step, on top of the steady users
        burst = Window(requests=int(value), max_s=duration_s, drain_s=window.drain_s)
        lanes.append(
            Lane(
                prompts,
                LoadShape(mode="closed", concurrency=int(value), max_tokens=load.max_tokens),
                burst,
                recorder_for(10_000),
                f"burst:{rnd}{step}-",
            )
        )
    return lanes, RetryPolicy(**plan.load.retry.model_dump())


def served_model(plan: DrillPlan) -> str:
    """The model name the drill's requests ask for."""
    return plan.target.model or (plan.target.sim.model if plan.target.sim else "default")


class WindowPrompts:
    """Each window's input set, sized in the target's tokenizer where it can count (load/tokens.py).
    A round's sets are built before its baseline (``prepare``), so no step waits on a count and the
    recovery window never asks a failed target to count."""

    def __init__(self, plan: DrillPlan) -> None:
        from vramlab.load.prompts import PromptMaker

        self.plan = plan
        self.maker = PromptMaker()

    async def open(self, stack: contextlib.AsyncExitStack, url: str) -> str:
        """Find the target's counter; the note saying how prompt tokens are counted."""
        from vramlab.load.tokens import open_prompt_maker

        p = self.plan
        local = p.capacity.model if p.capacity else None  # a model directory's own tokenizer.json
        self.maker, note = await open_prompt_maker(
            stack, url, served_model(p), p.target.api, None, p.load.request_timeout_s, local
        )
        return note

    async def prepare(self, rnd: int, values: list[float]) -> None:
        keys = [window_prompts_key(self.plan, None, "baseline", rnd, 0)]
        keys += [window_prompts_key(self.plan, v, "ramp", rnd, i) for i, v in enumerate(values)]
        keys.append(window_prompts_key(self.plan, None, "recovery", rnd, 0))
        for pt, seed in keys:
            await self._prompts(pt, seed)

    async def get(self, value: float | None, phase: str, rnd: int, step: int) -> list[Prompt] | FreshPrompts:
        prompts = await self._prompts(*window_prompts_key(self.plan, value, phase, rnd, step))
        if phase == "recovery" and value is not None and not isinstance(prompts, list):
            from dataclasses import replace

            return replace(
                prompts, epoch=1
            )  # the failed step's set, its heads new: nothing served from cache
        return prompts

    async def _prompts(self, prompt_tokens: int, seed: int) -> list[Prompt] | FreshPrompts:
        """A new prompt every request; a cycled list where the target counts fresh heads unevenly."""
        out = self.plan.load.max_tokens
        fresh = await self.maker.fresh(prompt_tokens, out, seed)
        return (
            fresh
            if fresh is not None
            else await self.maker.synthetic(prompt_tokens, out, PROMPTS_PER_WINDOW, seed)
        )


__all__ = [
    "PROBE_RESOLUTION_S",
    "PROMPTS_PER_WINDOW",
    "WindowPrompts",
    "served_model",
    "window_lanes",
    "window_prompts_key",
]
