"""The load one drill window sends: one closed-loop lane per user (the ramp's knob sets the users or the
prompt length), plus a burst of simultaneous requests when the knob is `batch`; the plan's client retry
policy. The drill kind (drill/kind.py) runs them on the experiment's window executor and records each answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vramlab.run.window import Lane

if TYPE_CHECKING:
    from vramlab.drill.plan import DrillPlan
    from vramlab.load.client import RequestResult
    from vramlab.load.retry import RetryPolicy

# In the recovery phase a user whose connection was refused tries again within this: the first
# successful request after a restart ("serving again") is timed to it, not to the user's back-off.
PROBE_RESOLUTION_S = 0.25

Record = Callable[["RequestResult", int], None]  # (an answer, the user that sent it)


def window_lanes(
    plan: DrillPlan, value: float | None, duration_s: float, phase: str, rnd: int, step: int, record: Record
) -> tuple[list[Lane], RetryPolicy]:
    """The lanes of one window at *value* of the ramp's knob (None: the plan's own load) and the retry policy."""
    from vramlab.load.driver import LoadShape, Window
    from vramlab.load.prompts import synthetic_prompts
    from vramlab.load.retry import RetryPolicy

    knob, load = plan.ramp.knob, plan.load
    prompt_tokens = int(value) if (knob == "context" and value) else load.prompt_tokens
    users = int(value) if (knob == "concurrency" and value) else load.concurrency
    prompts = synthetic_prompts(prompt_tokens, load.max_tokens, 64, seed=rnd * 1000 + step)
    window = Window(duration_s=duration_s, drain_s=min(1.0, load.request_timeout_s))

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
    return lanes, RetryPolicy(**plan.clients.model_dump())


__all__ = ["PROBE_RESOLUTION_S", "window_lanes"]
