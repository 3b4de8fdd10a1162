"""Arrival processes, prompts and retry policies: statistical properties with a seed."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.errors import ConfigError
from vramlab.load.arrivals import gaps, offsets
from vramlab.load.prompts import jsonl_prompts, synthetic_prompts
from vramlab.load.retry import RetryPolicy


def _take(g, n):
    return [next(g) for _ in range(n)]


def test_poisson_mean_rate_and_cv() -> None:
    xs = _take(gaps(50.0, "poisson", seed=3), 20000)
    assert statistics.fmean(xs) == pytest.approx(1 / 50, rel=0.03)
    # exponential gaps: coefficient of variation 1
    assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_the_spread_not_the_rate(burstiness: float) -> None:
    xs = _take(gaps(20.0, "gamma", burstiness, seed=11), 20000)
    assert statistics.fmean(xs) == pytest.approx(1 / 20, rel=0.05)
    cv = statistics.pstdev(xs) / statistics.fmean(xs)
    assert cv == pytest.approx(1 / burstiness**0.5, rel=0.08)


def test_constant_and_seeded() -> None:
    assert offsets(4.0, 5, "constant") == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert offsets(10, 50, "gamma", 0.5, seed=1) == offsets(10, 50, "gamma", 0.5, seed=1)
    assert offsets(10, 50, "poisson", seed=1) != offsets(10, 50, "poisson", seed=2)
    with pytest.raises(ValueError):
        next(gaps(0.0))


@settings(max_examples=50, deadline=None)
@given(
    st.floats(0.1, 1000),
    st.integers(1, 200),
    st.sampled_from(["poisson", "gamma", "constant"]),
    st.floats(0.1, 10),
    st.integers(0, 10**6),
)
def test_offsets_start_at_zero_and_never_go_back(
    rate: float, n: int, arrival: str, b: float, seed: int
) -> None:
    xs = offsets(rate, n, arrival, b, seed)  # type: ignore[arg-type]
    assert len(xs) == n and xs[0] == 0
    assert all(b2 >= a for a, b2 in zip(xs, xs[1:], strict=False))


def test_synthetic_prompts_are_reproducible_and_sized() -> None:
    a = synthetic_prompts(100, 16, 20, seed=5)
    assert a == synthetic_prompts(100, 16, 20, seed=5)
    assert a != synthetic_prompts(100, 16, 20, seed=6)
    assert len({p.text for p in a}) == 20  # distinct: a prefix cache cannot serve them for free
    assert all(len(p.text.split()) == 98 and p.output_tokens == 16 for p in a)


def test_jsonl_prompts(tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_text('{"prompt": "hello", "max_tokens": 5}\n\n{"prompt": "bye"}\n')
    ps = jsonl_prompts(f, default_output_tokens=9)
    assert [(p.text, p.output_tokens) for p in ps] == [("hello", 5), ("bye", 9)]
    f.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(ConfigError, match=r"in.jsonl:2: prompt"):
        jsonl_prompts(f)


def test_retry_policies() -> None:
    rng = random.Random(0)
    none, imm = RetryPolicy("none"), RetryPolicy("immediate", max_attempts=3)
    assert not none.should_retry(0, 503, "http_5xx")
    assert imm.should_retry(0, 503, "http_5xx") and imm.should_retry(1, 0, "connect")
    assert not imm.should_retry(2, 503, "http_5xx")  # third attempt was the last
    assert not imm.should_retry(0, 400, "http_4xx") and imm.should_retry(0, 429, "http_4xx")
    assert not imm.should_retry(0, 0, "cancelled")
    assert imm.delay_s(1, rng) == 0
    exp = RetryPolicy("exponential", max_attempts=10, base_s=0.1, max_s=1.0, jitter=0.5)
    ds = [exp.delay_s(a, rng) for a in range(6)]
    assert 0.05 <= ds[0] <= 0.1 and 0.1 <= ds[1] <= 0.2 and all(0.5 <= d <= 1.0 for d in ds[4:])
