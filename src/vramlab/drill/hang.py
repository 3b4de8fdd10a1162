"""A hung target, found without waiting for the requests' own timeouts (drill/detect.py: health failing
for the plan's liveness grace while the requests in flight make no progress), and what its in-flight
requests end as.

The drill counts the requests in flight on its load client (``InFlight``). Once the hang is found, the
failing step's requests are ended at once: a hung engine answers none of them, so each is stored as a
timeout at the hang (the drill's liveness judgement is their timeout), counted lost at the failure, never
"cancelled" by the move to recovery and never left waiting minutes for a long request timeout.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.drill.detect import Finding
    from vramlab.load.client import RequestResult
    from vramlab.load.prompts import Prompt


class InFlight:
    """The load client, counting the requests sent and not yet ended (answered, failed or cancelled)."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.open = 0

    async def send(
        self, request_id: str, prompt: Prompt, max_tokens: int, scheduled_at: float, attempt: int = 0
    ) -> RequestResult:
        self.open += 1
        try:
            result: RequestResult = await self.sender.send(
                request_id, prompt, max_tokens, scheduled_at, attempt
            )
            return result
        finally:
            self.open -= 1

    def __getattr__(self, name: str) -> Any:  # everything else is the client's own
        return getattr(self.sender, name)


def hung_result(res: RequestResult, hang: Finding) -> RequestResult:
    """A request the drill ended when it found the hang: a timeout, in words that say why."""
    down = hang.data.get("health_down_s")
    since = "" if down is None else f" (health failing since {down:.2f} s)"
    return dataclasses.replace(
        res,
        error_class="timeout",
        error=f"no answer: the target hung{since}, its process alive and no request in flight making "
        f"progress for {hang.data.get('grace_s', 0):g} s; ended when the drill found the hang at {hang.t_s:.2f} s",
    )


__all__ = ["InFlight", "hung_result"]
