"""Each engine parser on real excerpts, every era of wording, several ranks, truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramlab.errors import ConfigError, VramlabError
from vramlab.logs import llamacpp, ollama, sglang, tgi, vllm
from vramlab.logs.detect import detect_engine, parse_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
GIB = 1 << 30
MIB = 1 << 20


def gib(x: float) -> int:
    return int(round(x * GIB))


def one(lines: list[str], parser=vllm):
    obs = parser.parse(lines)
    assert len(obs) == 1, obs
    return obs[0]


# --- vLLM -----------------------------------------------------------------------------------


def test_vllm_v1_debug_log_every_figure():
    r = parse_log(LOGS / "vllm-v1-0.19-debug.log")
    assert r.engine == "vllm" and len(r.observations) == 1 and not r.incomplete
    o = r.observations[0]
    assert o.engine_version == "0.19.0" and o.model == "codellama/CodeLlama-7b-hf"
    assert o.weights_bytes == gib(12.56)
    assert o.activation_peak_bytes == gib(0.77)
    assert o.non_torch_bytes == gib(0.25)
    assert o.init_non_torch_bytes == gib(0.51)
    assert o.non_kv_cache_bytes == gib(13.57)
    assert o.kv_cache_bytes == gib(61.66)
    assert o.kv_cache_tokens == 126256
    assert o.max_concurrency == 15.41 and o.max_model_len == 8192
    assert o.cuda_graph_bytes == gib(0.89)
    assert o.gpu_blocks == 7891 and o.block_size == 16
    assert o.total_gpu_memory_bytes == gib(79.19) and o.free_gpu_memory_bytes == gib(78.68)
    assert o.gpu_memory_utilization == 0.95
    assert o.settings["vllm_engine"] == "v1" and o.settings["api_server"] is True
    # Every observation says where its figures came from.
    numbers = [s.line for s in o.source_lines]
    assert numbers == sorted(numbers) and 3 in numbers and 12 in numbers
    assert any("Available KV cache memory: 61.66 GiB" in s.text for s in o.source_lines)


def test_vllm_v0_three_line_summary_and_cuda_blocks():
    o = parse_log(LOGS / "vllm-v0-0.8.5.log").observations[0]
    assert o.settings["vllm_engine"] == "v0" and o.engine_version == "0.8.5.post1"
    assert o.total_gpu_memory_bytes == gib(14.74) and o.gpu_memory_utilization == 0.69
    assert o.budget_bytes == gib(10.22)
    # The first, more precise weights figure wins over the rounded summary.
    assert o.weights_bytes == gib(7.6334)
    assert (o.non_torch_bytes, o.activation_peak_bytes, o.kv_cache_bytes) == (gib(0.03), gib(0.88), gib(1.68))
    assert o.gpu_blocks == 764 and o.max_concurrency == 5.97 and o.max_model_len == 2048
    assert o.settings["dtype"] == "float16" and o.cuda_graph_bytes == gib(0.34)


def test_vllm_v0_negative_values():
    o = parse_log(LOGS / "vllm-v0-negative.log").observations[0]
    assert o.non_torch_bytes == -gib(0.05)
    assert o.kv_cache_bytes == -gib(7.83)
    assert o.weights_bytes == gib(14.9888)  # 'Loading model weights took 14.9888 GB' means GiB


@pytest.mark.parametrize(
    "line,blocks",
    [
        ("INFO 06-01 12:01:20 distributed_gpu_executor.py:56] # GPU blocks: 7446, # CPU blocks: 655", 7446),
        ("INFO 05-02 11:22:21 [executor_base.py:112] # cuda blocks: 764, # CPU blocks: 0", 764),
        ("# CUDA blocks: 406, # CPU blocks: 655", 406),
    ],
)
def test_vllm_block_lines_of_each_era(line, blocks):
    o = one([line])
    assert o.gpu_blocks == blocks and o.settings["vllm_engine"] == "v0"


@pytest.mark.parametrize(
    "line,weights",
    [
        ("Loading model weights took 57.7520 GB", 57.7520),
        ("Model loading took 14.9888 GB and 13.204526 seconds", 14.9888),
        ("Model loading took 14.9888 GiB and 13.204526 seconds", 14.9888),
        ("Model loading took 1.19 GiB memory and 1.919768 seconds", 1.19),
    ],
)
def test_vllm_weights_wording_of_each_era(line, weights):
    assert one([line]).weights_bytes == gib(weights)


def test_vllm_tokens_and_concurrency_on_one_line_and_graph_estimates():
    o = parse_log(LOGS / "vllm-v1-newest.log").observations[0]
    assert o.kv_cache_tokens == 1_844_583
    assert o.max_concurrency == 1.76 and o.max_model_len == 1_048_576
    assert o.cuda_graph_bytes == gib(0.94) and o.cuda_graph_estimate_bytes == gib(1.94)
    assert o.settings["kv_cache_dtype"] == "fp8" and o.engine_version == "0.27.1"


def test_vllm_tp_ranks_each_get_an_observation():
    r = parse_log(LOGS / "vllm-v1-tp2-0.10.log")
    assert [o.rank for o in r.observations] == [0, 1]
    for o in r.observations:
        assert o.settings["tensor_parallel_size"] == 2 and o.settings["dtype"] == "bfloat16"
        assert o.weights_bytes == gib(7.1217) and o.kv_cache_bytes == gib(11.03)
        assert o.kv_cache_tokens == 412944  # the engine-wide line is shared by both ranks
    # rank 1's own line is in rank 1's sources, not rank 0's
    r0 = {s.line for s in r.observations[0].source_lines}
    r1 = {s.line for s in r.observations[1].source_lines}
    assert 5 in r0 and 5 not in r1 and 6 in r1


def test_vllm_ray_workers_named_by_pid_get_ranks():
    r = parse_log(LOGS / "vllm-v0-ray-tp2.log")
    assert [o.rank for o in r.observations] == [0, 1]
    assert all(o.gpu_blocks == 7446 for o in r.observations)


def test_vllm_settings_from_engine_config_line():
    line = (
        "INFO 08-20 10:00:09 [core.py:75] Initializing a V1 LLM engine (v0.10.1.1) with config: "
        "model='Qwen/Qwen2-7B', dtype=torch.bfloat16, max_seq_len=16384, tensor_parallel_size=4, "
        "pipeline_parallel_size=2, quantization=fp8, enforce_eager=True, kv_cache_dtype=fp8_e5m2"
    )
    o = one([line, "Available KV cache memory: 1.00 GiB"])
    assert o.model == "Qwen/Qwen2-7B" and o.engine_version == "0.10.1.1"
    s = o.settings
    assert (s["tensor_parallel_size"], s["pipeline_parallel_size"], s["max_model_len"]) == (4, 2, 16384)
    assert s["quantization"] == "fp8" and s["enforce_eager"] is True and s["kv_cache_dtype"] == "fp8_e5m2"


def test_vllm_truncated_non_default_args_and_torch_dtype():
    # Unsloth's log (r065): a truncated dict with a non-literal torch dtype.
    line = (
        "non-default args: {'dtype': torch.bfloat16, 'seed': 0, 'max_model_len': 2048, "
        "'gpu_memory_utilization': 0.8661508568217998, 'max_num_batched_tokens': 2048, 'max_num_seqs': 288, "
        "'compilation_config': {'level': 3, 'mode': 3, 'debug_dump_path': None, '"
    )
    o = one([line, "Available KV cache memory: 17.20 GiB"])
    assert o.settings["dtype"] == "bfloat16" and o.settings["max_num_seqs"] == 288
    assert o.gpu_memory_utilization == pytest.approx(0.8661508568217998)


def test_vllm_debug_suggestion_and_requested_memory_lines():
    lines = [
        "DEBUG [gpu_worker.py:300] Initial free memory: 78.68 GiB; Requested memory: 0.90 (util), 71.27 GiB",
        "Free memory on device (177.66/178.36 GiB) on startup. Desired GPU memory utilization is (0.9, 160.52 GiB). "
        "Actual usage is 8.58 GiB for weight, 9.96 GiB for peak activation, 0.07 GiB for non-torch memory, and "
        "0.65 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` ...",
    ]
    o = one(lines)
    assert o.free_gpu_memory_bytes == gib(78.68) and o.budget_bytes == gib(71.27)
    assert o.total_gpu_memory_bytes == gib(178.36)
    assert (o.weights_bytes, o.activation_peak_bytes, o.non_torch_bytes, o.cuda_graph_bytes) == (
        gib(8.58),
        gib(9.96),
        gib(0.07),
        gib(0.65),
    )


def test_vllm_newest_profile_line_total_consumed():
    line = (
        "Memory profiling takes 9.1 seconds. Total non KV cache memory: 58.3GiB; torch peak memory increase: "
        "2.04GiB; total consumed (from mem_get_info): 61.49GiB; weights memory: 55.87GiB."
    )
    o = one([line])
    assert o.activation_peak_bytes == gib(2.04) and o.weights_bytes == gib(55.87)
    assert o.extra["total_consumed_bytes"] == gib(61.49) and o.non_torch_bytes is None


def test_truncated_log_keeps_what_is_complete():
    r = parse_log(LOGS / "vllm-truncated.log")
    assert r.observations == [] and len(r.incomplete) == 1
    assert r.incomplete[0].weights_bytes == gib(14.99) and r.incomplete[0].complete is False


def test_restart_in_one_log_gives_two_startups():
    lines = (LOGS / "vllm-v1-0.19-debug.log").read_text().splitlines()
    second = [ln.replace("61.66", "60.00") for ln in lines]
    r = parse_log(lines + second, engine="vllm")
    assert [o.kv_cache_bytes for o in r.observations] == [gib(61.66), gib(60.00)]


# --- SGLang ---------------------------------------------------------------------------------


def test_sglang_tp_ranks_kv_is_k_plus_v_in_gib():
    r = parse_log(LOGS / "sglang-tp4.log")
    assert r.engine == "sglang" and [o.rank for o in r.observations] == [0, 1, 2, 3]
    o = r.observations[0]
    assert o.kv_cache_bytes == 2 * gib(8.23)  # "GB" is GiB in SGLang
    assert o.kv_cache_tokens == 367404 and o.weights_bytes == gib(55.66)
    assert o.cuda_graph_bytes == gib(6.22) and o.max_model_len == 40960
    assert o.settings["mem_fraction_static"] == 0.85 and o.settings["tensor_parallel_size"] == 4
    assert o.model == "Qwen/Qwen3-235B-A22B-FP8"


def test_sglang_old_gpu_id_prefix_weights_from_avail_mem():
    o = parse_log(LOGS / "sglang-old.log").observations[0]
    assert o.rank == 0 and o.kv_cache_tokens == 444002
    assert o.weights_bytes == gib(78.69) - gib(63.70)


# --- TGI, llama.cpp, Ollama ------------------------------------------------------------------


def test_tgi_tokens_blocks_and_args():
    o = parse_log(LOGS / "tgi.log").observations[0]
    assert o.engine == "tgi" and o.kv_cache_tokens == 53792
    assert o.gpu_blocks == 3362 and o.block_size == 16
    assert o.model == "mistralai/Mistral-7B-Instruct-v0.2" and o.max_model_len == 4096
    assert o.settings["max_batch_prefill_tokens"] == 4096


def test_llamacpp_old_prefixes():
    o = parse_log(LOGS / "llamacpp-old.log").observations[0]
    assert o.engine == "llama.cpp" and o.engine_version == "b3091"
    assert o.weights_bytes == int(round(7317.71 * MIB))  # CPU buffer not counted
    assert o.kv_cache_bytes == 180 * MIB and o.activation_peak_bytes == 105 * MIB
    assert o.gpu == "NVIDIA GeForce RTX 3090" and o.model == "Meta-Llama-3-8B-Instruct"
    assert o.settings["ctx_size"] == 1536 and o.settings["kv_cache_dtype"] == "f16"


def test_llamacpp_new_prefixes_two_devices_and_fit_projection():
    r = parse_log(LOGS / "llamacpp-new.log")
    assert [o.rank for o in r.observations] == [0, 1]
    d0, d1 = r.observations
    assert d0.weights_bytes == int(round(8912.44 * MIB)) and d1.weights_bytes == int(round(8408.02 * MIB))
    assert d0.kv_cache_bytes == 1600 * MIB and d1.kv_cache_bytes == 1472 * MIB
    assert d0.free_gpu_memory_bytes == 23008 * MIB
    assert d0.kv_cache_tokens == 32768 and d0.max_model_len == 8192 and d0.settings["parallel"] == 4
    assert d0.extra["fit_projected_bytes"] == 21544 * MIB
    assert "flash_attn" not in d0.settings  # 'auto' is not a user setting


def test_llamacpp_iswa_kv_buffers_add_up():
    lines = [
        "llama_kv_cache: CUDA0 KV buffer size = 1024.00 MiB",
        "llama_kv_cache: CUDA0 KV buffer size = 256.00 MiB",
    ]
    assert one(lines, llamacpp).kv_cache_bytes == 1280 * MIB


def test_ollama_old_estimator_line_is_an_engine_estimate():
    o = parse_log(LOGS / "ollama-old.log").observations[0]
    assert o.engine == "ollama" and o.basis == "engine-estimate" and o.engine_version == "0.9.3"
    assert o.weights_bytes == int(round(4.3 * GIB)) and o.kv_cache_bytes == GIB
    assert o.activation_peak_bytes == 560 * MIB  # all layers offloaded: the full-offload graph
    assert o.settings["ctx_size"] == 8192 and o.settings["parallel"] == 2


def test_ollama_new_buffer_lines_skip_host_memory():
    o = parse_log(LOGS / "ollama-new.log").observations[0]
    assert o.basis == "measured" and o.weights_bytes == int(round(4.3 * GIB))
    assert o.activation_peak_bytes == 560 * MIB and o.kv_cache_bytes == GIB


@pytest.mark.parametrize(
    "name,engine",
    [
        ("vllm-v1-0.19-debug.log", "vllm"),
        ("vllm-v0-0.8.5.log", "vllm"),
        ("sglang-tp4.log", "sglang"),
        ("sglang-old.log", "sglang"),
        ("tgi.log", "tgi"),
        ("llamacpp-old.log", "llama.cpp"),
        ("llamacpp-new.log", "llama.cpp"),
        ("ollama-old.log", "ollama"),
        ("ollama-new.log", "ollama"),
    ],
)
def test_detect_engine(name, engine):
    assert detect_engine((LOGS / name).read_text().splitlines()) == engine


def test_nothing_recognizable_is_a_clear_error(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(ConfigError, match="no line of a known engine"):
        parse_log(p)
    with pytest.raises(VramlabError, match="unknown engine"):
        parse_log(p, engine="vllmm")


def test_parsers_expose_rules():
    for mod in (vllm, sglang, tgi, llamacpp, ollama):
        assert mod.RULES and callable(mod.parse)


@pytest.mark.parametrize(
    "raw,key",
    [
        ("(VllmWorker rank=1 pid=4212) INFO x", "rank=1"),
        ("(VllmWorker TP3 pid=4212) INFO x", "rank=3"),
        ("(Worker_TP2 pid=77) INFO x", "rank=2"),
        ("(RayWorkerWrapper pid=9123, ip=10.0.0.7) INFO x", "pid=9123"),
        ("(VllmWorkerProcess pid=55) INFO x", "pid=55"),
        ("(EngineCore_DP0 pid=2950) INFO x", None),
        ("(APIServer pid=1) INFO x", None),
        ("\x1b[1;36m(VllmWorker rank=0 pid=1)\x1b[0;0m INFO x", "rank=0"),
        ("[2025-07-21 10:00:12 DP0 TP1] Load weight end.", "rank=1"),
        ("[gpu_id=3] Load weight end.", "rank=3"),
        ("[2025-07-21 10:00:12] server_args=...", None),
        ("INFO 08-20 10:00:01 [api_server.py:1805] vLLM API server version 0.10.1.1", None),
    ],
)
def test_worker_prefixes(raw, key):
    from vramlab.logs.base import split_prefix

    got_key, message = split_prefix(raw)
    assert got_key == key
    assert "(" not in message[:1] and "\x1b" not in message


def test_tgi_pretty_printed_args_block_and_announced_defaults():
    """TGI's launcher may print `Args {` with one field per line (`num_shard: Some(` / `2,` / `),`); the
    block reads as the one-line form, later lines keep their numbers, and an unclosed block cannot swallow
    the log."""
    lines = [
        "2025-07-04T12:35:02Z  INFO text_generation_launcher: Args {",
        '    model_id: "/models/m",',
        "    num_shard: Some(",
        "        2,",
        "    ),",
        "    max_total_tokens: None,",
        "    cuda_memory_fraction: 0.9,",
        "}",
        "2025-07-04T12:35:04Z  INFO text_generation_launcher: Default `max_batch_prefill_tokens` to 8000",
        "2025-07-04T12:36:06Z  INFO text_generation_launcher: KV-cache blocks: 52719, size: 1",
        "2025-07-04T12:36:09Z  INFO text_generation_router: backends/v3/src/main.rs:171: "
        "Maximum total tokens defaulted to 8000",
    ]
    obs = tgi.parse(lines)[0]
    assert obs.model == "/models/m"
    assert obs.settings == {
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "max_batch_prefill_tokens": 8000,
        "max_model_len": 8000,
    }
    assert obs.kv_cache_tokens == 52719
    assert {s.line for s in obs.source_lines} >= {1, 9, 10, 11}
    unclosed = tgi.parse(
        ["INFO text_generation_launcher: Args {", '    model_id: "/m",']
        + ["    x: 1,"] * 300
        + ["INFO text_generation_launcher: KV-cache blocks: 10, size: 16"]
    )
    assert unclosed[0].kv_cache_tokens == 160
