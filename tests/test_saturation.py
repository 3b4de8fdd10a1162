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


def _steps(
    values: list[float], full_from: float | None = None, queued_from: float | None = None
) -> list[StepSignals]:
    return [
        StepSignals(
            1,
            i,
            v,
            1.0 if full_from is not None and v >= full_from else 0.4,
            False,
            queued_from is not None and v >= queued_from,
        )
        for i, v in enumerate(values)
    ]


def test_predicted_and_observed_saturation_are_counted_in_the_ramps_steps() -> None:
    # vLLM's CPU build in the e2e test: 40 blocks of 128 tokens, 1,500 + 48 tokens a request in 13 blocks:
    # three fit, so the limit shows at the first step at or past 3
    plan = E({"engine": "vllm", "block_size": 128, "settings": {"max_num_seqs": 8}})
    shape = RequestShape(1500, 48, 1, True)
    ramp = [1.0, 2.0, 4.0, 8.0]
    same = saturation("concurrency", plan, 5120, shape, _steps(ramp, full_from=4.0), [])
    assert same.predicted_value == 3.0 and same.predicted_step_value == 4.0
    assert same.observed_value == 4.0 and same.steps_apart == 0 and same.step_values == tuple(ramp)
    late = saturation("concurrency", plan, 5120, shape, _steps(ramp, full_from=8.0), [])
    assert late.steps_apart == 1
    never = saturation("concurrency", plan, 5120, shape, _steps(ramp), [])
    assert never.observed is None and never.steps_apart is None  # predicted inside the ramp, not seen
    # a pool far beyond the ramp: nothing predicted inside it and nothing seen agree; a hit does not
    unbound = E({"engine": "vllm", "block_size": 128, "settings": {}})
    big = saturation("concurrency", unbound, 10**6, shape, _steps(ramp), [])
    assert big.predicted_step_value is None and big.steps_apart == 0
    assert (
        saturation("concurrency", unbound, 10**6, shape, _steps(ramp, full_from=2.0), []).steps_apart is None
    )
    # one llama.cpp slot: the second request waits, one step past the slot count
    slots = E({"engine": "llama.cpp", "settings": {"parallel": 1}})
    one = saturation("concurrency", slots, 2048, SHAPE, _steps([1.0, 2.0, 4.0], queued_from=2.0), [])
    assert (one.predicted_step_value, one.observed_value, one.steps_apart) == (1.0, 2.0, 1)


def test_a_refusal_step_counts_where_no_engine_sample_was_read() -> None:
    plan = E({"engine": "llama.cpp", "max_model_len": 512, "settings": {"parallel": 1}})
    reqs = [
        _req(0, 256.0, 256),
        _req(1, 1024.0, 1024, error="Requested tokens (1030) exceed context window of 512"),
    ]
    sat = saturation("context", plan, 512, RequestShape(None, 8, 1, False), [], reqs)
    assert sat.step_values == (256.0, 1024.0) and sat.predicted_step_value == 1024.0 and sat.steps_apart == 0


def test_requests_waiting_with_less_room_than_one_request_is_a_full_pool() -> None:
    # vLLM's CPU build, 40 blocks of 128 tokens, 1,548-token requests (13 blocks): three fit; at 4 the fourth
    # waits with the pool 95 % used (the rest fits no request), though usage never reached 98 %
    plan = E({"engine": "vllm", "block_size": 128, "settings": {"max_num_seqs": 8}})
    shape = RequestShape(1500, 48, 1, True)
    steps = [
        StepSignals(1, 1, 1.0, 0.31, False, False),
        StepSignals(1, 2, 2.0, 0.64, False, True),  # a moment's queue with room for one more: not full
        StepSignals(1, 3, 4.0, 0.95, False, True),
        StepSignals(1, 4, 8.0, 0.95, False, True),
    ]
    sat = saturation("concurrency", plan, 5120, shape, steps, [])
    assert sat.binding == "pool" and sat.predicted_step_value == 4.0
    assert sat.kv_full is not None and (sat.kv_full.value, sat.kv_full.step) == (4.0, 3), sat.kv_full
    assert "95% of the pool in use" in sat.kv_full.detail and "1,664-token request" in sat.kv_full.detail
    assert sat.observed == sat.kv_full and sat.steps_apart == 0
    # the same usage with nothing waiting is no full pool; llama.cpp's cells are no pool to wait for
    idle = [StepSignals(1, 3, 4.0, 0.95, False, False)]
    assert saturation("concurrency", plan, 5120, shape, idle, []).kv_full is None
    slots = E({"engine": "llama.cpp", "settings": {"parallel": 4}})
    assert saturation("concurrency", slots, 5120, shape, steps, []).kv_full is None
