"""The plan's one verdict, the same for every engine in text, `--json` and exit code (docs/capacity-model.md,
"The verdict").

Four answers, checked in this order:

- `does_not_fit` (exit 1): the engine refuses to start, or the process is larger than the card, at the
  expected figures;
- `partial_offload` (exit 4): it runs, with part of the model on the CPU: llama.cpp layers below `-ngl` or MoE
  experts kept in host memory (`--n-cpu-moe`, `--cpu-moe`, `-ot ...=CPU`), or the layers Ollama itself leaves
  on the CPU. It is no failure: Ollama does exactly this when a model is larger than the card;
- `fits_at_estimate` (exit 3): it fits at the expected figures, but not with the margin and every band at its
  pessimistic end (the safe operating point holds not one sequence of the planned length);
- `fits` (exit 0): it fits with the margin at the pessimistic end.

Exit 2 stays bad input and 70 a bug in vramlab, as for every command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vramlab.capacity.estimate import Estimate
from vramlab.capacity.gpus import HOST_DEVICE
from vramlab.units import gib

FITS, AT_ESTIMATE, PARTIAL_OFFLOAD, DOES_NOT_FIT = (
    "fits",
    "fits_at_estimate",
    "partial_offload",
    "does_not_fit",
)
KINDS = (FITS, AT_ESTIMATE, PARTIAL_OFFLOAD, DOES_NOT_FIT)
EXIT_CODES = {FITS: 0, DOES_NOT_FIT: 1, AT_ESTIMATE: 3, PARTIAL_OFFLOAD: 4}
HEADLINES = {
    FITS: "FITS",
    AT_ESTIMATE: "AT RISK",
    PARTIAL_OFFLOAD: "RUNS WITH PART OF THE MODEL ON THE CPU",
    DOES_NOT_FIT: "DOES NOT FIT",
}
# What one token costs when weights sit in host memory: each token reads them once at the host's memory bandwidth.
# 50 GB/s is a dual-channel DDR5 desktop's order of magnitude; the text scales it ("per 50 GB/s").
HOST_BANDWIDTH_BYTES_S = 50e9
FIXED_POOLS = (
    "llama.cpp",
    "transformers",
    "ollama",
)  # the settings size the KV, not what is left of a budget


@dataclass(frozen=True)
class HostShare:
    """What of the model runs on the CPU: layers (llama.cpp's and Ollama's count, the output layer is one) and
    MoE experts kept in host memory."""

    layers_on_gpu: int
    layers_total: int
    experts_on_host: bool
    host_weights_bytes: int  # weights resident in host memory
    read_per_token_bytes: int  # what one token reads of them (MoE: the routed experts' share)
    decided_by: str  # "Ollama's own split" / the flags that put it there

    def to_json(self) -> dict[str, Any]:
        return {
            "layers_on_gpu": self.layers_on_gpu,
            "layers_total": self.layers_total,
            "experts_on_host": self.experts_on_host,
            "host_weights_bytes": self.host_weights_bytes,
            "host_read_per_token_bytes": self.read_per_token_bytes,
            "decided_by": self.decided_by,
        }


@dataclass(frozen=True)
class Verdict:
    kind: str
    summary: str  # the line after "verdict: "
    why: tuple[str, ...] = ()  # does_not_fit: the refusals; fits_at_estimate: what makes it unsafe
    changes: tuple[str, ...] = ()  # what makes it fit, safe, or run wholly on the GPU (each re-planned)
    costs: tuple[str, ...] = ()  # partial_offload: what running part on the CPU costs
    unsafe_term: str | None = None
    unknown_term: bool = False  # the unsafe term's band is widened because its size is not known here
    safe: bool = True  # holds with the margin at the pessimistic end
    host: HostShare | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    @property
    def headline(self) -> str:
        """The one line: "FITS with ...", "AT RISK: ...", "RUNS WITH PART ...: ...", "DOES NOT FIT"."""
        if not self.summary:
            return HEADLINES[self.kind]
        return HEADLINES[self.kind] + (" " if self.kind == FITS else ": ") + self.summary

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exit_code": self.exit_code,
            "summary": self.headline,
            "why": list(self.why),
            "changes": list(self.changes),
            "costs": list(self.costs),
            "unsafe_term": self.unsafe_term,
            "unknown_term": self.unknown_term,
            "safe_with_margin": self.safe,
            "host": self.host.to_json() if self.host else None,
        }


def host_share(est: Estimate, settings: Any, num_experts: int, experts_per_token: int) -> HostShare | None:
    """The part of the model on the CPU, from the plan's own placement (llama.cpp's `host`, Ollama's decision).
    A CPU engine planned on the host (`--gpu cpu`) offloads nothing: the host is its device."""
    if est.gpu == HOST_DEVICE:
        return None
    ollama = est.extra.get("ollama")
    if ollama is not None:
        on, total = int(ollama["layers_offload"]), int(ollama["layers_model"])
        if on >= total:
            return None
        on_host = max(0, int(ollama["memory_weights_total_bytes"]) - est.weights_bytes)
        return HostShare(on, total, False, on_host, on_host, f"Ollama's own split: num_gpu {on}")
    host = est.extra.get("host")
    if host is None:  # llama.cpp's placement (and Ollama's llama-server era, planned as llama.cpp)
        return None
    total = _layers_total(est)
    on_cpu = int(host["layers"]) + int(bool(host["output_layer"]))
    moved = int(host.get("overridden_bytes", 0))  # tensors -ot / --n-cpu-moe took off the GPUs
    if not on_cpu and not moved:
        return None
    cpu_moe = "--cpu-moe" if settings.n_cpu_moe >= 1 << 12 else f"--n-cpu-moe {settings.n_cpu_moe}"
    flags = [
        flag
        for flag, given in (
            (f"-ngl {settings.n_gpu_layers}", on_cpu and settings.n_gpu_layers is not None),
            (cpu_moe, moved and settings.n_cpu_moe),
            ("-ot", moved and settings.override_tensor),
        )
        if given
    ]
    host_bytes = int(host["model_buffer_bytes"])
    read = host_bytes
    if moved and not on_cpu and num_experts and experts_per_token:
        read = int(moved * experts_per_token / num_experts)  # a token reads its routed experts only
    fit = est.extra.get("fit") or {}
    decided = ", ".join(flags) or (
        "llama-server --fit" if fit.get("status") == "fitted" else "the placement flags"
    )
    return HostShare(total - on_cpu, total, bool(moved), host_bytes, read, decided)


def _layers_total(est: Estimate) -> int:
    """llama.cpp's count: every repeating layer and the output layer."""
    devices, host = est.extra["devices"], est.extra["host"]
    on_devices = sum(int(d["layers"]) + int(bool(d["output_layer"])) for d in devices)
    return on_devices + int(host["layers"]) + int(bool(host["output_layer"]))


def safe_holds(est: Estimate, safe: dict[str, Any]) -> bool:
    """The safe operating point holds at least one sequence of the planned length (Ollama: every layer still
    offloaded with the margin held back)."""
    if "offload_layers" in safe:
        return bool(safe["offload_layers"] >= safe["layers_model"])
    return bool(safe["max_concurrency"] >= 1)


def unsafe_term(est: Estimate) -> tuple[str | None, bool]:
    """The term whose pessimistic end takes the room (the KV band's widest term; for pools fixed by the settings
    the component with the widest upper band), and whether it is unknown here (its band widened for that)."""
    term = est.extra.get("kv_band_widest")
    if term is None:
        spread = [(c.high_bytes - c.bytes, c.name) for c in est.components if c.high_bytes > c.bytes]
        term = max(spread)[1] if spread else None
    return term, term in (est.extra.get("kv_unknown_terms") or ())


def decide(
    est: Estimate,
    safe: dict[str, Any],
    host: HostShare | None,
    safe_changes: tuple[str, ...] = (),
) -> Verdict:
    """The one verdict for this plan (the module docstring gives the order)."""
    margin = f"{safe['margin']:.0%} margin"
    holds = safe_holds(est, safe)
    if not est.fits:
        return Verdict(DOES_NOT_FIT, "", tuple(est.reasons), tuple(est.suggestions), safe=False)
    if host is not None:
        # Ollama re-decides the split from the free memory at every load: the margin moves layers, never stops it
        return _partial(est, host, holds or "offload_layers" in safe, margin)
    if not holds:
        return _at_risk(est, safe, safe_changes, margin)
    return Verdict(FITS, _fits_summary(est, safe, margin))


def _fits_summary(est: Estimate, safe: dict[str, Any], margin: str) -> str:
    devices = est.extra.get("devices") or ()
    if len(devices) > 1:
        least = min(devices, key=lambda d: d["headroom_bytes"])
        room = (
            f"on every card; the least headroom is {gib(least['headroom_bytes'])} GiB on {least['device']} "
            f"({least['gpu']})"
        )
    else:
        room = f"with {gib(est.headroom_bytes)} GiB headroom"
    n = int(safe["max_concurrency"])
    held = (
        f"{n} sequence{'' if n == 1 else 's'}" if "offload_layers" not in safe else "every layer on the GPU"
    )
    return f"{room}; {held} at {est.max_model_len:,} tokens with the {margin} at the pessimistic end"


def _at_risk(est: Estimate, safe: dict[str, Any], changes: tuple[str, ...], margin: str) -> Verdict:
    term, unknown = unsafe_term(est)
    if "offload_layers" in safe:
        why = (
            f"with {margin} of the free memory held back (or Ollama's estimate that much short) Ollama would "
            f"offload {safe['offload_layers']} of {safe['layers_model']} layers and run the rest on the CPU"
        )
        term = None
    elif est.engine in FIXED_POOLS:
        why = (
            f"at the pessimistic end of the bands, with {margin} of the card kept free, the process is larger "
            "than the card"
        )
    else:
        why = (
            f"the expected pool holds {est.max_concurrency:.2f} sequences of {est.max_model_len:,} tokens; at the "
            f"pessimistic end of the bands, with the {margin} held back, not one"
        )
    named = ""
    if term:
        named = f"; the {term} term's upper band takes the room" + (
            " — an unknown term: its band is widened because its size is not measured here (see its note)"
            if unknown
            else ""
        )
    summary = f"fits at the estimate with {gib(est.headroom_bytes)} GiB headroom, not at the pessimistic end"
    return Verdict(
        AT_ESTIMATE,
        summary,
        (why + named,),
        changes or ("no single change checked makes it safe: a larger card, or accept the risk",),
        unsafe_term=term,
        unknown_term=unknown,
        safe=False,
    )


def _partial(est: Estimate, host: HostShare, holds: bool, margin: str) -> Verdict:
    on_cpu = host.layers_total - host.layers_on_gpu
    where = (
        f"{host.layers_on_gpu} of {host.layers_total} layers on the GPU, {on_cpu} on the CPU"
        if on_cpu
        else "every layer on the GPU except the tensors moved to host memory"
    )
    summary = f"{where} ({host.decided_by}); {gib(host.host_weights_bytes)} GiB of weights in host memory"
    tokens_s = HOST_BANDWIDTH_BYTES_S / host.read_per_token_bytes if host.read_per_token_bytes else math.inf
    costs = [
        f"every token reads about {gib(host.read_per_token_bytes)} GiB of weights from host memory: about "
        f"{tokens_s:,.1f} tokens/s at most per 50 GB/s of host memory bandwidth (dual-channel DDR5), whatever "
        "the GPU does" + ("; prompt processing runs those layers on the CPU too" if on_cpu else "")
    ]
    if not holds:
        costs.append(
            f"the GPU's share does not hold the {margin} at the pessimistic end of the bands: "
            "a start-up may run out of memory (lower the context, or move one more layer to the CPU)"
        )
    return Verdict(PARTIAL_OFFLOAD, summary, (), est.suggestions, tuple(costs), safe=holds, host=host)
