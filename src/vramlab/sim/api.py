"""OpenAI-compatible request checks and response shapes, as vLLM words and shapes them. Pure.

Errors use vLLM's status codes and messages (400 for a prompt beyond max_model_len, 404 for
an unknown model, 500 once the engine is dead); releases from 0.10 wrap the error object in
`{"error": {...}}`, older ones answered it at the top level with `"object": "error"`.

Request validation follows vLLM's protocol models (vllm/entrypoints/chat_utils.py,
``CustomChatCompletionMessageParam``; a failed model validation is a 400 ``BadRequestError``
through api_server.py's RequestValidationError handler, not FastAPI's 422):
- every message is an object with a string ``role`` (required; custom role names are allowed, as
  vLLM "enables custom roles"); ``content`` is a string, a list of content parts (strings or
  objects with a ``type``), or absent/null;
- ``n`` is an integer of at least 1 (SamplingParams: "n must be at least 1, got {n}."); n > 1 is
  served with n choices, as vLLM does;
- ``stream``, ``ignore_eos`` and ``stream_options.include_usage`` are booleans as pydantic reads them
  (true/false, 0/1, "yes"/"no", ...; anything else is a 400, never Python's truth of a string);
  ``stream_options`` is an object or null; ``temperature`` a finite number of at least 0 and
  ``top_p`` one in (0, 1] (SamplingParams' checks);
- a body that cannot be parsed (bad JSON, nesting deeper than the parser allows) is a 400.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from vramlab.sim.tokenizer import chat_tokens, count_chat_tokens, count_tokens, prompt_key, text_tokens


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_body(err: ApiError, engine: str, version: tuple[int, ...]) -> dict[str, Any]:
    if engine == "tgi":
        return {"error": err.message, "error_type": err.type}
    inner = {"message": err.message, "type": err.type, "param": err.param, "code": err.status}
    if engine == "vllm" and version < (0, 10):
        return {"object": "error", **inner}
    return {"error": inner}


@dataclass(frozen=True)
class Parsed:
    chat: bool
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    key: str  # what the generated text derives from
    n: int = 1  # choices to generate


def parse_request(body: Any, chat: bool, model: str, max_model_len: int) -> Parsed:
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    if body.get("model") not in (None, model):
        raise ApiError(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "'messages' must be a non-empty list of message objects.", param="messages")
        for i, m in enumerate(messages):
            _check_message(i, m)
        n_prompt = count_chat_tokens(messages)
        key = prompt_key(repr([(m.get("role"), m.get("content")) for m in messages]))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            n_prompt, key = count_tokens(prompt), prompt_key(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            n_prompt, key = len(prompt), prompt_key(repr(prompt))
        else:
            raise ApiError(
                400,
                "'prompt' must be a string, a list with one string, or a list of token ids.",
                param="prompt",
            )
    n_prompt = max(1, n_prompt)
    if n_prompt >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request "
            f"has {n_prompt} input tokens. Please reduce the length of the input messages.",
            param="input_tokens",
        )
    raw = (
        body.get("max_completion_tokens")
        if chat and body.get("max_completion_tokens") is not None
        else body.get("max_tokens")
    )
    if raw is None:
        max_tokens = max_model_len - n_prompt  # vLLM's default: the rest of the context
    elif isinstance(raw, bool) or not isinstance(raw, int):
        raise ApiError(400, f"max_tokens must be an integer, got {raw!r}.", param="max_tokens")
    elif raw < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {raw}.", param="max_tokens")
    elif n_prompt + raw > max_model_len:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {raw}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {n_prompt} input tokens "
            f"({raw} > {max_model_len} - {n_prompt}).",
            param="max_tokens",
        )
    else:
        max_tokens = raw
    _check_sampling(body)
    n = body.get("n")
    if n is None:
        n = 1
    elif isinstance(n, bool) or not isinstance(n, int):
        raise ApiError(400, f"1 validation error: n: Input should be a valid integer, got {n!r}.", param="n")
    elif n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.", param="n")
    elif n > MAX_N:
        raise ApiError(400, f"n must be at most {MAX_N} in the sim, got {n}.", param="n")
    opts = _stream_options(body)
    return Parsed(
        chat,
        n_prompt,
        max_tokens,
        _flag(body, "ignore_eos"),
        _flag(body, "stream"),
        _flag(opts, "include_usage", "stream_options."),
        key,
        n,
    )


def prompt_tokens_of(body: dict[str, Any], chat: bool) -> list[str]:
    """The prompt's tokens (a request parse_request accepted): what the prefix cache hashes."""
    if chat:
        return chat_tokens(body["messages"])
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return text_tokens(prompt) if isinstance(prompt, str) else [str(t) for t in prompt]


# What pydantic (vLLM's request models) reads as a boolean in lax mode; anything else is a 400, not
# Python's truth (bool("false") is True: `"stream": "false"` streamed).
_TRUE = frozenset(("true", "1", "yes", "on", "t", "y"))
_FALSE = frozenset(("false", "0", "no", "off", "f", "n"))


def _flag(doc: dict[str, Any], name: str, where: str = "") -> bool:
    value = doc.get(name)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ApiError(
        400, f"1 validation error: {where}{name}: Input should be a valid boolean, got {value!r}", param=name
    )


def _stream_options(body: dict[str, Any]) -> dict[str, Any]:
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(
            400,
            "1 validation error: stream_options: Input should be a valid dictionary",
            param="stream_options",
        )
    return opts or {}


def _check_sampling(body: dict[str, Any]) -> None:
    """temperature and top_p as vLLM's SamplingParams checks them (a 400 otherwise)."""
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ApiError(400, f"temperature must be non-negative, got {temperature!r}.", param="temperature")
    top_p = body.get("top_p")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):  # vLLM's SamplingParams: "top_p must be in (0, 1], got {top_p}."
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p!r}.", param="top_p")


def tokenize_answer(body: Any, model: str, max_model_len: int) -> dict[str, Any]:
    """``POST /tokenize`` as the engines answer it, counted by the sim's own tokenizer (what its
    ``usage.prompt_tokens`` reports): vLLM's request (``prompt``, or ``messages`` with the chat
    template's tokens) answered as vLLM does (``count``, ``max_model_len``, ``tokens``); llama.cpp's
    (``content``) as llama-server does (``tokens``). The ids are placeholders: the sim has no vocabulary."""
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    if body.get("model") not in (None, model):
        raise ApiError(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
    if isinstance(body.get("content"), str):
        return {"tokens": list(range(count_tokens(body["content"])))}
    messages = body.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        for i, m in enumerate(messages):
            _check_message(i, m)
        n = count_chat_tokens(messages)
    elif isinstance(body.get("prompt"), str):
        n = count_tokens(body["prompt"])
    else:
        raise ApiError(400, "'prompt' must be a string, or 'messages' a list of message objects.")
    return {"count": n, "max_model_len": max_model_len, "tokens": list(range(n))}


MAX_N = 128  # the sim's own bound: each choice is a sequence in the paged pool


def _check_message(i: int, m: dict[str, Any]) -> None:
    """One chat message as vLLM's message union accepts it (see the module docstring)."""
    role = m.get("role")
    if role is None:
        raise ApiError(
            400, f"1 validation error: messages.{i}.role: Field required", param=f"messages.{i}.role"
        )
    if not isinstance(role, str):
        raise ApiError(
            400,
            f"1 validation error: messages.{i}.role: Input should be a valid string",
            param=f"messages.{i}.role",
        )
    content = m.get("content")
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list) and all(
        isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("type"), str)) for p in content
    ):
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and not isinstance(p.get("text"), str):
                raise ApiError(
                    400,
                    f"1 validation error: messages.{i}.content.text: Input should be a valid string",
                    param=f"messages.{i}.content",
                )
        return
    raise ApiError(
        400,
        f"1 validation error: messages.{i}.content: Input should be a valid string or a list of "
        "content parts",
        param=f"messages.{i}.content",
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:  # vLLM's and llama-server's shape (OpenAI's)
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def chunk(
    rid: str,
    model: str,
    chat: bool,
    text: str | None,
    finish: str | None,
    first: bool = False,
    index: int = 0,
) -> dict[str, Any]:
    created = int(time.time())
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
    choice = {
        "index": index,
        "text": text or "",
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def usage_chunk(
    rid: str,
    model: str,
    chat: bool,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def full_response(
    rid: str,
    model: str,
    chat: bool,
    texts: list[str],
    finishes: list[str],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """One choice per (text, finish) pair: n choices for a request with n > 1."""
    choices: list[dict[str, Any]] = []
    for i, (text, finish) in enumerate(zip(texts, finishes, strict=True)):
        if chat:
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            )
        else:
            choices.append(
                {"index": i, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            )
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }
