"""Continuous batching over a paged pool: admission, preemption by recompute, block accounting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.sim.scheduler import Request, Scheduler
from vramlab.sim.timing import Roofline


def _drain(s: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while (s.running or s.waiting) and steps < max_steps:
        batch = s.schedule()
        s.complete(batch, float(steps))
        assert s.free_blocks + sum(r.blocks for r in s.running) == s.num_blocks
        assert len(s.running) <= s.max_num_seqs
        steps += 1
    return steps


def test_a_full_pool_preempts_the_newest_and_everyone_still_finishes():
    s = Scheduler(
        num_blocks=8, block_size=16, max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=256
    )
    reqs = [Request(f"r{i}", prompt_tokens=20, max_tokens=40, stop_at=40) for i in range(4)]
    for r in reqs:
        s.add(r)
    first = s.schedule()
    assert [r.id for r, _ in first.scheduled] == ["r0", "r1", "r2", "r3"]  # 4 x 2 blocks = the whole pool
    s.complete(first, 0.0)
    _drain(s)
    assert s.num_preemptions > 0
    assert all(r.finished_reason == "length" and r.generated == 40 for r in reqs)
    # FCFS V1 policy: the oldest request is never the victim while younger ones run.
    assert reqs[0].preemptions == 0
    assert s.free_blocks == s.num_blocks


def test_admission_waits_for_blocks_and_respects_max_num_seqs():
    s = Scheduler(
        num_blocks=100, block_size=16, max_num_seqs=2, max_num_batched_tokens=4096, max_model_len=1024
    )
    for i in range(5):
        s.add(Request(f"r{i}", 10, 3, 3))
    b = s.schedule()
    assert len(b.scheduled) == 2 and len(s.waiting) == 3
    big = Scheduler(
        num_blocks=4, block_size=16, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=1024
    )
    big.add(Request("huge", 100, 1, 1))  # needs 7 blocks: it cannot be admitted
    assert big.schedule().scheduled == () and len(big.waiting) == 1


def test_chunked_prefill_respects_the_token_budget():
    s = Scheduler(
        num_blocks=100, block_size=16, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024
    )
    r = Request("long", 200, 2, 2)
    s.add(r)
    sizes = []
    while r.generated == 0:
        b = s.schedule()
        sizes.append(b.num_tokens)
        s.complete(b, 0.0)
    assert sizes == [64, 64, 64, 8]


def test_eos_stop_and_max_model_len_stop():
    s = Scheduler(
        num_blocks=100, block_size=16, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=64
    )
    eos = Request("eos", 10, 20, stop_at=5)
    cap = Request("cap", 60, 20, stop_at=20)
    s.add(eos)
    s.add(cap)
    _drain(s)
    assert (eos.finished_reason, eos.generated) == ("stop", 5)
    assert (cap.finished_reason, cap.known_tokens) == ("length", 64)


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(4, 60),
    seqs=st.integers(1, 12),
    reqs=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=15),
)
def test_blocks_are_conserved_and_all_requests_finish(blocks, seqs, reqs):
    s = Scheduler(
        num_blocks=blocks, block_size=16, max_num_seqs=seqs, max_num_batched_tokens=512, max_model_len=1024
    )
    rs = []
    for i, (p, m) in enumerate(reqs):
        if -(-(p + m) // 16) > blocks:
            continue  # one request larger than the pool can never run (the engine refuses such a start-up)
        r = Request(f"r{i}", p, m, m)
        rs.append(r)
        s.add(r)
    _drain(s)
    assert all(r.finished_reason is not None for r in rs)
    assert s.free_blocks == blocks


def test_roofline_prefill_is_compute_bound_and_decode_memory_bound():
    h100 = Roofline(
        params=8e9, weights_bytes=16 * 10**9, kv_bytes_per_token=131072, bf16_tflops=989, bandwidth_gbps=3350
    )
    decode = h100.step_s(0, 32, 32 * 1000)
    prefill = h100.step_s(8192, 0, 8192)
    assert 0.005 < decode < 0.01  # 16 GB of weights at ~2.5 TB/s effective
    assert prefill > 3 * decode  # 2 x 8e9 x 8192 FLOPs at ~50 % of 989 TFLOP/s
    assert h100.step_s(0, 64, 64 * 4000) > decode  # more KV to read costs more
    assert h100.step_s(0, 0, 0) == 0.0
