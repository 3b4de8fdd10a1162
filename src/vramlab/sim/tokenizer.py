"""A deterministic approximate tokenizer, and the text the sim "generates".

Real BPE tokenizers average about four characters of English per token. Counting words and
splitting long ones into 4-character pieces gets that average without shipping a vocabulary,
and the same text always counts the same. Generated tokens are short words, so re-counting
the generated text gives back the token count the server reported in `usage`.
"""

from __future__ import annotations

import hashlib
import re

_PIECE = re.compile(r"\w+|[^\w\s]")
_WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "but",
    "have",
    "an",
    "they",
    "one",
    "you",
    "all",
    "were",
    "her",
    "can",
    "we",
    "has",
    "more",
    "will",
    "gpu",
    "kv",
    "page",
    "step",
)


def count_tokens(text: str) -> int:
    """Tokens in *text*: one per punctuation mark, one per started 4 characters of a word."""
    return sum(-(-len(p) // 4) for p in _PIECE.findall(text))


def text_tokens(text: str) -> list[str]:
    """The tokens *count_tokens* counts, as strings: what the prefix cache hashes (sim/prefix_cache.py)."""
    out: list[str] = []
    for p in _PIECE.findall(text):
        out += [p[i : i + 4] for i in range(0, len(p), 4)]
    return out


def _content_text(content: object) -> str:
    if isinstance(content, list):  # content parts: the text parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def chat_tokens(messages: list[dict[str, object]]) -> list[str]:
    """A chat prompt's tokens as *count_chat_tokens* counts them: each message is its role header
    (3 tokens), its content and an end-of-turn token, then the assistant header the template appends,
    so a turn's answer, sent back in the next turn, lines up with what was generated after it."""
    out: list[str] = []
    for m in messages:
        out += [
            "<|header|>",
            str(m.get("role", "")),
            "<|/header|>",
            *text_tokens(_content_text(m.get("content"))),
            "<|eot|>",
        ]
    return [*out, "<|header|>", "assistant", "<|/header|>"]


def count_chat_tokens(messages: list[dict[str, object]]) -> int:
    """A chat prompt: each message's content plus the template's role markers (~4 tokens)."""
    total = 3  # the assistant header the template appends
    for m in messages:
        total += 4 + count_tokens(_content_text(m.get("content", "")))
    return total


def token_text(seed: int, prompt_key: str, index: int) -> str:
    """The *index*-th generated token of a request: a deterministic short word with a space."""
    h = hashlib.blake2b(f"{seed}:{prompt_key}:{index}".encode(), digest_size=4).digest()
    return " " + _WORDS[int.from_bytes(h, "big") % len(_WORDS)]


def prompt_key(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
