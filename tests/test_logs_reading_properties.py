"""Property tests of reading a file: the block-by-block reader gives the lines a whole-file read
gives, wherever the blocks fall; a file's writers, servers and engines are split back into exactly
the logs that were mixed; the model and card readers never fail on junk with anything but one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlab.errors import VramlabError
from vramlab.logs import reader
from vramlab.logs.cards import card_named
from vramlab.logs.check import check_file, check_log
from vramlab.logs.llamacpp_model import spec_from_log
from vramlab.logs.split import split_streams

LOGS = Path(__file__).parent / "fixtures" / "logs"


def _whole_read(data: bytes, width: int) -> list[str]:
    """What reading the whole file at once gives (the reader before it streamed)."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return [ln.rstrip("\r")[:width] if len(ln) > width or ln.endswith("\r") else ln for ln in lines]


line_bytes = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.text(max_size=40).map(lambda t: t.replace("\n", "").encode("utf-8")),
    st.sampled_from([b"", b"\r", "é€😀".encode(), b"\xff\xfe", b"x" * 70]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(line_bytes, max_size=30),
    trailing=st.booleans(),
    block=st.integers(1, 64),
    width=st.integers(1, 50),
)
def test_reading_block_by_block_gives_the_lines_of_a_whole_read(
    tmp_path, monkeypatch, lines, trailing, block, width
):
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    p = tmp_path / "log.txt"
    p.write_bytes(data)
    monkeypatch.setattr(reader, "_BLOCK", block)
    got = reader.read_log(p, max_line=width, prefilter=False)
    want = _whole_read(data, width)
    # a line cut to its width may end in a replacement character where the cut splits a character
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w or (len(w) == width and g[:-1] == w[: len(g) - 1])


def _merge(a: list[str], b: list[str], picks: list[bool]) -> list[str]:
    """a and b interleaved, each in its own order, as *picks* says (then the rest of both)."""
    out, i, j = [], 0, 0
    for take_a in picks:
        if take_a and i < len(a):
            out.append(a[i])
            i += 1
        elif j < len(b):
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]


def _body(name: str) -> list[str]:
    return [ln for ln in (LOGS / name).read_text().splitlines() if not ln.startswith("#")]


NEWEST, DEBUG = _body("vllm-v1-newest.log"), _body("vllm-v1-0.19-debug.log")
SGLANG = _body("sglang-tp4.log")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=len(DEBUG), max_size=len(DEBUG) + len(SGLANG)))
def test_two_writers_interleaved_any_way_split_back_into_their_lines(picks):
    a = [f"vllm-1  | {ln}" for ln in DEBUG]
    b = [f"Jan 12 10:00:01 gpu01 python3[77]: {ln}" for ln in SGLANG]  # compose and journald mixed
    streams = split_streams(_merge(a, b, picks))
    assert [s.lines for s in streams] == sorted([a, b], key=lambda s: _merge(a, b, picks).index(s[0]))


def _figures(reports) -> list[tuple]:
    return [
        (it.observation.engine_version, it.observation.kv_cache_bytes, it.observation.complete)
        for r in reports
        for it in r.items
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.booleans(), min_size=4, max_size=len(NEWEST) + len(DEBUG)))
def test_two_vllm_servers_interleaved_any_way_are_read_as_alone(tmp_path, picks):
    lines = _merge(NEWEST, DEBUG, picks)
    p = tmp_path / "two.log"
    p.write_text("\n".join(lines) + "\n")
    reports, skipped = check_file(p)
    alone = [check_log(LOGS / "vllm-v1-newest.log"), check_log(LOGS / "vllm-v1-0.19-debug.log")]
    got = sorted(_figures(reports), key=str)
    assert not skipped and got == sorted(_figures(alone), key=str)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60), st.one_of(st.none(), st.integers(-5, 10**13)))
def test_card_names_never_fail(name, total):
    card = card_named(name, total)
    assert card is None or card.memory_gib > 0


hparam_value = st.one_of(
    st.integers(-3, 10**6), st.lists(st.integers(0, 64), max_size=6), st.text(max_size=8)
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["arch", "n_layer", "n_embd", "n_head", "n_head_kv", "n_vocab", "n_ff", "n_expert", "n_swa"]
        ),
        hparam_value,
        max_size=9,
    ),
    st.one_of(st.none(), st.integers(-1, 10**12)),
)
def test_a_printed_shape_is_a_spec_or_one_clear_error(hp, params):
    extra = {"hparams": hp, "model_params": params, "file_bytes": 10**9}
    try:
        spec = spec_from_log(extra, "junk", "Q4_K_M")
    except VramlabError as exc:
        assert "\n" not in str(exc)
        return
    assert spec.num_layers > 0 and spec.hidden_size > 0


@pytest.mark.parametrize(
    "name", ["mixed/llamacpp-with-vllm-inside.log", "mixed/vllm-then-ollama-then-llamacpp.log"]
)
def test_each_engine_of_a_mixed_file_keeps_the_files_line_numbers(name):
    text = (LOGS / name).read_text().splitlines()
    reports, _ = check_file(LOGS / name)
    for r in reports:
        for it in r.items:
            assert all(text[s.line - 1] == s.text for s in it.observation.source_lines)
