"""llama.cpp's `--fit`: the placement llama-server chooses for itself before it loads anything.

ggml-org/llama.cpp `llama_params_fit` (src/llama.cpp; `common_fit_params` in common/fit.cpp from
mid-2026, the same steps), on by default in llama-server since PR #16653 (merged 2025-12-15; b7414 logs
carry it, ggml-org/llama.cpp issue 18175 "default option of fit=on"). It dry-runs the load (no
allocation) and reads each device's projected model + context (KV) + compute buffers:

1. If every device keeps at least its margin free (`--fit-target`, MiB per device, default 1024;
   one value is broadcast, PR #18679), nothing changes.
2. Otherwise, when the user gave no context (`-c`), the context is cut: measured again at `--fit-ctx`
   (default 4096) and interpolated linearly between that and the trained context to the memory every
   device has less its margin (on several devices less `(devices + 1) x model bytes per layer / 2`,
   `/ 6` for MoE), rounded down to a multiple of 256 (x streams), never below `--fit-ctx`. On one device
   that ends the fit; if even `--fit-ctx` does not fit, the context stays there and step 3 runs. A
   context the user gave is never changed. From PR #27496 (2026-08-21) a cache that is not unified
   counts its streams (`-np`): trained context x streams.
3. Weights move, but only parameters the user left at their defaults: `-ngl` given (even `all`),
   `--tensor-split` on several devices, `--split-mode row`, or any `-ot` / `--n-cpu-moe` / `--cpu-moe`
   make the fit give up ("... already set by user, abort"): llama-server then loads with the user's
   settings and whatever context step 2 left. Devices are filled from the last to the first, each
   with the most whole layers (the output layer counts as one) that keep its margin, found by false
   position between a low and a high layer count. For a MoE model every layer in that fill keeps its
   experts (`ffn_*_exps`) in host memory, the dense weights on the GPU.
4. MoE only, when the dense weights of every layer fit with the experts in host memory: layers get
   their experts back front to back (the first devices first), as many as keep each device's margin;
   then one more layer keeps part of its FFN (`up`, then `up` + `gate`; else attention only), its
   other FFN tensors going to host memory (or to the next device).

The measurement is vramlab's own projection of those buffers (engines/llamacpp.py `layout`), so the
fit chooses what llama.cpp would choose when the projection matches its dry run. The steps,
comparisons and integer arithmetic follow the source; the tensor patterns are llama.cpp's. Not
modelled: the multimodal projector's share of the margin (PR #21489, 2026-04), a draft model fitted
beside the main one, host memory (assumed unlimited, as llama.cpp assumes), and the first two weeks of
builds (before PR #18148/#18415, late December 2025), which extrapolated layers linearly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from vramlab.units import MIB

FIT_FROM = (7414,)  # PR #16653 merged 2025-12-15; b7414 is the earliest build seen running it
# PR #27496 (merged 2026-08-21): the trained context x n_streams for a non-unified cache. The build is not
# pinned (b10524 was current the day before): b10550 is taken.
STREAMS_FROM = (10550,)
DEFAULT_TARGET_MIB = 1024
DEFAULT_FIT_CTX = 4096
UINT32 = 1 << 32

# Which FFN tensors of a layer overflow (common_layer_fraction_t): attention only stays, attention + up,
# attention + up + gate, or every tensor except the routed experts.
ATTN, UP, GATE, MOE = 1, 2, 3, 4
_OVERFLOW = {
    ATTN: r"blk\.{il}\.ffn_(gate|up|gate_up|down).*",
    UP: r"blk\.{il}\.ffn_(gate|gate_up|down).*",
    GATE: r"blk\.{il}\.ffn_down.*",
    MOE: r"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps",
}
ALL_EXPERTS = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"
HOST = -1


@dataclass(frozen=True)
class Projection:
    """One dry run: each device's projected buffers (model + KV + compute) and its model buffer alone."""

    used: list[int]
    model: list[int]


@dataclass(frozen=True)
class Trial:
    """The parameters one dry run is made with (None = the user's value, or llama.cpp's default)."""

    n_ctx: int
    n_gpu_layers: int | None = None
    tensor_split: tuple[int, ...] | None = None
    overrides: tuple[tuple[str, int], ...] = ()  # (pattern, device index or HOST)


Measure = Callable[[Trial], Projection]


@dataclass(frozen=True)
class Problem:
    """What the fit knows before its first dry run."""

    free: list[int]  # each device's free memory
    margins: list[int]
    n_layer: int  # repeating layers (the output layer is one more)
    n_ctx_train: int
    n_expert: int
    n_ctx: int | None  # the user's context (total over the streams), None = auto
    n_ctx_min: int = DEFAULT_FIT_CTX
    n_streams: int = 1
    ngl_user: int | None = None  # -ngl as given (-2 = all); None = default (auto)
    user_split: bool = False
    user_overrides: bool = False
    row_split: bool = False


@dataclass
class Outcome:
    status: str  # "unchanged", "fitted" or "failed"
    n_ctx: int
    n_gpu_layers: int | None = None  # None: left to the user / the default
    tensor_split: tuple[int, ...] | None = None
    overrides: tuple[tuple[str, int], ...] = ()
    message: str = ""
    steps: list[str] = field(default_factory=list)
    per_device: list[tuple[int, int, int]] = field(default_factory=list)  # (layers, overflowing, used)


class _Abort(Exception):
    pass


@dataclass
class _Ngl:
    n_layer: int = 0
    n_part: int = 0
    overflow: int = MOE

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def _div(a: int, b: int) -> int:
    """C++ int64 division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _step(delta: int, target: int, low: int, high: int) -> int:
    """The false-position step, as `uint32_t(int64_t(delta) * (target - low) / headroom)` clamped to
    [1, delta - 1] (a negative quotient wraps to a large uint32, so it clamps to delta - 1)."""
    headroom = high - low
    step = _div(delta * (target - low), headroom) % UINT32 if headroom > 0 else delta - 1
    return min(max(step, 1), delta - 1)


def _trial(p: Problem, n_ctx: int, ngl: list[_Ngl], bufts: list[int]) -> Trial:
    """`set_ngl_tensor_split_tbo`: -ngl is every layer assigned; on several devices the split is the layers
    per device; the partial layers of a device follow its full ones and send their overflow pattern to
    host memory (the first partial layer: to its overflow buffer, the next device or the host)."""
    nd = len(ngl)
    total = sum(n.n_layer for n in ngl)
    il0 = p.n_layer + 1 - total
    patterns: list[tuple[str, int]] = []
    for d, n in enumerate(ngl):
        il0 += n.n_full
        for il in range(il0, il0 + n.n_part):
            kind = n.overflow if il == il0 else MOE
            patterns.append((_OVERFLOW[kind].format(il=il), bufts[d] if il == il0 else HOST))
        il0 += n.n_part
    split = tuple(n.n_layer for n in ngl) if nd > 1 and total else None
    return Trial(n_ctx, total, split, tuple(patterns))


def fit(p: Problem, measure: Measure) -> Outcome:
    """`llama_params_fit` over vramlab's projection; llama.cpp's messages in `steps`."""
    out = Outcome("unchanged", p.n_ctx or p.n_ctx_train * p.n_streams)
    try:
        _fit(p, measure, out)
    except _Abort as stop:
        out.status, out.message = "failed", str(stop)
        out.steps.append(f"failed to fit params to free device memory: {stop}")
    return out


def _fit(p: Problem, measure: Measure, out: Outcome) -> None:
    nd = len(p.free)
    n_ctx_max = p.n_ctx_train * p.n_streams
    full = measure(Trial(out.n_ctx, p.ngl_user))
    projected_free = [f - u for f, u in zip(p.free, full.used, strict=True)]
    out.steps.append(
        f"projected to use {sum(full.used) // MIB} MiB of device memory vs. {sum(p.free) // MIB} MiB of free "
        "device memory"
    )
    if all(pf >= m for pf, m in zip(projected_free, p.margins, strict=True)):
        out.steps.append("no changes needed")
        return
    out.status = "fitted"
    if (
        sum(projected_free) - sum(p.margins) < 0
        and _cut_context(p, measure, out, full, n_ctx_max)
        and nd == 1
    ):
        return
    if p.ngl_user is not None:
        raise _Abort(f"n_gpu_layers already set by user to {p.ngl_user}, abort")
    if nd > 1 and p.user_split:
        raise _Abort("model_params::tensor_split already set by user, abort")
    if nd > 1 and p.row_split:
        raise _Abort("changing weight allocation for LLAMA_SPLIT_MODE_ROW not implemented, abort")
    if p.user_overrides:
        raise _Abort("model_params::tensor_buft_overrides already set by user, abort")
    _fit_layers(p, measure, out)


def _cut_context(p: Problem, measure: Measure, out: Outcome, full: Projection, n_ctx_max: int) -> bool:
    """Step 2; True when the interpolated context is projected to fit."""
    nd, n_ctx_min = len(p.free), p.n_ctx_min * p.n_streams
    if p.n_ctx is not None:
        out.steps.append(f"context size set by user to {p.n_ctx} -> no change")
        return False
    if n_ctx_max <= n_ctx_min:
        out.steps.append(
            f"default model context size is {n_ctx_max} which is <= the min. context size of {n_ctx_min} "
            "-> no change"
        )
        return False
    target = sum(p.free) - sum(p.margins)
    if nd > 1:
        per_layer = sum(full.model) // min(
            p.ngl_user % UINT32 if p.ngl_user is not None else UINT32, p.n_layer
        )
        target -= (nd + 1) * per_layer // (2 if p.n_expert == 0 else 6)
    out.n_ctx = n_ctx_min
    used_min, used_max = sum(measure(Trial(n_ctx_min, p.ngl_user)).used), sum(full.used)
    if not (target > used_min and used_max > used_min):
        out.steps.append(f"context size reduced from {n_ctx_max} to {n_ctx_min}")
        return False
    n_ctx = n_ctx_min + (n_ctx_max - n_ctx_min) * (target - used_min) // (used_max - used_min)
    align = 256 * p.n_streams
    out.n_ctx = max(n_ctx - n_ctx % align, n_ctx_min)
    out.steps.append(f"context size reduced from {n_ctx_max} to {out.n_ctx}")
    return True


def _fit_layers(p: Problem, measure: Measure, out: Outcome) -> None:
    nd = len(p.free)
    targets = [f - m for f, m in zip(p.free, p.margins, strict=True)]
    surplus_dense = 0
    if p.n_expert:
        dense = measure(Trial(out.n_ctx, None, None, ((ALL_EXPERTS, HOST),)))
        surplus_dense = sum(f - u - m for f, u, m in zip(p.free, dense.used, p.margins, strict=True))
    bufts = [HOST] * nd

    def memory(ngl: list[_Ngl], bufts: list[int]) -> list[int]:
        return measure(_trial(p, out.n_ctx, ngl, bufts)).used

    ngl = [_Ngl() for _ in range(nd)]
    mem = memory(ngl, bufts)
    for d in range(nd - 1, -1, -1):  # step 3: back to front, whole (MoE: dense-only) layers
        high = [replace(n) for n in ngl]
        high[d].n_layer = p.n_layer + 1 - sum(n.n_layer for n in ngl[d + 1 :])
        if p.n_expert:
            high[d].n_part = high[d].n_layer if d < nd - 1 else high[d].n_layer - 1
        if high[d].n_layer <= 0:
            continue
        mem_high = memory(high, bufts)
        if mem_high[d] <= targets[d]:
            ngl, mem = high, mem_high
            continue
        delta = high[d].n_layer - ngl[d].n_layer
        while delta > 1:
            step = _step(delta, targets[d], mem[d], mem_high[d])
            test = [replace(n) for n in ngl]
            test[d].n_layer += step
            if p.n_expert:
                test[d].n_part += step - 1 if d == nd - 1 and test[d].n_part == 0 else step
            mem_test = memory(test, bufts)
            if mem_test[d] <= targets[d]:
                ngl, mem = test, mem_test
            else:
                high, mem_high = test, mem_test
            delta = high[d].n_layer - ngl[d].n_layer
    if p.n_expert and surplus_dense > 0:
        ngl, bufts, mem = _restore_experts(p, memory, targets, ngl, bufts, mem)
    _finish(p, out, ngl, bufts, mem)


def _finish(p: Problem, out: Outcome, ngl: list[_Ngl], bufts: list[int], mem: list[int]) -> None:
    t = _trial(p, out.n_ctx, ngl, bufts)
    out.n_gpu_layers, out.tensor_split, out.overrides = t.n_gpu_layers, t.tensor_split, t.overrides
    out.per_device = [(n.n_layer, n.n_part, m) for n, m in zip(ngl, mem, strict=True)]
    for d, (n, m) in enumerate(zip(ngl, mem, strict=True)):
        out.steps.append(
            f"device {d}: {n.n_layer} layers ({n.n_part} overflowing), {m // MIB} MiB used, "
            f"{(p.free[d] - m) // MIB} MiB free"
        )


def _restore_experts(
    p: Problem,
    memory: Callable[[list[_Ngl], list[int]], list[int]],
    targets: list[int],
    ngl: list[_Ngl],
    bufts: list[int],
    mem: list[int],
) -> tuple[list[_Ngl], list[int], list[int]]:
    """Step 4: dense-only layers become full layers front to back, then part of one more layer."""
    nd = len(ngl)
    start = nd
    for d in range(nd - 1, -1, -1):
        if ngl[d].n_layer <= 0:
            break
        start = d
    d = 0
    while start < nd and d <= start:
        high = [replace(n) for n in ngl]
        for j in range(start, nd):
            move = high[j].n_layer if j < nd - 1 else high[j].n_layer - 1
            high[d].n_layer += move
            high[j].n_layer -= move
            high[j].n_part = 0
        start_high, mem_high = nd - 1, memory(high, bufts)
        if mem_high[d] > targets[d]:
            delta = high[d].n_full - ngl[d].n_full
            while delta > 1:
                step = _step(delta, targets[d], mem[d], mem_high[d])
                test, start_test, converted = [replace(n) for n in ngl], start, 0
                while start_test < nd:
                    n = min(step - converted, test[start_test].n_part)
                    test[start_test].n_layer -= n
                    test[start_test].n_part -= n
                    test[d].n_layer += n
                    converted += n
                    if test[start_test].n_part > 0:
                        break
                    start_test += 1
                mem_test = memory(test, bufts)
                if mem_test[d] <= targets[d]:
                    ngl, mem, start = test, mem_test, start_test
                else:
                    high, mem_high, start_high = test, mem_test, start_test
                delta = high[d].n_full - ngl[d].n_full
        else:
            ngl, mem, start = high, mem_high, start_high
        ngl, bufts, mem, start = _one_more_layer(memory, targets, ngl, bufts, mem, start, d)
        d += 1
    return ngl, bufts, mem


def _one_more_layer(
    memory: Callable[[list[_Ngl], list[int]], list[int]],
    targets: list[int],
    ngl: list[_Ngl],
    bufts: list[int],
    mem: list[int],
    start: int,
    d: int,
) -> tuple[list[_Ngl], list[int], list[int], int]:
    """ "try to fit at least part of one more layer": attention + up (then + gate) on device *d*, the rest
    overflowing to the next device (host on the last); else attention only."""
    nd = len(ngl)
    if start >= nd or ngl[start].n_layer <= (0 if d < nd - 1 else 1):
        return ngl, bufts, mem, start
    test = [replace(n) for n in ngl]
    test[start].n_layer -= 1
    test[start].n_part -= 1
    test[d].n_layer += 1
    test[d].n_part += 1
    start_test = start + 1 if test[start].n_part == 0 else start
    bufts_test = list(bufts)
    if d < nd - 1:
        bufts_test[d] = d + 1

    def holds(m: list[int]) -> bool:
        return m[d] < targets[d] and (d + 1 == nd or m[d + 1] < targets[d + 1])

    test[d].overflow = UP
    mem_test = memory(test, bufts_test)
    if holds(mem_test):
        ngl, bufts, mem, start = test, bufts_test, mem_test, start_test
        gate = [replace(n) for n in test]
        gate[d].overflow = GATE
        mem_gate = memory(gate, bufts_test)
        if holds(mem_gate):
            return gate, bufts_test, mem_gate, start_test
        return ngl, bufts, mem, start
    test[d].overflow = ATTN
    mem_test = memory(test, bufts_test)
    if holds(mem_test):
        return test, bufts_test, mem_test, start_test
    return ngl, bufts, mem, start


def active(ctx: Any) -> bool:
    """--fit runs in llama-server (not llama-cpp-python's server) at builds that have it, unless --fit off."""
    s = ctx.settings
    return (
        s.llamacpp_server == "llama-server"
        and s.fit is not False
        and (not ctx.version or ctx.version >= FIT_FROM)
    )
