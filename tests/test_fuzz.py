"""Property-based fuzzing of every parser that reads outside input: config.json, GGUF and
safetensors headers, engine log text, plan YAML (experiment and drill) and SSE streams.

The property: on any input the parser returns, or raises the project's own input error
(`VramlabError`), within a time bound; never another exception, never a hang. The budget is fixed
and derandomized (the same examples every run, a few seconds per target) so it runs in CI; raise
it locally with VRAMLAB_FUZZ_EXAMPLES=2000.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlab.errors import VramlabError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("VRAMLAB_FUZZ_EXAMPLES", "150"))
TIME_LIMIT_S = 5.0  # per example; the parsers take milliseconds, a blow-up takes far longer
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
STATS: dict[str, int] = {}


def bounded(target: str, fn: Callable[[], Any]) -> None:
    """Run *fn*: only VramlabError may escape, and it must finish in TIME_LIMIT_S."""
    STATS[target] = STATS.get(target, 0) + 1
    t = time.perf_counter()
    try:
        fn()
    except VramlabError as exc:
        assert str(exc).strip(), "an input error needs words"
    elapsed = time.perf_counter() - t
    assert elapsed < TIME_LIMIT_S, f"{target}: {elapsed:.1f} s on one input"


# -- JSON-ish values: what a mutated config field can become ----------------------------------
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "bfloat16", "float7", "NaN", "1e400", "32"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# The bundled catalog's config.json copies (each with its source) are the seeds.
CONFIGS: dict[str, dict[str, Any]] = {
    m["name"]: m["config"]
    for m in json.loads((ROOT / "src" / "vramlab" / "data" / "models.json").read_text())
    if isinstance(m.get("config"), dict)
}


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    base = dict(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))])
    keys = sorted(base)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["set", "drop", "add"]))
        if action == "drop" and keys:
            base.pop(draw(st.sampled_from(keys)), None)
        elif action == "set" and keys:
            base[draw(st.sampled_from(keys))] = draw(json_values)
        else:
            base[
                draw(
                    st.sampled_from(
                        [
                            "num_hidden_layers",
                            "head_dim",
                            "num_experts",
                            "sliding_window",
                            "quantization_config",
                            "text_config",
                            "layer_types",
                            "kv_lora_rank",
                        ]
                    )
                )
            ] = draw(json_values)
    return base


@FUZZ
@given(mutated_configs())
def test_fuzz_config_json(config: dict[str, Any]) -> None:
    from vramlab.sources.hf_config import spec_from_config

    bounded("config.json", lambda: spec_from_config(config, "fuzz", "fuzz"))


# -- safetensors headers ------------------------------------------------------------------------
tensor_entries = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from(["F16", "BF16", "F32", "I8", "F8_E4M3", "U8"]), scalars),
        "shape": st.one_of(st.lists(st.integers(-5, 2**40), max_size=4), json_values),
        "data_offsets": st.one_of(st.lists(st.integers(-5, 2**62), min_size=2, max_size=2), json_values),
    }
)
headers = st.dictionaries(st.text(max_size=12), st.one_of(tensor_entries, json_values), max_size=6)


@FUZZ
@given(
    st.one_of(
        headers.map(lambda h: json.dumps(h, allow_nan=True).encode()),
        st.binary(max_size=200),
        headers.map(lambda h: json.dumps(h).encode()).flatmap(
            lambda b: st.integers(0, max(0, len(b))).map(lambda n: b[:n])
        ),  # cut short
    ),
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)
def test_fuzz_safetensors_header(header: bytes, claimed: int | None) -> None:
    from vramlab.sources.safetensors import parse_file_bytes

    n = len(header) if claimed is None else claimed
    bounded("safetensors", lambda: parse_file_bytes(struct.pack("<Q", n) + header))


# -- GGUF headers: a real small file, its bytes mutated --------------------------------------------
@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    import _sources_files

    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _sources_files.write_gguf(p)
    return p.read_bytes()


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, 4096), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(8, 4096)),
)
def test_fuzz_gguf_header(
    gguf_bytes: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    edits: list[tuple[int, bytes]],
    cut: int | None,
) -> None:
    from vramlab.sources.gguf_file import config_from_gguf, read_gguf_facts

    data = bytearray(gguf_bytes)
    for at, patch in edits:  # the header, counts, key lengths and types live in the first few KiB
        at = min(at, len(data) - 1)
        data[at : at + len(patch)] = patch
    if cut is not None:
        data = data[:cut]
    p = tmp_path_factory.getbasetemp() / "fuzz.gguf"
    p.write_bytes(bytes(data))

    def go() -> None:
        facts = read_gguf_facts(p)
        config_from_gguf(facts, "fuzz.gguf")

    bounded("gguf", go)


# -- engine log text -----------------------------------------------------------------------------
LOG_LINES = [
    ln
    for f in sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
    for ln in f.read_text(errors="replace").splitlines()
]
NUMBER = re.compile(r"\d+(\.\d+)?")


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.sampled_from(LOG_LINES),
            st.sampled_from(LOG_LINES).flatmap(
                lambda s: st.sampled_from(["0", "-1", "1e400", "nan", "99999999999999999999", "", "0.0"]).map(
                    lambda v: NUMBER.sub(v, s, count=2)
                )
            ),
            st.text(max_size=200),
            st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="replace")),
        ),
        max_size=40,
    ),
    st.sampled_from([None, "vllm", "sglang", "tgi", "llama.cpp", "ollama"]),
)
def test_fuzz_log_text(lines: list[str], engine: str | None) -> None:
    from vramlab.logs.detect import parse_log

    bounded("log text", lambda: parse_log(lines, engine))


# -- plan YAML: the shipped examples with values swapped for junk --------------------------------
PLANS = {
    p.name: p.read_text()
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    if p.name not in ("fleet.yaml", "models.yaml")
}
YAML_SCALAR = re.compile(r"(:\s+)([^\s#\[{][^#\n]*?)(\s*(#.*)?)$", re.M)
yaml_junk = st.sampled_from(
    [
        ".inf",
        "-.inf",
        ".nan",
        "0",
        "-1",
        "1e400",
        "null",
        "~",
        "[]",
        "{}",
        "''",
        "yes",
        "[1, [2, [3]]]",
        "!!binary aGVsbG8=",
        "&a [*a]",
        "3.0e-400",
        "'\\x00'",
        "999999999999",
    ]
)


@st.composite
def mutated_plans(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(PLANS)))
    text = PLANS[name]
    spots = list(YAML_SCALAR.finditer(text))
    for _ in range(draw(st.integers(1, 3))):
        m = draw(st.sampled_from(spots))
        text = text[: m.start(2)] + draw(yaml_junk) + text[m.end(2) :]
        spots = list(YAML_SCALAR.finditer(text))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut]
    return name, text


@FUZZ
@given(mutated_plans())
def test_fuzz_plan_yaml(named: tuple[str, str]) -> None:
    import yaml

    name, text = named
    if "drill" in name:
        from vramlab.drill.plan import parse_plan as parse_drill

        def go() -> None:
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError:
                return  # the loader's own error path turns this into a ConfigError (tested in the corpus)
            parse_drill(doc, name)

        bounded("plan yaml", go)
    else:
        from vramlab.experiment.plan import parse_plan

        def go_plan() -> None:
            plan = parse_plan(text, name)
            plan.wall_clock_s()
            plan.planned_seconds()

        bounded("plan yaml", go_plan)


# -- SSE streams: what a server (or a proxy in front of it) may send ------------------------------
sse_events = st.one_of(
    st.sampled_from(
        [
            b'data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}',
            b'data: {"choices":[{"index":0,"text":" hi"}]}',
            b"data: [DONE]",
            b": ping",
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":"x"}}',
            b'data: {"error":{"message":"boom"}}',
            b'data: {"error":"flat"}',
            b"data: null",
            b"data: [1,2]",
            b'data: {"choices":null}',
            b'data: {"choices":[null]}',
            b'data: {"choices":[{"delta":null}]}',
            b"event: x\nid: 1",
            b"data:",
        ]
    ),
    st.binary(max_size=80).map(lambda b: b"data: " + b),
    json_values.map(lambda v: b"data: " + json.dumps(v).encode()),
)


class _FakeContent:
    """aiohttp's StreamReader as the client uses it: readany() (b"" at the end) and iter_any()."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    async def iter_any(self):
        while self.chunks:
            yield self.chunks.pop(0)


class _FakeResp:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _FakeContent(chunks)


@FUZZ
@given(
    st.lists(sse_events, max_size=12),
    st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]),
    st.lists(st.integers(1, 64), min_size=1, max_size=8),
    st.sampled_from(["openai-chat", "openai-completions"]),
)
def test_fuzz_sse_stream(events: list[bytes], sep: bytes, cuts: list[int], api: str) -> None:
    from vramlab.load.client import OpenAIClient
    from vramlab.load.sse import Stream

    raw = sep.join(events) + sep
    chunks, i, k = [], 0, 0
    while i < len(raw):  # the network splits the stream anywhere
        n = cuts[k % len(cuts)]
        chunks.append(raw[i : i + n])
        i, k = i + n, k + 1
    client = OpenAIClient("http://127.0.0.1:1", "m", api)  # type: ignore[arg-type]

    def go() -> None:
        st_ = Stream()
        asyncio.run(client._read_stream(_FakeResp(chunks), st_))
        assert st_.error is None or isinstance(st_.error, str)
        assert all(isinstance(t, float) for t in st_.times)

    bounded("sse", go)


# -- request traces (Mooncake JSONL, BurstGPT CSV, vramlab JSONL) --------------------------------
SAMPLE_LINES = {
    "mooncake": (ROOT / "examples" / "mooncake-sample.jsonl").read_text().splitlines()[:6],
    "burstgpt": (ROOT / "examples" / "burstgpt-sample.csv").read_text().splitlines()[:6],
    "jsonl": (ROOT / "examples" / "trace.jsonl").read_text().splitlines()[:6],
}


@FUZZ
@given(
    st.sampled_from(sorted(SAMPLE_LINES)),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 80), st.text(max_size=8)), max_size=4),
    st.one_of(st.none(), st.integers(1, 5)),
)
def test_fuzz_trace(fmt: str, edits: list[tuple[int, int, str]], max_requests: int | None) -> None:
    from vramlab.load.trace import parse_trace

    lines = list(SAMPLE_LINES[fmt])
    for i, at, junk in edits:
        line = lines[i % len(lines)]
        lines[i % len(lines)] = line[:at] + junk + line[at + len(junk) :]
    bounded("trace", lambda: parse_trace("\n".join(lines), fmt, 1.0, max_requests))  # type: ignore[arg-type]


def test_every_target_ran_its_budget() -> None:
    """Run last (file order): each target saw its full, fixed number of examples."""
    if len(STATS) < 6:
        pytest.skip("run with the whole file to check the budget")
    assert all(n >= EXAMPLES for n in STATS.values()), STATS
    print("fuzz examples per target:", STATS)
