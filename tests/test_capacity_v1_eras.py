"""vLLM V1 rules that change between releases, each from that release's source (the wheel's
vllm/v1/worker/gpu_worker.py, vllm/v1/sample/ops/topk_topp_sampler.py, vllm/envs.py) and checked
against public start-up logs of that release (benchmarks/data rows, sources in its README)."""

from __future__ import annotations

import json
import sys

import pytest

from capacity_models import QWEN3_8B, ROOT, ROWS, part, row_estimate, spec
from vramlab.capacity import GIB, EngineSettings, estimate, get_gpu
from vramlab.logs import vllm as vllm_log

L40S, H100 = get_gpu("l40s"), get_gpu("h100-80gb")
QWEN3 = spec(QWEN3_8B, "Qwen/Qwen3-8B")


def activation(version: str, **settings) -> tuple[int, int, str]:
    est = estimate(QWEN3, L40S, EngineSettings(engine_version=version, max_model_len=4096, **settings))
    act = est.component("activation_peak")
    assert act is not None
    return act.bytes, act.low_bytes, act.note


# --- the profiled sampler: sorting vs FlashInfer / Triton ------------------------------------------


def test_v1_sampler_path_follows_each_releases_source():
    sort, _, note = activation("0.14.0")
    assert "sort sampler" in note  # 0.11.1-0.16: FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1
    flashinfer, _, note = activation("0.14.0", flashinfer_sampler=True)
    assert "flashinfer sampler" in note
    triton, _, note = activation("0.19.0")
    assert "triton sampler" in note  # 0.17+: apply_top_k_top_p_triton for batches >= 8
    value, low, note = activation("0.22.0")
    assert "flashinfer sampler" in note  # 0.22: envs.VLLM_USE_FLASHINFER_SAMPLER: bool = True
    old_value, old_low, _ = activation("0.14.0", flashinfer_sampler=True)
    # 0.22+ also warms the native (Triton) path in the same profile: the larger of the two. FlashInfer's run is sized
    # from the source (the logits and three fp32 tensors, under the Triton run here), so the band is the Triton
    # run's, narrower than the measured 0.10.1 FlashInfer constant's that 0.14 with FlashInfer on keeps.
    assert value == triton > old_value and low > old_low
    _, _, note = activation("0.22.0", flashinfer_sampler=False)
    assert "triton sampler" in note
    # The sort keeps fp32 values, int64 indices, softmax/cumsum and the scatter: well over twice the others.
    assert sort > 2 * flashinfer and sort > 2 * triton


def test_before_0111_the_sampler_depends_on_the_install_and_the_band_covers_both():
    # <= 0.11.0: `VLLM_USE_FLASHINFER_SAMPLER is not False` uses FlashInfer whenever it is importable; the wheel
    # requires flashinfer-python only from 0.11.1 (earlier: the `flashinfer` extra or the docker image).
    value, low, note = activation("0.10.2")
    flashinfer, _, _ = activation("0.10.2", flashinfer_sampler=True)
    sort, sort_low, _ = activation("0.10.2", flashinfer_sampler=False)
    assert "sort sampler" in note and value == sort
    assert (
        low <= flashinfer < value and sort_low > flashinfer
    )  # widened down only when the install is unknown
    est = estimate(QWEN3, L40S, EngineSettings(engine_version="0.10.2", max_model_len=4096))
    assert any("--flashinfer-sampler" in n for n in est.notes)
    assert est.settings["sampler"] == "sort (or flashinfer if installed)"


def test_the_sort_sampler_matches_a_0102_log_that_prints_its_peak_activation():
    # r109: vLLM 0.10.2, Qwen3-235B-A22B FP8 on 8x L40S: "... 1.4 GiB for peak activation, 0.21 GiB for non-torch".
    row, est = row_estimate("r109")
    assert part(est, "activation_peak").bytes / GIB == pytest.approx(row["activation_peak_gib"], rel=0.05)
    assert est.kv_cache_bytes / GIB == pytest.approx(row["kv_cache_gib"], rel=0.03)


@pytest.mark.parametrize("row_id", ["r080", "r081"])
def test_same_release_same_card_the_sampler_line_decides(row_id):
    # dennislee22 0.10.1.1 on A100: r080 logs "Using FlashInfer for top-p & top-k sampling", r081 (Ray workers on
    # other nodes) "Falling back to the PyTorch-native implementation" -- the KV pool follows the line.
    row, est = row_estimate(row_id)
    assert est.kv_cache_bytes / GIB == pytest.approx(row["kv_cache_gib"], rel=0.02)


# --- what the budget takes off: the baseline snapshot moved twice ---------------------------------


def in_budget(version: str, name: str, **settings) -> bool:
    est = estimate(QWEN3, H100, EngineSettings(engine_version=version, max_model_len=4096, **settings))
    return part(est, name).in_budget


def test_cuda_context_counts_against_the_budget_before_the_091_snapshot():
    # 0.8.5 / 0.9.0 gpu_worker.determine_available_memory: peak + (device used - torch allocated), context included;
    # 0.9.1 init_device takes `self.init_snapshot = MemorySnapshot()` after the context.
    assert in_budget("0.8.5", "cuda_context") and in_budget("0.9.0", "cuda_context")
    assert not in_budget("0.9.1", "cuda_context") and not in_budget("0.19.0", "cuda_context")


def test_nccl_init_is_inside_the_window_until_0110():
    # 0.9.1-0.10.2: the snapshot precedes init_worker_distributed_environment; 0.11.0 swaps them.
    assert in_budget("0.10.2", "nccl", tensor_parallel_size=2)
    assert not in_budget("0.11.0", "nccl", tensor_parallel_size=2)
    est = estimate(
        QWEN3, H100, EngineSettings(engine_version="0.10.2", max_model_len=4096, tensor_parallel_size=2)
    )
    assert any("NVSwitch node" in n and "unknown term" in n for n in est.notes)  # measured only on 0.19


def test_0_8_5_awq_row_counts_the_context():
    # r116: 0.8.5.post1, Qwen2.5-72B-AWQ at util 0.98 on a 48 GB card, 10,848 tokens: the context in the budget.
    row, est = row_estimate("r116")
    assert part(est, "cuda_context").in_budget
    assert est.kv_cache_tokens == pytest.approx(row["kv_cache_tokens"], rel=0.06)


def test_tp_non_torch_off_nvls_is_an_unknown_term_after_the_era_it_was_read_from():
    # r110: 0.27.1, TP 4 on PCIe RTX PRO 6000: "56.89 GiB for consumed memory (weights + non-torch)" beside 55.19 GiB
    # of weights, against the 0.15 GiB read off 0.10 rows; the row stays inside the widened band.
    row, est = row_estimate("r110")
    assert any("measured on 0.10 only" in n for n in est.notes)
    assert est.pessimistic.kv_cache_bytes <= row["kv_cache_gib"] * GIB <= est.kv_cache_bytes * 1.03
    _, older = row_estimate("r105")  # 0.10.2 itself: no such note
    assert not any("measured on 0.10 only" in n for n in older.notes)


def test_gpus_without_p2p_get_no_nvswitch_buffers():
    base = EngineSettings(engine_version="0.10.2", max_model_len=4096, tensor_parallel_size=2)
    linked = estimate(QWEN3, H100, base)
    apart = estimate(QWEN3, H100, base.with_(gpu_p2p=False))
    assert part(apart, "nccl").bytes < part(linked, "nccl").bytes
    assert part(apart, "non_torch").bytes < part(linked, "non_torch").bytes
    assert apart.kv_cache_bytes > linked.kv_cache_bytes


# --- check-log reads both facts and the prediction uses them --------------------------------------

# Real lines from dennislee22/vLLM-benchmarking log/vllm-7B-2gpuA10040GB-0.5GRAM-diff-nodes.log (vLLM 0.10.1.1)
# and log/vllm-7B-1gpuA10080GB-0.5GRAM.log.
NATIVE = (
    "(EngineCore_0 pid=1257) (RayWorkerWrapper pid=1384) WARNING 09-03 04:38:28 [topk_topp_sampler.py:61] "
    "FlashInfer is not available. Falling back to the PyTorch-native implementation of top-p & top-k sampling. "
    "For the best performance, please install FlashInfer."
)
NO_P2P = (
    "(EngineCore_0 pid=1257) (RayWorkerWrapper pid=374, ip=10.254.6.219) WARNING 09-03 04:38:28 "
    "[custom_all_reduce.py:85] Custom allreduce is disabled because this process group spans across nodes."
)
FLASHINFER = (
    "(EngineCore_0 pid=2881) INFO 09-04 01:29:01 [topk_topp_sampler.py:50] Using FlashInfer for top-p & "
    "top-k sampling."
)
KV = "(EngineCore_0 pid=2881) INFO 09-04 01:29:25 [gpu_worker.py:276] Available KV cache memory: 24.83 GiB"
VERSION = "(APIServer pid=2739) INFO 09-04 01:28:28 [api_server.py:1805] vLLM API server version 0.10.1.1"


def test_check_log_reads_the_sampler_and_p2p_lines():
    (obs,) = vllm_log.parse([VERSION, NATIVE, NO_P2P, KV])
    assert obs.settings["flashinfer_sampler"] is False and obs.settings["gpu_p2p"] is False
    (obs,) = vllm_log.parse([VERSION, FLASHINFER, KV])
    assert obs.settings["flashinfer_sampler"] is True and "gpu_p2p" not in obs.settings


# --- pipeline stages: how vLLM deals the layers -----------------------------------------------------


def test_pp_layers_go_to_the_middle_stages_as_vllm_deals_them():
    # vllm/distributed/utils.py get_pp_indices: `for i in range(2, remaining_layers + 2): partitions[-i] += 1`.
    from vramlab.capacity.weights import pp_layer_split

    assert pp_layer_split(94, 4) == [23, 24, 24, 23]
    assert pp_layer_split(32, 3) == [11, 11, 10] and pp_layer_split(7, 4) == [2, 2, 2, 1]
    # r112: Qwen3-235B FP8 at PP 4, the post's "Weights per GPU 55.70 GiB" is a 24-layer middle stage.
    from vramlab.capacity.constants import Constants
    from vramlab.capacity.engines.common import Context

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    row = ROWS["r112"]
    model = accuracy.model_for(
        row, json.loads((ROOT / "benchmarks" / "data" / "model_configs.json").read_text())
    )
    ctx = Context(model, accuracy.gpu_for(row), accuracy.settings_for(row, model), Constants.defaults())
    assert ctx.weights(1)[0] / GIB == pytest.approx(row["weights_gib"], rel=0.002)
    assert ctx.weights(0)[0] < ctx.weights(1)[0]


def test_gated_delta_net_state_in_the_model_dtype_gives_the_logged_block():
    # vLLM 0.10.2 MambaStateDtypeCalculator.gated_delta_net_state_dtype: the recurrent state in the conv (model)
    # dtype. r106, Qwen3-Next at TP 2: "Setting attention block size to 544 tokens" and "Padding mamba page size
    # by 1.49%"; the pool's tokens per GiB then equal the log's (973,760 tokens in 44.59 GiB).
    row, est = row_estimate("r106")
    assert est.block_size == row["extra"]["attention_block_size_printed"] == 544
    assert est.kv_cache_tokens / est.kv_cache_bytes == pytest.approx(
        row["kv_cache_tokens"] / row["kv_cache_gib"] / GIB, rel=0.002
    )


@pytest.mark.parametrize(
    ("version", "card", "seqs", "tokens"),
    [
        ("0.8.2", "l40s", 1024, 2048),  # 0.8.0-0.8.3: default_max_num_seqs = 1024 on every card
        ("0.8.2", "h100-80gb", 1024, 8192),  # the larger token budget by device name
        ("0.8.4", "l40s", 256, 2048),
        ("0.8.4", "a100-80gb", 256, 2048),
        ("0.8.4", "h200", 1024, 8192),
        ("0.8.5", "a100-80gb", 1024, 8192),  # device_memory >= 70 GiB
        ("0.9.2", "a100-80gb", 256, 2048),
        ("0.9.2", "h100-80gb", 1024, 8192),  # A100 excluded from 0.9.0
    ],
)
def test_v1_batch_defaults_per_release_and_card(version, card, seqs, tokens):
    # vllm/engine/arg_utils.py EngineArgs._set_default_args_v1 of each wheel (`vllm serve`, the API server context).
    est = estimate(QWEN3, get_gpu(card), EngineSettings(engine_version=version, max_model_len=4096))
    assert (est.settings["max_num_seqs"], est.settings["max_num_batched_tokens"]) == (seqs, tokens)


# --- 0.22+ / 0.27+ budgets (wheels 0.20.0, 0.22.0, 0.26.0, 0.27.0, 0.27.1, 0.28.0) ---------------------------------


def test_from_0_27_the_budget_charges_what_cudamemgetinfo_lost_and_the_band_follows_the_interconnect():
    # vllm/utils/mem_utils.py memory_profiling: 0.26.0 `weights_memory + torch_peak_increase + non_torch_increase`;
    # 0.27.0 `total_consumed + transient_peak_headroom` (total_consumed = init snapshot free - free after profile).
    def non_torch(version, gpu=L40S, tp=1):
        est = estimate(
            QWEN3, gpu, EngineSettings(engine_version=version, max_model_len=4096, tensor_parallel_size=tp)
        )
        return est.component("non_torch")

    old, new = non_torch("0.26.0"), non_torch("0.27.0")
    assert old.bytes == new.bytes and "total_consumed" in new.note and "total_consumed" not in old.note
    # One card: r113 (0.31) and r114 (0.27.1) printed 0.26-0.30 GiB consumed beyond the weights, the planned figure.
    assert new.high_bytes == old.high_bytes
    for row_id in ("r113", "r114"):
        row, est = row_estimate(row_id)
        beyond = row["extra"]["consumed_weights_plus_non_torch_gib"] - row["weights_gib"]
        assert part(est, "non_torch").low_bytes <= beyond * GIB <= part(est, "non_torch").high_bytes
    # TP over PCIe (r110, 0.27.1 TP 4: 1.70 GiB): the high end reaches what that log left; NVLink-SHARP nodes keep theirs.
    old_tp, new_tp = non_torch("0.26.0", tp=2), non_torch("0.27.0", tp=2)
    assert old_tp.bytes == new_tp.bytes and new_tp.high_bytes >= 1.70 * GIB > old_tp.high_bytes
    assert non_torch("0.27.0", H100, 2).high_bytes == non_torch("0.26.0", H100, 2).high_bytes


def test_0_27_rows_sit_inside_the_widened_band():
    for row_id in ("r110", "r113", "r212", "r213", "r215"):
        row, est = row_estimate(row_id)
        assert est.pessimistic.kv_cache_bytes <= row["kv_cache_gib"] * GIB <= est.kv_cache_bytes * 1.03, (
            row_id
        )


def test_pp_over_pcie_is_an_unknown_term_and_the_tight_stage_stays_in_the_band():
    # r216: 0.28.0 PP 2 on two PCIe L4s printed 14.04 GiB, 0.34 GiB under TP 2 on the same cards (r215); r112 (0.27.1
    # PP 4) likewise. The pool is the minimum over the stages (kv_cache_utils.py get_kv_cache_configs, min_num_blocks).
    row, est = row_estimate("r216")
    assert any("PP > 1 without NVLink" in n for n in est.notes)
    assert part(est, "non_torch").high_bytes >= part(est, "non_torch").bytes + 0.9 * GIB
    assert est.pessimistic.kv_cache_bytes <= row["kv_cache_gib"] * GIB <= est.kv_cache_bytes * 1.09
    row, est = row_estimate("r112")
    assert est.pessimistic.kv_cache_bytes <= row["kv_cache_gib"] * GIB <= est.kv_cache_bytes
    nvlink = estimate(
        QWEN3, H100, EngineSettings(engine_version="0.28.0", max_model_len=4096, pipeline_parallel_size=2)
    )
    assert not any("PP > 1 without NVLink" in n for n in nvlink.notes)


def test_from_0_22_the_profile_also_runs_the_native_sampler():
    # gpu_model_runner.py _dummy_sampler_run, 0.22.0-0.28.0 (not 0.20.0): a second sampler call with a generator,
    # which FlashInfer cannot take -> forward_native -> apply_top_k_top_p: Triton for >= 8 sequences.
    def act(version, **kw):
        est = estimate(
            QWEN3, L40S, EngineSettings(engine_version=version, max_model_len=4096, max_num_seqs=1024, **kw)
        )
        return est.component("activation_peak")

    only_flashinfer = act("0.20.0", flashinfer_sampler=True)
    both = act("0.22.0")
    triton_only = act("0.19.0")  # 0.17-0.21 default: Triton
    assert "native top-k/top-p warm-up" in both.note and "warm-up" not in only_flashinfer.note
    assert both.bytes == triton_only.bytes > only_flashinfer.bytes


# 0.27.1's advisory line as the public post of row r110 quotes it (find_string file id 57935131721).
ADVISORY_0271 = (
    "(Worker_TP1 pid=771) INFO 08-21 18:22:06 [gpu_worker.py:789] Free memory on device (94.05/95.01 GiB) "
    "on startup. Desired GPU memory utilization is (0.9, 85.51 GiB). Actual usage is 56.89 GiB for consumed "
    "memory (weights + non-torch), 0.76 GiB for peak activation, and 0.32 GiB for CUDAGraph memory. Replace "
    "gpu_memory_utilization config with `--kv-cache-memory=29407858586` (27.39 GiB) to fit into requested "
    "memory, or `--kv-cache-memory=38581581312` (35.93 GiB) to fully utilize gpu memory. Current kv cache "
    "memory in use is 27.85 GiB."
)


def test_check_log_reads_the_0_27_advisory_without_calling_consumed_non_torch():
    assert ADVISORY_0271 in ROWS["r110"]["raw_log_lines"]
    (obs,) = vllm_log.parse([ADVISORY_0271])
    assert obs.extra["consumed_weights_non_torch_bytes"] == pytest.approx(56.89 * GIB, abs=0.006 * GIB)
    assert obs.extra["peak_activation_with_graph_estimate_bytes"] == pytest.approx(
        0.76 * GIB, abs=0.006 * GIB
    )
    assert obs.cuda_graph_bytes == pytest.approx(0.32 * GIB, abs=0.006 * GIB)
    assert obs.non_torch_bytes is None and obs.activation_peak_bytes is None and obs.weights_bytes is None
    # gpu_worker.py 0.27.1: KV = requested - (total_consumed + transient headroom) - graph estimate, and the printed
    # "peak activation" is headroom + estimate, so budget - consumed - peak is the pool the same line reports.
    assert obs.budget_bytes - obs.extra["consumed_weights_non_torch_bytes"] - obs.extra[
        "peak_activation_with_graph_estimate_bytes"
    ] == pytest.approx(27.85 * GIB, abs=0.02 * GIB)


def test_the_plan_names_the_pipeline_stage_that_bounds_the_pool():
    # kv_cache_utils.py get_kv_cache_configs (0.27.1, 0.28.0): every worker gets min_num_blocks over the workers.
    row, est = row_estimate("r216")  # PP 2: the last stage has lm_head and the sampler's peak
    (note,) = [n for n in est.notes if n.startswith("pipeline parallel:")]
    assert "stage 2 of 2 bounds the pool" in note and "last stage" in note
    assert f"its {est.num_blocks} blocks" in note
    _, est = row_estimate("r112")  # PP 4 of 94 layers: get_pp_indices deals [23, 24, 24, 23]
    (note,) = [n for n in est.notes if n.startswith("pipeline parallel:")]
    assert "stage 2 of 4" in note and "middle stage" in note
    _, est = row_estimate("r215")  # TP 2: no stages
    assert not any(n.startswith("pipeline parallel:") for n in est.notes)
