"""llama-server's --fit (engines/llamacpp_params_fit.py), on synthetic dry runs whose placements are
worked out by hand from llama.cpp's rule, and through `estimate` on catalog models."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlab.capacity import EngineSettings, estimate, get_gpu
from vramlab.capacity.engines.llamacpp_params_fit import HOST, MIB, Problem, Projection, Trial, fit
from vramlab.sources import resolve_model


def get_model(name: str):
    return resolve_model(name, offline=True)


class Dense:
    """A dry run of a dense model: every repeating layer *layer* MiB, the output layer *output* MiB,
    *compute* MiB on a device that holds any layer; KV *kv_per_token* bytes per context token on the
    device of each layer (spread evenly), llama.cpp's -ngl / --tensor-split assignment."""

    def __init__(
        self, n_layer: int, layer: int, output: int, compute: int, devices: int, kv_per_token: int = 0
    ):
        self.n, self.layer, self.output, self.compute = n_layer, layer * MIB, output * MIB, compute * MIB
        self.devices, self.kv = devices, kv_per_token
        self.calls: list[Trial] = []

    def __call__(self, t: Trial) -> Projection:
        self.calls.append(t)
        on_gpu = _offloaded(self.n, t.n_gpu_layers)
        counts = list(t.tensor_split) if t.tensor_split else [0] * (self.devices - 1) + [len(on_gpu)]
        used, model = [0] * self.devices, [0] * self.devices
        layers = iter(on_gpu)
        for d, count in enumerate(counts):
            for _ in range(count):
                il = next(layers)
                weights = self.output if il == self.n else self.layer
                used[d] += weights + (0 if il == self.n else t.n_ctx * self.kv // self.n)
                model[d] += weights
            used[d] += self.compute if count else 0
        return Projection(used, model)


def _offloaded(n_layer: int, ngl: int | None) -> list[int]:
    """llama.cpp's -ngl: the last ngl repeating layers; the output layer (index n_layer) only when
    ngl > n_layer."""
    ngl = n_layer + 1 if ngl is None else ngl
    start, act = max(n_layer - ngl, 0), min(ngl, n_layer + 1)
    return [il for il in range(n_layer + 1) if start <= il < start + act]


def test_nothing_changes_when_every_device_keeps_its_margin():
    out = fit(Problem([12_000 * MIB], [1024 * MIB], 10, 4096, 0, n_ctx=4096), Dense(10, 1000, 500, 100, 1))
    assert out.status == "unchanged" and out.n_gpu_layers is None and out.steps[-1] == "no changes needed"


def test_one_device_dense_takes_the_most_layers_that_keep_the_margin():
    # free 10000, margin 1024: target 8976 MiB. -ngl k <= 10 offloads k repeating layers (the output only
    # at k = 11): 100 + 1000 k <= 8976 -> k = 8 (9 would be 9100).
    measure = Dense(10, 1000, 500, 100, 1)
    out = fit(Problem([10_000 * MIB], [1024 * MIB], 10, 4096, 0, n_ctx=4096), measure)
    assert (out.status, out.n_gpu_layers, out.tensor_split, out.overrides) == ("fitted", 8, None, ())
    assert out.per_device == [(8, 0, 8100 * MIB)]
    assert "context size set by user to 4096 -> no change" in out.steps


def test_two_devices_fill_from_the_last():
    # targets 5000 - 1024 = 3976 each. Device 1 alone: -ngl k, 100 + 1000 k (the output joins only at
    # k = 11, 10600) -> k = 3; device 0 before it: 100 + 1000 k -> k = 3. -ngl 6 -ts 3,3 (the output
    # layer stays on the host, as -ngl 6 of 11 leaves it).
    out = fit(
        Problem([5_000 * MIB] * 2, [1024 * MIB] * 2, 10, 4096, 0, n_ctx=4096), Dense(10, 1000, 500, 100, 2)
    )
    assert (out.n_gpu_layers, out.tensor_split) == (6, (3, 3))
    assert [used // MIB for _, _, used in out.per_device] == [3100, 3100]


def test_the_context_is_cut_by_linear_interpolation_on_one_device():
    # 6000 MiB of weights + 100 KiB per token; trained 40960, --fit-ctx 4096, free 10000, margin 1024:
    # at 4096 tokens 6400 MiB, at 40960 10000 MiB; 4096 + 36864 x (8976 - 6400) / (10000 - 6400) = 30474.24
    # -> 30474, rounded down to 256: 30464. Layers are not touched.
    measure = Dense(10, 600, 0, 0, 1, kv_per_token=100 * 1024)
    out = fit(Problem([10_000 * MIB], [1024 * MIB], 10, 40960, 0, n_ctx=None), measure)
    assert (out.status, out.n_ctx, out.n_gpu_layers) == ("fitted", 30464, None)
    assert "context size reduced from 40960 to 30464" in out.steps
    assert [t.n_ctx for t in measure.calls] == [40960, 4096]


def test_a_user_layer_count_stops_the_fit_after_the_context_step():
    # even the 4096-token context needs 10400 MiB > 8976: the context stays at 4096 and -ngl aborts
    measure = Dense(10, 1000, 0, 0, 1, kv_per_token=100 * 1024)
    out = fit(Problem([10_000 * MIB], [1024 * MIB], 10, 40960, 0, n_ctx=None, ngl_user=99), measure)
    assert (out.status, out.n_ctx) == ("failed", 4096)
    assert out.message == "n_gpu_layers already set by user to 99, abort"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"user_overrides": True}, "model_params::tensor_buft_overrides already set by user, abort"),
        ({"user_split": True}, "model_params::tensor_split already set by user, abort"),
        ({"row_split": True}, "changing weight allocation for LLAMA_SPLIT_MODE_ROW not implemented, abort"),
    ],
)
def test_other_settings_the_user_gave_stop_the_fit(changes: dict[str, bool], message: str):
    p = Problem([5_000 * MIB] * 2, [1024 * MIB] * 2, 10, 4096, 0, n_ctx=4096, **changes)
    assert fit(p, Dense(10, 1000, 500, 100, 2)).message == message


class Moe:
    """A MoE dry run: per layer attention 100 MiB, router 10 MiB, gate/up/down experts 300 MiB each;
    output 50 MiB; -ot patterns move the tensors they match (first match wins)."""

    TENSORS = (
        ("attn_q", 100),
        ("ffn_gate_inp", 10),
        ("ffn_gate_exps", 300),
        ("ffn_up_exps", 300),
        ("ffn_down_exps", 300),
    )

    def __init__(self, n_layer: int):
        self.n = n_layer

    def __call__(self, t: Trial) -> Projection:
        used = 0
        for il in _offloaded(self.n, t.n_gpu_layers):
            if il == self.n:
                used += 50 * MIB
                continue
            for name, size in self.TENSORS:
                target = next((d for p, d in t.overrides if re.search(p, f"blk.{il}.{name}.weight")), 0)
                used += size * MIB if target != HOST else 0
        return Projection([used], [used])


def test_moe_keeps_experts_in_host_memory_then_gives_them_back_front_to_back():
    # free 3000, margin 1000: target 2000. Every layer on the GPU: 4 x 1010 + 50 = 4090. Step 3: all 5
    # "layers" with the experts of blk.1-3 on the host (llama.cpp's first partial layer follows the full
    # one): 1010 + 3 x 110 + 50 = 1390 <= 2000. Step 4: blk.1 full too = 2290 > 2000, so one more layer
    # in part: blk.1 with attention + up (400) = 1680 < 2000, then + gate (710) = 1990 < 2000: blk.1 sends
    # only ffn_down to the host, blk.2 and blk.3 their experts.
    out = fit(Problem([3_000 * MIB], [1000 * MIB], 4, 4096, 8, n_ctx=4096), Moe(4))
    assert out.status == "fitted" and out.n_gpu_layers == 5
    assert out.overrides == (
        (r"blk\.1\.ffn_down.*", HOST),
        (r"blk\.2\.ffn_(up|down|gate_up|gate)_(ch|)exps", HOST),
        (r"blk\.3\.ffn_(up|down|gate_up|gate)_(ch|)exps", HOST),
        (r"blk\.4\.ffn_(up|down|gate_up|gate)_(ch|)exps", HOST),
    )
    assert out.per_device == [(5, 4, 1990 * MIB)]


# --- through the planner ---


def _qwen32(**changes: object):
    s = EngineSettings(engine="llama.cpp", quantization="Q4_K_M", ctx_size=32768, **changes)  # type: ignore[arg-type]
    return estimate(get_model("qwen3-32b"), get_gpu("rtx-4090"), s)


def test_the_issue_example_starts_with_fits_own_placement():
    """Qwen3-32B Q4_K_M at -c 32k on a 4090: 26.7 GiB with every layer on the card. --fit keeps the
    context the user gave and offloads the most layers that leave 1024 MiB free: one more does not."""
    est = _qwen32()
    fitted = est.extra["fit"]
    ngl = est.settings["n_gpu_layers"]
    assert est.fits and fitted["status"] == "fitted" and 0 < ngl < 65 and est.settings["ctx_size"] == 32768
    device = est.extra["devices"][0]
    assert device["headroom_bytes"] >= 1024 * MIB
    more = _qwen32(n_gpu_layers=ngl + 1)  # the same load with one more layer, as the user would spell it
    assert more.extra["fit"]["status"] == "failed" and more.extra["devices"][0]["headroom_bytes"] < 1024 * MIB
    assert any(f"-ngl {ngl}" in n for n in est.notes)


def test_fit_off_and_builds_before_it_keep_the_old_verdict():
    off, old = _qwen32(fit=False), _qwen32(engine_version="b7000")
    assert not off.fits and not old.fits
    assert "fit" not in off.extra and "fit" not in old.extra
    assert off.settings["n_gpu_layers"] == old.settings["n_gpu_layers"] == 65
    assert off.extra["devices"][0]["model_buffer_bytes"] == old.extra["devices"][0]["model_buffer_bytes"]
    assert _qwen32(engine_version="b7414").extra["fit"]["status"] == "fitted"


def test_no_context_given_cuts_the_trained_context():
    s = EngineSettings(engine="llama.cpp", quantization="Q4_K_M")
    est = estimate(get_model("qwen3-32b"), get_gpu("rtx-4090"), s)
    ctx = est.settings["ctx_size"]
    assert est.fits and 4096 <= ctx < 40960 and ctx % 256 == 0 and est.settings["n_gpu_layers"] == 65
    assert est.extra["fit"]["changed"] == ["ctx_size"]
    # 256 tokens more would eat into the margin (the interpolation lands within one step of it)
    assert est.extra["devices"][0]["headroom_bytes"] >= 1024 * MIB - 256 * est.kv_bytes_per_token


def test_a_user_ngl_is_left_alone():
    est = _qwen32(n_gpu_layers=-1)
    assert not est.fits and est.extra["fit"]["message"] == "n_gpu_layers already set by user to -2, abort"


@settings(max_examples=60, deadline=None)
@given(
    n_layer=st.integers(1, 80),
    layer=st.integers(1, 4000),
    output=st.integers(0, 4000),
    compute=st.integers(0, 2000),
    free=st.lists(st.integers(0, 200_000), min_size=1, max_size=4),
    margin=st.integers(0, 4096),
)
def test_the_dense_fill_keeps_every_margin_and_one_more_layer_would_not(
    n_layer: int, layer: int, output: int, compute: int, free: list[int], margin: int
):
    """Whatever the sizes: the device filled last (device 0) ends within its target, and on one device
    (false position converging on a monotone memory) one more layer would not fit. On several devices a
    later fill can shift the output layer onto a device already filled, which llama.cpp does not check
    again (only the device being filled is compared with its target), so only device 0 is held to it."""
    measure = Dense(n_layer, layer, output, compute, len(free))
    p = Problem([f * MIB for f in free], [margin * MIB] * len(free), n_layer, 4096, 0, n_ctx=4096)
    out = fit(p, measure)
    if out.status == "unchanged":
        return
    targets = [(f - margin) * MIB for f in free]
    n0, _, used0 = out.per_device[0]
    assert out.status == "fitted" and (used0 <= targets[0] or n0 == 0)
    if len(free) == 1 and n0 < n_layer + 1:
        assert measure(Trial(4096, n0 + 1)).used[0] > targets[0]
