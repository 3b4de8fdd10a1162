"""Property tests: parsers never crash on junk; real published lines round-trip to their figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlab.errors import VramlabError
from vramlab.logs import llamacpp, ollama, sglang, tgi, vllm
from vramlab.logs.detect import parse_log
from vramlab.logs.observation import from_dataset_row
from vramlab.logs.signatures import classify_line, scan

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
ROWS = [json.loads(line) for line in (FIXTURES / "observed_memory_lines.jsonl").read_text().splitlines()]
REAL_LINES = [ln for r in ROWS for ln in r["raw_log_lines"]]
PARSERS = (vllm, sglang, tgi, llamacpp, ollama)

# Junk: arbitrary text, decoded binary, and real lines cut, spliced and mangled.
junk_line = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", errors="replace")),
    st.tuples(st.sampled_from(REAL_LINES), st.integers(0, 200), st.text(max_size=20)).map(
        lambda t: t[0][: t[1]] + t[2]
    ),
    st.sampled_from(REAL_LINES).map(lambda s: s.replace("GiB", "G1B").replace(".", ",")),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(junk_line, max_size=25))
def test_parsers_never_crash_on_junk(lines):
    for parser in PARSERS:
        for obs in parser.parse(lines):
            # whatever was read is typed: bytes are ints, sources point into the input
            for f in ("weights_bytes", "kv_cache_bytes", "activation_peak_bytes", "cuda_graph_bytes"):
                assert getattr(obs, f) is None or isinstance(getattr(obs, f), int)
            assert all(1 <= s.line <= len(lines) for s in obs.source_lines)
    try:
        parse_log(lines)
    except VramlabError:
        pass  # "nothing recognizable" is a clear error, not a crash
    for line in lines:
        classify_line(line)
    scan(lines)


PREFIXES = [
    "",
    "INFO 04-10 09:13:17 [gpu_worker.py:306] ",
    "(EngineCore_DP0 pid=2950) INFO 04-10 09:13:17 [gpu_worker.py:306] ",
    "\x1b[1;36m(VllmWorker rank=0 pid=4211)\x1b[0;0m INFO 08-20 10:03:28 [gpu_model_runner.py:1953] ",
    "INFO 05-02 11:22:20 worker.py:287] ",
]


def _gib(x):
    return None if x is None else int(round(x * (1 << 30)))


@pytest.mark.parametrize("row", ROWS, ids=[r["row_id"] for r in ROWS])
@settings(max_examples=3, deadline=None)
@given(prefix=st.sampled_from(PREFIXES))
def test_real_lines_round_trip_to_the_published_figures(row, prefix):
    lines = [prefix + ln for ln in row["raw_log_lines"]]
    found = vllm.parse(lines)
    assert len(found) == 1, [o.model_dump(exclude_none=True) for o in found]
    o = found[0]
    expected = from_dataset_row(row)
    for f in (
        "kv_cache_bytes",
        "kv_cache_tokens",
        "activation_peak_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "gpu_blocks",
        "max_concurrency",
        "total_gpu_memory_bytes",
    ):
        assert getattr(o, f) == getattr(expected, f), f
    weights = _gib(row["weights_gib"]) if row["weights_gib"] is not None else _gib(row["weights_load_line"])
    # the load line prints 4 decimals where the summary prints 2; both are the same GiB figure
    assert abs(o.weights_bytes - weights) <= 0.006 * (1 << 30)
    if row.get("max_concurrency_tokens_per_request"):
        assert o.max_model_len == row["max_concurrency_tokens_per_request"]
    assert o.source_lines and all(s.text.startswith(prefix) for s in o.source_lines)


@given(st.integers(0, 10**15))
def test_a_number_grouped_by_thousands_reads_back(n: int) -> None:
    from vramlab.logs.base import integer

    assert integer(f"{n:,}") == n and integer(str(n)) == n


@given(st.lists(st.integers(0, 999), min_size=2, max_size=5), st.sampled_from([",,", ",", ", "]))
def test_commas_that_do_not_group_thousands_are_not_a_number(groups: list[int], sep: str) -> None:
    """ "1,2,,6 tokens" once read as 126: commas were dropped whatever they grouped."""
    from vramlab.logs.base import integer

    text = sep.join(str(g) for g in groups)
    grouped = sep == "," and all(len(str(g)) == 3 for g in groups[1:]) and len(str(groups[0])) <= 3
    if grouped:
        assert integer(text) == int(text.replace(",", ""))
    else:
        with pytest.raises(ValueError):
            integer(text)
