"""MIG slices: a card partitioned into GPU instances, each with its own memory (less than the card).

A process inside a MIG instance sees the instance as its device: `cudaMemGetInfo`'s total is the instance's
memory, the figure `nvidia-smi mig -lgip` lists in GiB (PyTorch: "GPU 0 has a total capacity of 19.50 GiB" on
an A100-80GB 2g.20gb slice, find_string file id 60107151188; 19.62 GiB on a 20 GB A100-40GB slice, id
55813501427; "16.0 GiB usable" on an H200 1g.18gb, id 57663898020). What MIG keeps back is the difference to the
profile's name and to the card. There is no CUDA IPC between instances, so NVLink and NVSwitch are unavailable
to them (RAPIDS' MIG guide).

`nvidia-smi mig -lgip` memory (GiB) per profile, from public outputs:
- A100-SXM4-40GB: find_string file id 57000499299 (a test fixture copying the tool's output);
- A100-SXM4-80GB: ids 47661169194 and 22161947869 (another driver lists 39.50 / 79.00, id 68858751843);
- H100 80GB: id 52885409783 (132 SMs in 7g.80gb);
- H200: 16.00 / 32.50 / 140.00 from id 57000499299; 3g.71gb and 4g.71gb take half the memory (NVIDIA's
  profile table: 4/8), 65.00 GiB, which an H200 3g.71gb report prints as "VRAM: 69.8GB" (69.8e9 bytes, id
  60954663655);
- B200: 1g.23gb "2x B200 MIG 1g.23gb (2x20,992 MiB)" (id 63526533450); 3g.90gb / 4g.90gb (4/8 of the memory)
  "B200 MIG 3g.90gb (89 GB)" in a pod's notes (id 55066071853), read as 89e9 bytes = 82.9 GiB (inferred: the
  note does not say which unit). The 2/8 and full profiles are not listed: no output of them was found.
"""

from __future__ import annotations

from dataclasses import replace

from vramlab.capacity.gpu_spec import GPU, MIG

# card -> ((profile, GiB the instance reports), ...), the full-card profile last when it is known
PROFILES: dict[str, tuple[tuple[str, float], ...]] = {
    "a100-40gb": (
        ("1g.5gb", 4.75),
        ("2g.10gb", 9.75),
        ("3g.20gb", 19.62),
        ("4g.20gb", 19.62),
        ("7g.40gb", 39.50),
    ),
    "a100-80gb": (
        ("1g.10gb", 9.50),
        ("1g.20gb", 19.50),
        ("2g.20gb", 19.50),
        ("3g.40gb", 39.25),
        ("4g.40gb", 39.25),
        ("7g.80gb", 78.75),
    ),
    "h100-80gb": (
        ("1g.10gb", 9.75),
        ("1g.20gb", 19.62),
        ("2g.20gb", 19.62),
        ("3g.40gb", 39.50),
        ("4g.40gb", 39.50),
        ("7g.80gb", 79.25),
    ),
    "h200": (
        ("1g.18gb", 16.00),
        ("1g.35gb", 32.50),
        ("2g.35gb", 32.50),
        ("3g.71gb", 65.00),
        ("4g.71gb", 65.00),
        ("7g.141gb", 140.00),
    ),
    "b200": (("1g.23gb", 20.50), ("3g.90gb", 82.9), ("4g.90gb", 82.9)),
}
_INFERRED = {("b200", "3g.90gb"), ("b200", "4g.90gb")}


def mig_profile(card: GPU, profile: str) -> GPU:
    """The MIG instance `profile` (e.g. 3g.40gb) of `card`, as a planning target of its own."""
    memory_gib = dict(PROFILES[card.name])[profile]
    compute_slices = int(profile.split("g.", 1)[0])
    memory_share = memory_gib / card.memory_gib
    how = "inferred from a pod's '89 GB'" if (card.name, profile) in _INFERRED else "nvidia-smi mig -lgip"
    return replace(
        card,
        name=f"{card.name}:{profile}",
        memory_gib=memory_gib,
        nominal_gb=float(profile.split("g.", 1)[1].removesuffix("gb")),
        bandwidth_gbps=round(card.bandwidth_gbps * min(1.0, memory_share), 1),
        bf16_tflops=round(card.bf16_tflops * compute_slices / 7, 1),
        memory_source=f"MIG {profile} of the {card.name}: {memory_gib} GiB ({how}; capacity/gpu_mig.py)",
        aliases=(),
        kind=MIG,
        nvswitch=False,  # no CUDA IPC between MIG instances: NVLink / NVSwitch are unavailable to them
        nvml_memory_gib=card.memory_gib,  # vLLM's defaults read NVML by index: the whole card
        parent=card.name,
    )


def profiles_of(cards: tuple[GPU, ...]) -> tuple[GPU, ...]:
    by_name = {c.name: c for c in cards}
    return tuple(mig_profile(by_name[name], p) for name, profiles in PROFILES.items() for p, _ in profiles)
