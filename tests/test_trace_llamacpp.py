"""A Mooncake trace against a real engine: llama.cpp (llama-cpp-python's server, CPU) on the tiny
random-weight GGUF of tests/_llamacpp.py. Prompts get the trace's lengths in the engine's own tokens
(its /extras/tokenize), and requests whose hash_ids share blocks share their prefix: the engine
itself says so, in its own words (llama-cpp-python 0.3.36 logs "Llama.generate: N prefix-match hit,
remaining M prompt tokens to eval" for every prompt that starts with the tokens it evaluated last;
llama_cpp/llama.py, ``generate``). Needs VRAMLAB_TEST_LLAMACPP_PYTHON (scripts/engine-llamacpp)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import _llamacpp as lc
from vramlab.load.trace import read_trace
from vramlab.store import open_store

pytestmark = pytest.mark.slow

# Four requests 1.5 s apart: two conversations under one shared first block, the first one back with
# a new block after its own two. llama-cpp-python holds one sequence: each request is compared with
# the one before it.
TRACE = [
    {"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1030, "output_length": 4, "hash_ids": [0, 2, 4]},
    {"timestamp": 3000, "input_length": 1100, "output_length": 4, "hash_ids": [0, 2, 3]},
    {"timestamp": 4500, "input_length": 300, "output_length": 4, "hash_ids": [9]},
]


def test_a_trace_replays_against_llamacpp_with_its_lengths_and_its_shared_prefixes(tmp_path: Path) -> None:
    py = lc.engine_python()
    model = lc.write_gguf(tmp_path / "tiny-random.gguf")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    plan = {
        "name": "trace-llamacpp",
        "rounds": 1,
        "target": {"base_url": "URL", "api": "openai-completions", "model": "tiny", "kind": "llama.cpp"},
        "fixed": {"input": {"trace": "t.jsonl", "format": "mooncake"}},
        "change": {"variable": "concurrency", "baseline": 1, "steps": [1]},
        "phases": {"duration_s": 6.5, "drain_s": 20},
        "load": {"mode": "open", "max_concurrency": 4, "request_timeout_s": 60},
        "samplers": {"interval_s": 0.5, "sources": ["health"]},
    }
    srv = lc.start_server(py, model, tmp_path / "server.log", n_ctx=2048, extra="--model_alias tiny")
    try:
        plan["target"]["base_url"] = srv.url  # type: ignore[index]
        (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
        res = subprocess.run(
            [sys.executable, "-m", "vramlab", "run", "plan.yaml", "--db", str(tmp_path / "v.db"), "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=400,
            env={**os.environ},
        )
    finally:
        srv.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    reqs = [
        r for r in open_store(str(tmp_path / "v.db")).requests(out["run_id"]) if r.error_class != "cancelled"
    ]
    assert len(reqs) == 3 * len(TRACE) and all(r.ok for r in reqs), [r.error for r in reqs if not r.ok][:3]
    trace = read_trace(tmp_path / "t.jsonl", "mooncake")
    for r in reqs:
        k = int(r.request_id.rsplit("-", 1)[1])
        assert r.prompt_tokens is not None and r.prompt_tokens_source in ("usage", "tokenizer")
        assert abs(r.prompt_tokens - trace[k].input_tokens) <= 0.05 * trace[k].input_tokens, (r, trace[k])
    # the engine's own words: how many tokens of each prompt it did not evaluate again
    hits = [
        int(n)
        for n in re.findall(r"Llama\.generate: (\d+) prefix-match hit", (tmp_path / "server.log").read_text())
    ]
    # in each of the three windows the 2nd request starts with block 0 of the 1st (512 tokens), the 3rd
    # with blocks 0 and 2 of the 2nd (1,024 tokens); the 4th shares nothing
    assert sum(1 for h in hits if 500 <= h < 1000) >= 3, hits
    assert sum(1 for h in hits if h >= 1000) >= 3, hits
