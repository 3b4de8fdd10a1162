"""Conversations: N conversations of T turns each, every one opening with the same system prompt,
each turn sending the whole history before it (the system prompt, the earlier questions and the
engine's own answers) and a new question, optionally pausing for a tool call between turns; each
conversation belongs to a tenant.

A conversation is one `Prompt` whose ``follow_ups`` are its later questions: a closed-loop user
that draws it walks its turns in order (load/driver.py), each turn one request that carries its
conversation, turn and tenant, and the answer of one turn goes into the next turn's history. So the
prompts grow turn by turn and share their prefix with the turn before (and with every other
conversation, up to the system prompt's end): what an engine's prefix cache serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vramlab.load.prompts import Prompt


@dataclass(frozen=True)
class ConversationShape:
    count: int
    turns: int
    output_tokens: int
    tool_every: int = 0  # a tool-call pause after every tool_every-th turn (0: none)
    tool_pause_s: float = 0.0
    tenants: tuple[tuple[str, float], ...] = ()  # (name, share of the conversations)


def tenant_of(index: int, count: int, tenants: Sequence[tuple[str, float]]) -> str | None:
    """The tenant of conversation *index* of *count*: the tenants take consecutive runs of the
    conversations in proportion to their shares (every tenant with a share gets at least one)."""
    if not tenants:
        return None
    total = sum(share for _, share in tenants)
    edge = 0.0
    for name, share in tenants:
        edge += share / total
        if index < round(edge * count):
            return name
    return tenants[-1][0]


def conversation_prompts(
    system_text: str, questions: Sequence[Prompt], shape: ConversationShape
) -> list[Prompt]:
    """One prompt per conversation: its first question after the system prompt, its later questions
    as follow-ups (questions[c * turns + t] is conversation c's turn t + 1)."""
    if len(questions) < shape.count * shape.turns:
        raise ValueError(
            f"{shape.count} conversations of {shape.turns} turns need {shape.count * shape.turns} questions"
        )
    out = []
    for c in range(shape.count):
        mine = questions[c * shape.turns : (c + 1) * shape.turns]
        pauses = tuple(
            shape.tool_pause_s if shape.tool_every and t % shape.tool_every == 0 else 0.0
            for t in range(1, shape.turns)
        )
        out.append(
            Prompt(
                text=mine[0].text,
                prompt_tokens=None,  # the system prompt and the question: the server's usage says
                output_tokens=shape.output_tokens,
                history=(("system", system_text),) if system_text else (),
                conversation=f"c{c}",
                turn=1,
                tenant=tenant_of(c, shape.count, shape.tenants),
                follow_ups=tuple(q.text for q in mine[1:]),
                pauses_s=pauses,
            )
        )
    return out


def next_turn(prompt: Prompt, history: tuple[tuple[str, str], ...], turn: int) -> Prompt:
    """Turn *turn* (2..T) of *prompt*'s conversation, after *history* (everything said before it)."""
    return Prompt(
        text=prompt.follow_ups[turn - 2],
        prompt_tokens=None,
        output_tokens=prompt.output_tokens,
        history=history,
        conversation=prompt.conversation,
        turn=turn,
        tenant=prompt.tenant,
    )


__all__ = ["ConversationShape", "conversation_prompts", "next_turn", "tenant_of"]
