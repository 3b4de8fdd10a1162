"""How many more users the KV pool holds when requests share a prefix (a system prompt, few-shot
examples, a conversation's history). Pure.

With prefix caching, an engine keeps a full block of a shared prefix once, however many requests use
it: vLLM V1 (``enable_prefix_caching``, on by default from 0.8: vllm/v1/core/kv_cache_manager.py
shares only full blocks, known by a hash of their tokens and of every token before them), SGLang's
radix cache (on unless --disable-radix-cache) and TGI 3 (prefix caching on by default since 3.0).
Each request then needs blocks only for what follows the shared full blocks. llama.cpp keeps its
prompt cache per slot (tools/server: each slot reuses its own previous prompt), so a prefix shared
by several slots is held once per slot; vLLM's V0 engine (before 0.8) and Ollama and transformers
serve are planned without sharing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from vramlab.capacity.estimate import Estimate


@dataclass(frozen=True)
class PrefixSharing:
    shared_tokens: int  # every request's common prefix, as given
    request_tokens: int  # one request's whole length (prompt and answer)
    block_size: int
    shared_blocks: int  # of them, the full blocks held once (0 where the engine does not share)
    users_without: float  # requests of request_tokens the pool holds without sharing
    users_with: float  # ... with the shared blocks held once
    applies: bool
    why: str  # how the engine keeps a shared prefix

    @property
    def more_users(self) -> float:
        return self.users_with - self.users_without

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["users_without"] = round(self.users_without, 2)
        out["users_with"] = round(self.users_with, 2)
        out["more_users"] = round(self.more_users, 2)
        return out


def _shares(est: Estimate) -> tuple[bool, str]:
    from vramlab.capacity.settings import parse_version

    engine = est.engine
    settings = est.settings or {}
    if engine == "vllm":
        if settings.get("enable_prefix_caching") is False:
            return False, "vLLM with prefix caching turned off (--no-enable-prefix-caching)"
        if parse_version(est.engine_version) < (0, 8):
            return False, "vLLM's V0 engine (before 0.8) has prefix caching off by default"
        return True, "vLLM V1's prefix caching holds each full shared block once"
    if engine == "sglang":
        return True, "SGLang's radix cache holds a shared prefix once"
    if engine == "tgi":
        if parse_version(est.engine_version) < (3,):
            return False, "TGI before 3.0 has no prefix caching by default"
        return True, "TGI 3's prefix caching holds a shared prefix once"
    if engine == "llama.cpp":
        return False, "llama.cpp keeps its prompt cache per slot: a shared prefix is held once per slot"
    return False, f"{engine} is planned without prefix sharing"


def prefix_sharing(est: Estimate, shared_tokens: int, request_tokens: int | None = None) -> PrefixSharing:
    """The users a pool holds at *request_tokens* (default: max_model_len) with and without every
    request sharing its first *shared_tokens* tokens, counted in the pool's blocks as the engine does."""
    length = request_tokens or est.max_model_len
    bs = max(1, est.block_size)
    if shared_tokens < 0 or length < 1:
        raise ValueError("shared tokens must be >= 0 and a request at least 1 token")
    shared_tokens = min(shared_tokens, length)
    per_request = math.ceil(length / bs)
    # the pool in blocks as the plan counts it (hybrid models: its concurrency at max_model_len)
    pool_blocks = est.max_concurrency * math.ceil(est.max_model_len / bs)
    without = pool_blocks / per_request
    applies, why = _shares(est)
    # full blocks only, and a request always computes its last token itself (vLLM recomputes it)
    shared_blocks = min(shared_tokens, length - 1) // bs if applies else 0
    own = math.ceil(length / bs) - shared_blocks
    with_ = max(0.0, (pool_blocks - shared_blocks) / own) if shared_blocks else without
    return PrefixSharing(shared_tokens, length, bs, shared_blocks, without, with_, applies, why)


__all__ = ["PrefixSharing", "prefix_sharing"]
