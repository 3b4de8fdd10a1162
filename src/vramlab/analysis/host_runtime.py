"""A CPU engine's runtime per window, from the host's readings of its processes: what `vramlab calibrate`
fits the host runtime terms to (capacity/engines/vllm_cpu.py, llamacpp_cpu.py).

A window's reading is the most its processes held in it (the host sampler's resident sets), less what
the engine's own words and the model file put in them: the model, the KV pool, the compute buffer.
vLLM's CPU build (0.32) serves from a process tree: the API server, its engine core (``VLLM::EngineCore``)
and, under the engine core, the worker (``VLLM::Worker``) that holds the model and the KV pool. The
worker's reading less the model and the pool is its runtime (the plan's ``runtime`` term); the rest of
the tree (API server, engine core, a multiprocessing resource tracker) is the front end (the plan's
``api_server`` term). A one-process engine (llama.cpp's server) is its tree's reading less its buffers.

Each window is one reading: a run of one configuration gives one per window (its baseline, each step,
its recovery), readings of the same terms under the windows' loads. Pure: reads sample records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vramlab.records import SampleRecord

# vLLM's worker process title (vLLM 0.32 v1/executor/multiproc_executor.py: `set_process_title(name="Worker")`,
# prefixed "VLLM::" by vllm/utils/system_utils.py unless VLLM_PROCESS_NAME_PREFIX says otherwise, and only where
# setproctitle is installed); "VLLM::Worker_TP1" and the like under parallelism
WORKER_TITLE = "VLLM::Worker"


@dataclass(frozen=True)
class Window:
    label: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class RuntimeReading:
    """One window's runtime terms: the model-holding process's (``runtime_bytes``) and, where the engine
    serves from several processes, the front end's (``front_bytes``); ``tree_bytes`` the tree's highest."""

    window: str
    runtime_bytes: int
    front_bytes: int | None
    tree_bytes: int


def _by_time(samples: Sequence[SampleRecord], start: float, end: float) -> dict[float, list[SampleRecord]]:
    out: dict[float, list[SampleRecord]] = {}
    for s in samples:
        if s.name == "host.process_rss_bytes" and start <= s.t_s <= end:
            out.setdefault(s.t_s, []).append(s)
    return out


def split_readings(
    samples: Sequence[SampleRecord], windows: Sequence[Window], held_bytes: int
) -> list[RuntimeReading]:
    """vLLM's CPU build: per window, the worker's highest resident set less *held_bytes* (the model and
    the KV pool, which live in the worker) and the rest of the tree at its highest. A window whose
    readings name no worker process gives nothing (the tree cannot be split)."""
    out = []
    for w in windows:
        worker, front, tree = [], [], []
        for group in _by_time(samples, w.start_s, w.end_s).values():
            mine = [s.value for s in group if s.labels.get("name", "").startswith(WORKER_TITLE)]
            if not mine:
                continue
            total = sum(s.value for s in group)
            worker.append(sum(mine))
            front.append(total - sum(mine))
            tree.append(total)
        if worker and max(worker) > held_bytes:
            out.append(
                RuntimeReading(w.label, int(max(worker) - held_bytes), int(max(front)), int(max(tree)))
            )
    return out


def tree_readings(
    samples: Sequence[SampleRecord], windows: Sequence[Window], held_bytes: int
) -> list[RuntimeReading]:
    """A one-process engine: per window, its tree's highest resident set less *held_bytes* (its buffers)."""
    out = []
    for w in windows:
        rss = [
            s.value for s in samples if s.name == "host.target_rss_bytes" and w.start_s <= s.t_s <= w.end_s
        ]
        if rss and max(rss) > held_bytes:
            out.append(RuntimeReading(w.label, int(max(rss) - held_bytes), None, int(max(rss))))
    return out


__all__ = ["WORKER_TITLE", "RuntimeReading", "Window", "split_readings", "tree_readings"]
