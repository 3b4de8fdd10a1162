"""What fits under llama.cpp when everything on the GPUs does not: the largest `-ngl`, the fewest MoE
experts kept on the host (`--n-cpu-moe`), each found by re-planning (the same `estimate` a user's
`vramlab plan` runs), never guessed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] that fits, for a property that holds below some point."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _smallest(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def placement_suggestions(model: Any, gpu: Any, s: Any, constants: Any) -> list[str]:
    """`-ngl N` (the last N layers on the GPUs) and `--n-cpu-moe N`, each the best value that fits."""
    from vramlab.capacity.model import estimate
    from vramlab.errors import ConfigError

    def fits(**changes: object) -> bool:
        try:
            return estimate(model, gpu, s.with_(**changes), constants, with_suggestions=False).fits
        except ConfigError:
            return False

    n = model.num_layers
    out: list[str] = []
    if model.is_moe and s.n_cpu_moe < n:
        moe = _smallest(s.n_cpu_moe + 1, n, lambda k: fits(n_cpu_moe=k))
        if moe is not None:
            out.append(
                f"keep the MoE experts of the first {moe} layers in host memory (--n-cpu-moe {moe}; "
                "every other tensor stays on the GPU)"
            )
    now = n + 1 if s.n_gpu_layers is None or s.n_gpu_layers < 0 else min(s.n_gpu_layers, n + 1)
    if now > 0:
        ngl = _largest(0, now - 1, lambda k: fits(n_gpu_layers=k))
        if ngl:
            out.append(
                f"offload {ngl} of {n + 1} layers (-ngl {ngl}); the first {n + 1 - ngl} run on the CPU, "
                "slower per token"
            )
    return out
