"""`check-log` on start-ups the engine refused for want of KV cache: the capacity the refusal prints (vLLM V0's
pool in tokens, V1's KV memory and estimated longest context) or implies (SGLang's empty pool, TGI's pool below
one request), beside the plan's pool and verdict. The lines follow each engine's message at its release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vramlab.logs.check import check_log

V0_FAIL = """\
INFO 10-21 09:12:33 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=None, tokenizer='meta-llama/Llama-3.1-8B-Instruct', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, rope_scaling=None, rope_theta=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=131072, download_dir=None, load_format=LoadFormat.AUTO, tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, quantization_param_path=None, device_config=cuda, seed=0, served_model_name=meta-llama/Llama-3.1-8B-Instruct, num_scheduler_steps=1, chunked_prefill_enabled=True multi_step_stream_outputs=True, enable_prefix_caching=False, use_async_output_proc=True
INFO 10-21 09:12:40 model_runner.py:1067] Loading model weights took 14.9888 GB
INFO 10-21 09:12:42 worker.py:262] Memory profiling results: total_gpu_memory=22.05GiB initial_memory_usage=15.22GiB peak_torch_memory=16.18GiB memory_usage_post_profile=15.29GiB non_torch_memory=0.29GiB kv_cache_size=3.38GiB gpu_memory_utilization=0.90
ERROR 10-21 09:12:42 engine.py:160] ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (27648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

V1_FAIL = """\
(EngineCore_0 pid=2211) INFO 08-20 10:01:02 [core.py:71] Initializing a V1 LLM engine (v0.10.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=None, tokenizer='meta-llama/Llama-3.1-8B-Instruct', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=131072, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=meta-llama/Llama-3.1-8B-Instruct, enable_prefix_caching=True, chunked_prefill_enabled=True
(EngineCore_0 pid=2211) INFO 08-20 10:01:30 [gpu_model_runner.py:1953] Model loading took 14.9889 GiB and 25.412 seconds
(EngineCore_0 pid=2211) INFO 08-20 10:01:40 [gpu_worker.py:276] Available KV cache memory: 3.21 GiB
(EngineCore_0 pid=2211) ERROR 08-20 10:01:40 [core.py:700] EngineCore failed to start.
(EngineCore_0 pid=2211) ERROR 08-20 10:01:40 [core.py:700] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (3.21 GiB). Based on the available memory, the estimated maximum model length is 26288. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

SGLANG_FAIL = """\
[2025-09-02 11:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-32B-Instruct', tokenizer_path='Qwen/Qwen2.5-32B-Instruct', tokenizer_mode='auto', load_format='auto', trust_remote_code=False, dtype='auto', kv_cache_dtype='auto', quantization=None, context_length=None, device='cuda', served_model_name='Qwen/Qwen2.5-32B-Instruct', is_embedding=False, host='0.0.0.0', port=30000, mem_fraction_static=0.7, max_running_requests=None, max_total_tokens=None, chunked_prefill_size=8192, max_prefill_tokens=16384, tp_size=1, pp_size=1, cuda_graph_max_bs=None, disable_cuda_graph=False)
[2025-09-02 11:00:08 TP0] Load weight begin. avail mem=78.68 GB
[2025-09-02 11:01:02 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=17.50 GB, mem usage=61.18 GB.
[2025-09-02 11:01:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
"""

TGI_FAIL = """\
2025-07-01T10:00:00.120000Z  INFO text_generation_launcher: Args { model_id: "meta-llama/Llama-3.1-8B-Instruct", revision: None, validation_workers: 2, sharded: None, num_shard: None, quantize: None, speculate: None, dtype: None, trust_remote_code: false, max_concurrent_requests: 128, max_best_of: 2, max_stop_sequences: 4, max_top_n_tokens: 5, max_input_tokens: None, max_input_length: None, max_total_tokens: Some(131072), waiting_served_ratio: 0.3, max_batch_prefill_tokens: Some(8192), max_batch_total_tokens: None, max_waiting_tokens: 20, max_batch_size: None, cuda_graphs: None, hostname: "0.0.0.0", port: 80, cuda_memory_fraction: 1.0 }
2025-07-01T10:00:40.500000Z  INFO text_generation_launcher: Cuda Graphs are enabled for sizes [32, 16, 8, 4, 2, 1]
2025-07-01T10:00:52.300000Z  INFO text_generation_launcher: KV-cache blocks: 38912, size: 1
2025-07-01T10:00:52.900000Z ERROR text_generation_launcher: Not enough memory to handle `max_total_tokens=131072`
"""


def _check(tmp_path: Path, text: str, gpu: str, version: str | None = None):
    path = tmp_path / "start.log"
    path.write_text(text)
    report = check_log(path, gpu=gpu, engine_version=version)
    items = [it for it in report.items if it.comparison is not None]
    assert items, [it.error for it in report.items]
    return items[0]


def test_vllm_v0_refusal_gives_the_pool_in_tokens(tmp_path: Path) -> None:
    item = _check(tmp_path, V0_FAIL, "a10g")
    assert item.observation.kv_cache_tokens == 27648
    row = next(r for r in item.comparison.rows if r.field == "kv_cache_tokens")
    assert row.observed == 27648 and row.predicted == item.comparison.estimate.kv_cache_tokens
    (line,) = item.refusal
    assert line.startswith("refused: max_model_len 131,072 is above the 27,648 tokens")
    assert f"the plan holds {item.comparison.estimate.kv_cache_tokens:,}" in line
    assert "the plan refuses it too" in line  # the plan's pool is far below 131,072 tokens as well


def test_vllm_v1_refusal_compares_memory_and_the_estimated_longest_context(tmp_path: Path) -> None:
    item = _check(tmp_path, V1_FAIL, "l4")
    est = item.comparison.estimate
    assert item.observation.kv_cache_bytes == round(3.21 * (1 << 30))
    assert item.observation.extra["estimated_max_model_len"] == 26288
    (line,) = item.refusal
    assert "needs more KV cache than the engine's 3.21 GiB" in line
    assert f"the plan has {est.kv_available_bytes / (1 << 30):.2f} GiB" in line
    assert "the longest context the engine estimates one request fits is 26,288, the plan's " in line
    planned = int(line.split("the plan's ")[1].split(" ")[0].replace(",", ""))
    # one request of the plan's longest context fits its pool; one more block does not
    assert planned <= est.kv_cache_tokens < planned + 16 * 2
    assert not est.fits and "the plan refuses it too" in line


def test_sglang_empty_pool_refusal(tmp_path: Path) -> None:
    item = _check(tmp_path, SGLANG_FAIL, "h100-80gb", "0.5.1")
    assert item.observation.extra["kv_pool_empty"] is True
    (line,) = item.refusal
    assert line.startswith("refused: SGLang found no room for a KV pool")
    est = item.comparison.estimate
    assert f"the plan holds {est.kv_cache_tokens:,} tokens" in line
    # fraction 0.7 keeps 0.3 x 78.68 = 23.6 GB back: more than the 17.5 GB free after the weights
    assert est.kv_cache_tokens == 0 and "the plan refuses it too" in line


def test_tgi_pool_below_one_request(tmp_path: Path) -> None:
    item = _check(tmp_path, TGI_FAIL, "a100-80gb", "3.3.6")
    assert item.observation.extra["kv_capacity_below_tokens"] == 131072
    (line,) = item.refusal
    assert line.startswith("refused: TGI's pool holds fewer than max_total_tokens 131,072")
    est = item.comparison.estimate
    assert f"the plan holds {est.kv_cache_tokens:,} tokens" in line
    assert ("the plan refuses it too" in line) == (not est.fits)


def test_the_refusal_reaches_the_text_and_the_json(tmp_path: Path) -> None:
    path = tmp_path / "v0.log"
    path.write_text(V0_FAIL)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = [sys.executable, "-m", "vramlab", "check-log", str(path), "--gpu", "a10g"]
    text = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert text.returncode == 0, text.stderr
    assert "  refused: max_model_len 131,072 is above the 27,648 tokens" in text.stdout
    js = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60, env=env)
    pred = json.loads(js.stdout)["observations"][0]["prediction"]
    assert pred["refusal"][0].startswith("refused: max_model_len 131,072")
    assert pred["difference"]["kv_cache_tokens"] == pred["kv_cache_tokens"] - 27648


def test_tgi_refusal_in_its_debug_form_and_1x_wording(tmp_path: Path) -> None:
    debug = TGI_FAIL.replace(
        "ERROR text_generation_launcher: Not enough memory to handle `max_total_tokens=131072`",
        "ERROR text_generation_launcher: Error: Backend(NotEnoughMemory(131072))",
    )
    assert (
        _check(tmp_path, debug, "a100-80gb", "3.3.6").observation.extra["kv_capacity_below_tokens"] == 131072
    )
    old = TGI_FAIL.replace(
        "Not enough memory to handle `max_total_tokens=131072`",
        "Server error: Not enough memory to handle 16000 total tokens with 2 prefill tokens. You need "
        "to decrease `--max-batch-total-tokens` or `--max-batch-prefill-tokens`",
    )
    assert _check(tmp_path, old, "a100-80gb", "1.0.3").observation.extra["kv_capacity_below_tokens"] == 16000


def test_a_start_up_that_was_not_refused_has_no_refusal_line() -> None:
    fixture = Path(__file__).parent / "fixtures" / "logs" / "vllm-v1-0.19-debug.log"
    report = check_log(fixture)
    assert all(not it.refusal for it in report.items)


def test_sglang_profiled_pool_above_a_given_max_total_tokens_is_kept(tmp_path: Path) -> None:
    text = SGLANG_FAIL.replace(
        "[2025-09-02 11:01:02 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n",
        "[2025-09-02 11:01:02 TP0] max_total_tokens=500000 is larger than the profiled value 61234. Use the profiled "
        "value instead.\n",
    )
    item = _check(tmp_path, text, "h100-80gb", "0.5.1")
    assert item.observation.extra["profiled_max_total_tokens"] == 61234
    assert not item.refusal


# Verbatim from a public vLLM GitHub issue (February 2025: DeepSeek-R1-Distill-Qwen-14B at TP 2 on two RTX 4090s,
# vLLM 0.7 V0), pasted error first as the reporter did.
REAL_V0 = """\
ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (81536). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
ERROR 02-11 07:40:49 multiproc_worker_utils.py:124] Worker VllmWorkerProcess pid 1786 died, exit code: -15
(VllmWorkerProcess pid=1786) INFO 02-11 07:40:45 model_runner.py:1115] Loading model weights took 13.9476 GB
"""


def test_a_real_v0_refusal_line_is_read_as_the_pool(tmp_path: Path) -> None:
    path = tmp_path / "real.log"
    path.write_text(REAL_V0)
    report = check_log(path)
    (item,) = report.items
    assert item.observation.kv_cache_tokens == 81536 and item.observation.max_model_len == 131072
    assert item.observation.extra["refused_max_model_len"] == 131072
    assert any(f.name == "vllm.max_len_exceeds_kv_tokens" for f in report.failures)


# Verbatim from a public issue (September 2026, a V1 release of the "model's" wording with the CPU-backend aside).
REAL_V1 = (
    "(EngineCore pid=4382) ERROR 09-01 19:53:44 [core.py:1346] ValueError: To serve at least one request with the "
    "model's max seq len (65536), (4.76 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(1.56 GiB). Based on the available memory, the estimated maximum model length is 15984. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
    "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.\n"
)


def test_the_newest_v1_refusal_wording_is_read(tmp_path: Path) -> None:
    path = tmp_path / "real-v1.log"
    path.write_text(REAL_V1)
    report = check_log(path)
    (item,) = report.items
    obs = item.observation
    assert obs.kv_cache_bytes == round(1.56 * (1 << 30)) and obs.max_model_len == 65536
    assert obs.extra["estimated_max_model_len"] == 15984 and obs.extra["refused_max_model_len"] == 65536
    assert any(f.name == "vllm.max_len_exceeds_kv" for f in report.failures)
