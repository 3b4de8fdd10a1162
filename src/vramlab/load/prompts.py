"""The fixed input set: synthetic prompts of a given token length with a seed, or a JSONL file.

Synthetic prompts are built from a fixed list of common English words, each of which is one token
in the Llama, Qwen and GPT BPE vocabularies when preceded by a space, so ``prompt_tokens`` words
give about ``prompt_tokens`` tokens (the chat template adds a few). The same seed gives the same
prompts, byte for byte, on every machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vramlab.errors import ConfigError

# Short, frequent words: single tokens in the common BPE vocabularies.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will can more other its who "
    "into some time two them could may then only these over new first any after also made most what out "
    "like very well back where just good work year people long way down day each much through great might "
    "see man old still such own part life take last world place small make house under water number sound"
).split()


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_tokens: int | None
    output_tokens: int


def synthetic_text(n_tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_tokens))


def synthetic_prompts(prompt_tokens: int, output_tokens: int, count: int, seed: int) -> list[Prompt]:
    """``count`` distinct prompts; a unique prefix keeps prefix caches from serving them for free."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        head = f"#{seed}-{i}:"
        body = synthetic_text(max(prompt_tokens - 3, 1), rng)
        out.append(Prompt(text=f"{head} {body}", prompt_tokens=prompt_tokens, output_tokens=output_tokens))
    return out


def jsonl_prompts(path: str | Path, default_output_tokens: int = 256) -> list[Prompt]:
    """One JSON object a line: ``{"prompt": str, "max_tokens"?: int, "prompt_tokens"?: int}``."""
    p = Path(path)
    out = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read the input set: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{n}: not JSON: {exc.msg}") from None
        text = obj.get("prompt") if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{p}:{n}: prompt: each line needs a non-empty string 'prompt'")
        max_tokens = obj.get("max_tokens", obj.get("output_tokens", default_output_tokens))
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigError(f"{p}:{n}: max_tokens: must be a positive integer")
        pt = obj.get("prompt_tokens")
        out.append(
            Prompt(text=text, prompt_tokens=pt if isinstance(pt, int) else None, output_tokens=max_tokens)
        )
    if not out:
        raise ConfigError(f"{p}: the input set is empty")
    return out


def input_set_key(prompts: list[Prompt]) -> str:
    """A digest of an input set's content: the same prompts give the same key, other prompts another."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for p in prompts:
        h.update(f"{len(p.text)}:{p.prompt_tokens}:{p.output_tokens}:".encode())
        h.update(p.text.encode())
    return h.hexdigest()


def cycle(prompts: list[Prompt]) -> Iterator[Prompt]:
    """The input set, repeated in order: every window sees the same prompts in the same order."""
    while True:
        yield from prompts
