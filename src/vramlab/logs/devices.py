"""Lines that name the card, whichever engine's log holds them: nvidia-smi's table and its CSV query
output, PyTorch/vLLM `collect-env` and `nvidia-smi -L` (`GPU 0: NVIDIA L40S`), Unsloth's banner
(`NVIDIA GeForce RTX 4090. Num GPUs = 1. Max memory: 23.635 GB`: torch's total, GiB) and TGI's
`Unkown compute for card nvidia-rtx-a6000` (text-generation-launcher's own spelling).

These rules are `generic`: nvidia-smi output pasted above an engine's log says which card, not
which engine. They fill `gpu` (the first card named), `extra.devices_named` (index -> name),
`extra.device_total_bytes` (nvidia-smi's memory.total, which is a little more than what CUDA lets a
process see: the card's catalog entry is preferred where the name finds one; logs/cards.py) and
`extra.framework_total_bytes` (torch's total, the figure an engine budgets from).
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.logs.base import Rule, gib, mib, rule

_MAKER = r"(?:NVIDIA|Tesla|Quadro|GeForce|AMD|Radeon)"


def _named(index: str | None, name: str) -> dict[str, Any]:
    name = re.sub(r"\s+", " ", name).strip().rstrip(".")
    out: dict[str, Any] = {"gpu": name}
    if index is not None:
        out["extra.devices_named"] = {index: name}
    return out


def _smi_csv(m: re.Match[str]) -> dict[str, Any] | None:
    """`0, NVIDIA L40S, 8.9, 45460 MiB, 0 MiB, 46068 MiB, 595.91.07`: the largest MiB figure of the
    row is memory.total (total >= used, free, reserved), whichever columns were queried."""
    sizes = [int(x) for x in re.findall(r"(?:^|,)\s*(\d+) MiB\b", m.group("rest"))]
    if not sizes:
        return None
    return _named(m.group("index"), m.group("name")) | {"extra.device_total_bytes": mib(str(max(sizes)))}


RULES: list[Rule] = [
    # one rule per maker: the maker's name is the literal the prefilter keeps a line by
    *(
        rule(
            f"smi_csv_{maker.lower()}",
            rf"^\s*(?:(?P<index>\d+),\s*)?(?P<name>{maker} [^,]*),(?P<rest>.*\d+ MiB.*)$",
            _smi_csv,
            shared=True,
            generic=True,
        )
        for maker in ("NVIDIA", "Tesla", "Quadro", "AMD")
    ),
    # |   0  NVIDIA GeForce RTX 5080        Off |   00000000:81:00.0 Off |                  N/A |
    rule(
        "smi_table_name",
        rf"^\|?\s*(\d+)\s+({_MAKER}\b.*?)\s+(?:On|Off)\s+\|",  # logs/base.py takes the first '|' off
        lambda m: _named(m.group(1), m.group(2)),
        shared=True,
        generic=True,
    ),
    # | 30%   33C    P8     11W / 360W |      1MiB / 16303MiB |      0%      Default |
    rule(
        "smi_table_memory",
        r"\|\s*\d+MiB\s*/\s*(\d+)MiB\s*\|",
        lambda m: {"extra.device_total_bytes": mib(m.group(1))},
        shared=True,
        generic=True,
    ),
    # `collect-env`, `nvidia-smi -L`: the maker in the pattern's literal, so that a log's every
    # `GPU KV cache usage` line is not kept for this rule (logs/prefilter.py keeps lines by literal).
    *(
        rule(
            f"gpu_listed_{maker.lower()}",
            rf"\bGPU (\d+): ({maker} [^(]*?)\s*(?:\(UUID: [^)]*\))?\s*$",
            lambda m: _named(m.group(1), m.group(2)),
            shared=True,
            generic=True,
        )
        for maker in ("NVIDIA", "Tesla")
    ),
    rule(
        "unsloth_banner",
        rf"({_MAKER}[^|]*?)\. Num GPUs = \d+\. Max memory: ([\d.]+) GB",
        lambda m: _named(None, m.group(1)) | {"extra.framework_total_bytes": gib(m.group(2))},
        shared=True,
        generic=True,
    ),
    rule(
        "tgi_card",
        r"Unkn?own compute for card ([\w-]+)",
        lambda m: _named(None, m.group(1)),
        shared=True,
        generic=True,
    ),
]

__all__ = ["RULES"]
