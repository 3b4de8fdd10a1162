"""Counting a prompt's tokens in the target's own tokenizer, so "N prompt tokens" means N tokens
of the engine that serves the run (within the 2 % the prompt synthesis aims at), not N words.

Where the count comes from, in order:
- the engine's tokenize endpoint, found by trying each known request shape once:
  vLLM's (and SGLang's) ``POST /tokenize {"model", "prompt"}`` answering ``{"count", "tokens",
  "max_model_len"}`` (vllm/entrypoints/openai/protocol.py, ``TokenizeCompletionRequest``);
  llama-server's ``POST /tokenize {"content", "add_special"}`` answering ``{"tokens"}``
  (tools/server/server.cpp, ``handle_tokenize``); llama-cpp-python's ``POST /extras/tokenize
  {"input"}`` answering ``{"tokens"}`` (llama_cpp/server/app.py at 0.3.36); TGI's ``POST /tokenize
  {"inputs"}`` answering a list of tokens (router/src/server.rs). The rehearsal server answers
  vLLM's and llama-server's shapes with its own counter (sim/api.py);
- else the model's own `tokenizer.json` in a local model directory (`capacity.model`), with the
  `tokenizers` library where it is installed;
- else nothing: prompts are sized by words and their token counts are said to be an estimate.

A tokenize endpoint counts the text as the completions API sends it. What the engine adds around
it (the chat template's role markers, a BOS the endpoint leaves out) is measured once with one
non-streaming request of one output token: its ``usage.prompt_tokens`` less the endpoint's count
of the same text. Where the engine reports no usage, that difference is unknown and said so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.load.prompts import CountFailed, PromptMaker

MAX_ANSWER_BYTES = 32 << 20  # a 128k-token prompt's ids as JSON fit many times over
PROBE_TEXT = "#probe: the time of day is well past noon and the work goes on"
DISCOVER_TIMEOUT_S = 2.0  # one probe of a short text: an engine counts it in milliseconds


@dataclass(frozen=True)
class _Shape:
    name: str  # as said in the run's notes
    path: str
    body: Callable[[str, str], dict[str, Any]]  # (model, text) -> request
    count: Callable[[Any], int | None]  # answer -> tokens (None: not this shape)


def _vllm_count(doc: Any) -> int | None:
    if isinstance(doc, dict) and isinstance(doc.get("count"), int) and not isinstance(doc["count"], bool):
        return int(doc["count"])
    return None


def _token_list(doc: Any) -> int | None:
    toks = doc.get("tokens") if isinstance(doc, dict) else doc
    if isinstance(toks, list) and toks:  # llama-server answers an unknown shape with no tokens at all
        return len(toks)
    return None


SHAPES = (
    _Shape("POST /tokenize (vLLM's API)", "/tokenize", lambda m, t: {"model": m, "prompt": t}, _vllm_count),
    _Shape(
        "POST /tokenize (llama-server's API)",
        "/tokenize",
        lambda m, t: {"content": t, "add_special": True},
        _token_list,
    ),
    _Shape(
        "POST /extras/tokenize (llama-cpp-python)",
        "/extras/tokenize",
        lambda m, t: {"input": t, "model": m},
        _token_list,
    ),
    _Shape("POST /tokenize (TGI's API)", "/tokenize", lambda m, t: {"inputs": t}, _token_list),
)


class EngineTokenizer:
    """Counts through the target's tokenize endpoint; one HTTP session for the run's preparation."""

    def __init__(self, root: str, model: str, headers: dict[str, str], timeout_s: float = 10.0) -> None:
        self.root, self.model, self.headers, self.timeout_s = root.rstrip("/"), model, headers, timeout_s
        self.shape: _Shape | None = None
        self._session: Any = None

    @property
    def source(self) -> str:
        return f"the engine's {self.shape.name}" if self.shape else "none"

    async def __aenter__(self) -> EngineTokenizer:
        import aiohttp

        self._session = aiohttp.ClientSession(
            headers={"Content-Type": "application/json", **self.headers},
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def discover(self) -> bool:
        """Try each known shape on a short text; keep the first that answers with a count. A target
        that does not answer one probe within DISCOVER_TIMEOUT_S (hung, or answering garbage forever)
        is asked nothing more: the run's own clock is not spent on it."""
        for shape in SHAPES:
            try:
                n = await self._ask(shape, PROBE_TEXT, DISCOVER_TIMEOUT_S)
            except TokenizeTimeout:
                return False
            except TokenizeError:
                continue
            if n:
                self.shape = shape
                return True
        return False

    async def count(self, text: str) -> int:
        assert self.shape is not None, "discover() first"
        return await self._ask(self.shape, text)

    async def _ask(self, shape: _Shape, text: str, timeout_s: float | None = None) -> int:
        import aiohttp

        limit = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        try:
            async with self._session.post(
                self.root + shape.path, json=shape.body(self.model, text), timeout=limit
            ) as r:
                raw = await _bounded(r)
                if r.status != 200:
                    raise TokenizeError(f"{shape.path}: HTTP {r.status}")
        except asyncio.TimeoutError:  # aiohttp's timeouts subclass it
            raise TokenizeTimeout(f"{shape.path}: no answer within the timeout") from None
        except aiohttp.ClientError as exc:
            raise TokenizeError(f"{shape.path}: {type(exc).__name__}: {exc}") from None
        try:
            n = shape.count(json.loads(raw))
        except (ValueError, RecursionError):
            n = None
        if n is None:
            raise TokenizeError(f"{shape.path}: not {shape.name}'s answer")
        return n


class TokenizeError(CountFailed):
    """The tokenize endpoint did not answer with a count."""


class TokenizeTimeout(TokenizeError):
    """It did not answer in time: a target that hangs on one probe is asked nothing more."""


async def _bounded(resp: Any) -> bytes:
    buf = bytearray()
    while True:
        chunk = await resp.content.read(1 << 16)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > MAX_ANSWER_BYTES:
            raise TokenizeError(f"an answer over {MAX_ANSWER_BYTES >> 20} MiB")


async def usage_prompt_tokens(
    url: str, model: str, api: str, headers: dict[str, str], text: str, timeout_s: float
) -> int | None:
    """The engine's ``usage.prompt_tokens`` for *text* sent as the run sends it (one output token,
    not streamed: every engine reports usage there); None when it reports none or fails."""
    import aiohttp

    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    chat = api == "openai-chat"
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "stream": False}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    try:
        async with (
            aiohttp.ClientSession(
                headers={"Content-Type": "application/json", **headers},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as s,
            s.post(base + ("/chat/completions" if chat else "/completions"), json=body) as r,
        ):
            raw = await _bounded(r)
            if r.status != 200:
                return None
        usage = json.loads(raw).get("usage") or {}
    except (aiohttp.ClientError, asyncio.TimeoutError, TokenizeError, ValueError, AttributeError):
        return None
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


async def open_prompt_maker(
    stack: Any,
    url: str,
    model: str,
    api: str,
    api_key: str | None,
    timeout_s: float,
    model_dir: str | None = None,
) -> tuple[PromptMaker, str]:
    """(a PromptMaker for the target, the note that says how its prompts' tokens are counted).
    The engine's tokenize endpoint first; else *model_dir*'s own tokenizer.json; else words.
    *stack* (an AsyncExitStack) keeps the tokenize session open for the run."""
    root = url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    engine = await stack.enter_async_context(EngineTokenizer(root, model, headers, min(timeout_s, 30.0)))
    tok: EngineTokenizer | LocalTokenizer = engine
    if not await engine.discover():
        local, why = local_tokenizer(model_dir)
        if local is None:
            tried = ", ".join(sorted({s.path for s in SHAPES}))
            return PromptMaker(), (
                f"prompt tokens: an estimate (one token a word): the target answered no tokenize endpoint "
                f"(tried {tried})"
                + (f"; {why}" if why else "")
                + "; the engine's usage counts replace it where it reports them"
            )
        tok = local
    try:
        raw = await tok.count(PROBE_TEXT)
    except TokenizeError as exc:
        return PromptMaker(), f"prompt tokens: an estimate (one token a word): {exc}"
    used = await usage_prompt_tokens(url, model, api, headers, PROBE_TEXT, min(timeout_s, 60.0))
    if used is None:
        return PromptMaker(tok, 0, added_known=False), (
            f"prompt tokens: counted with {tok.source}, but the engine reported no usage for a probe "
            "request, so what it adds around the text (chat template, BOS) is unknown: the counts are "
            "an estimate"
        )
    added = used - raw
    what = "the chat template" if api == "openai-chat" else "the engine"
    return PromptMaker(tok, added), (
        f"prompt tokens: counted with {tok.source}; {what} adds {added} token{'s' if added != 1 else ''} "
        f"around the text (a probe request: usage {used} for {raw} counted)"
    )


__all__ = ["SHAPES", "EngineTokenizer", "TokenizeError", "open_prompt_maker", "usage_prompt_tokens"]


class LocalTokenizer:
    """The model's own `tokenizer.json` (a Hugging Face model directory), read with the `tokenizers`
    library where it is installed: the count where the engine has no tokenize endpoint
    (`transformers serve`, Ollama). Its BOS and the chat template are measured by the same probe."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        from vramlab.infile import read_text

        self.path = path
        self._tok = Tokenizer.from_str(read_text(path, "tokenizer"))

    @property
    def source(self) -> str:
        return f"the model's own tokenizer ({self.path})"

    async def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)


def local_tokenizer(model: str | None) -> tuple[LocalTokenizer | None, str]:
    """(the tokenizer of a local model directory, or None with why not: no directory, no
    tokenizer.json, the `tokenizers` library missing, a file it cannot read)."""
    import os

    if not model or not os.path.isdir(model):
        return None, ""
    path = os.path.join(model, "tokenizer.json")
    if not os.path.isfile(path):
        return None, f"{model} has no tokenizer.json"
    try:
        return LocalTokenizer(path), ""
    except ImportError:
        return None, f"{path} is there, but the tokenizers library is not installed (pip install tokenizers)"
    except Exception as exc:  # a file tokenizers cannot parse: said, the prompts fall back to words
        return None, f"{path}: {type(exc).__name__}: {exc}"[:200]
