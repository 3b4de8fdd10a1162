"""The saturation point from both sides: predicted from the engine's own limits (slots, max_num_seqs,
serial serving, the pool at the steps' real request size, the context) and observed from what the
engine showed (KV usage, preemptions, the waiting queue, refusals for length), naming the step."""

from __future__ import annotations

from vramlab.analysis.saturation import RequestShape, StepSignals, predict, request_shape, saturation
from vramlab.records import RequestRecord
from vramlab.records.capacity_plan import CapacityEstimate

E = CapacityEstimate.from_json  # the plan --json as stored, read the way compose() reads it


def _req(step: int, value: float, prompt: int = 80, out: int = 8, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        run_id="r",
        round=1,
        phase="ramp",
        step=step,
        step_value=value,
        request_id=f"{step}-{prompt}-{error is None}",
        prompt_tokens=prompt,
        output_tokens=None if error else out,
        status_code=400 if error else 200,
        error_class="http_4xx" if error else None,
        error=error,
    )


SHAPE = RequestShape(80, 8, 1, True)


def test_llama_cpp_concurrency_is_its_slots_not_the_pool_padding() -> None:
    plan = {"engine": "llama.cpp", "block_size": 256, "max_model_len": 2048, "settings": {"parallel": 1}}
    value, basis, binding = predict("concurrency", E(plan), 2048, SHAPE)
    assert (value, binding) == (1.0, "slots") and "--parallel" in basis  # not 2,048 / 256 = 8
    plan["settings"] = {"parallel": 4}
    assert predict("concurrency", E(plan), 2048, SHAPE)[0] == 4.0


def test_serial_serving_saturates_at_one() -> None:
    plan = {"engine": "transformers", "settings": {"continuous_batching": False}}
    assert predict("concurrency", E(plan), None, SHAPE)[:1] == (1.0,)
    assert predict("concurrency", E(plan), None, SHAPE)[2] == "serial"
    assert predict("prompt_tokens", E(plan), None, SHAPE)[0] is None  # no pool: memory grows instead


def test_a_paged_pool_counts_the_steps_real_requests_and_max_num_seqs() -> None:
    plan = {"engine": "vllm", "block_size": 16, "max_model_len": 8192, "settings": {"max_num_seqs": 256}}
    # 80 + 8 tokens a request, in whole 16-token blocks: 96; 9,600 / 96 = 100 requests
    assert predict("concurrency", E(plan), 9600, SHAPE)[::2] == (100.0, "pool")
    plan["settings"] = {"max_num_seqs": 48}
    value, basis, binding = predict("concurrency", E(plan), 9600, SHAPE)
    assert (value, binding) == (48.0, "max_num_seqs") and "queue" in basis
    shape = request_shape({"load": {"concurrency": 2}}, [_req(0, 2.0, prompt=1000, out=24)])
    assert shape == RequestShape(1000, 24, 2, True)  # the stored requests, not the plan's figures


def test_context_refusals_are_observed_at_their_step_in_the_engines_words() -> None:
    plan = {"engine": "llama.cpp", "max_model_len": 512, "settings": {"parallel": 1}}
    assert predict("context", E(plan), 512, RequestShape(None, 8, 1, False))[::2] == (504.0, "context")
    reqs = [_req(0, 256.0, 256), _req(1, 512.0, 512)] + [
        _req(1, 512.0, 512 + i, error="HTTP 400: Requested tokens (520) exceed context window of 512")
        for i in range(3)
    ]
    sat = saturation("context", E(plan), 512, RequestShape(None, 8, 1, False), [], reqs)
    assert sat.refusal is not None and (sat.refusal.value, sat.refusal.step) == (512.0, 1)
    assert "3 of 4 requests refused" in sat.refusal.detail and "exceed context window" in sat.refusal.detail
    assert sat.observed == sat.refusal


def test_queueing_counts_only_where_the_limit_is_one_that_queues() -> None:
    steps = [StepSignals(1, 0, 2.0, 0.3, False, False), StepSignals(1, 1, 4.0, 0.5, False, True)]
    pool = saturation(
        "concurrency", E({"engine": "vllm", "block_size": 16, "settings": {}}), 9600, SHAPE, steps, []
    )
    assert pool.queueing is not None and pool.observed is None  # the batch limit, not the pool
    slots = saturation(
        "concurrency", E({"engine": "llama.cpp", "settings": {"parallel": 2}}), 4096, SHAPE, steps, []
    )
    assert slots.observed is not None and (slots.observed.value, slots.observed.step) == (4.0, 1)
    full = [StepSignals(1, 2, 8.0, 0.99, True, True)]
    assert (
        saturation("concurrency", E({"engine": "vllm", "settings": {}}), 9600, SHAPE, full, []).observed_value
        == 8.0
    )
