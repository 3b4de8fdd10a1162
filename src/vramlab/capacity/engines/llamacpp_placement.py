"""Where llama.cpp puts each tensor, KV cell and compute buffer over the host and several devices.

The rules mirror ggml-org/llama.cpp `src/llama-model.cpp` (`load_tensors`, b5000-b9300; the
2024 `llm_load_tensors` had the same arithmetic):

- `-ngl N`: the *last* N repeating layers are offloaded: layer il is on the host when
  il < n_layer - N; the output layer counts as layer n_layer, so it is offloaded only when
  N > n_layer (`-ngl 99`, `all` or -1 offload everything). The input embedding is always on the host.
- `--split-mode layer` (default): the offloaded layers go to devices by cumulative split points:
  layer il goes to the first device whose point exceeds (il - i_gpu_start) / min(N, n_layer + 1).
  The points come from `--tensor-split` or, without it, from each device's free memory.
- `--split-mode row`: every offloaded layer's matrices are split by rows over the devices in the
  `--tensor-split` proportions; norms, the KV cache and the compute buffer stay on `--main-gpu`.
- `--split-mode none`: only `--main-gpu` is used.
- `-ot REGEX=BUFT` (`--override-tensor`): the first pattern found (`std::regex_search`) in a tensor's
  name sends it to that buffer type (`CPU`, `CUDA1`, ...). `--n-cpu-moe N` adds the pattern
  `blk\\.i\\.ffn_(up|down|gate)_exps` = CPU for the first N layers (common/arg.cpp), `--cpu-moe` for all.
- The KV of each layer lives on that layer's device (`llama-kv-cache.cpp`: `dev_layer(il)`), on the
  host with `--no-kv-offload`.
- Host tensors with mmap (the default) sit in one `CPU_Mapped` buffer whose printed size is the file
  span from the first to the last host tensor (token_embd, blk.0..n-1, output in file order), so GPU
  tensors between them count in the printed figure though they are not resident; `--no-mmap` prints
  a `CPU` buffer of the host tensors alone.

Compute buffers (one per device, ggml-alloc's peak over the graph splits that run there) are a fit,
not llama.cpp's code: the largest of three phases, each only on the devices that run it:
attention without flash attention (the f32 KQ matrix n_kv x n_ubatch x heads, its f32 mask, and
six hidden-sized f32 tensors), the feed-forward (three n_ubatch x n_ff f32 tensors, n_ff = the
routed experts' n_used x moe_intermediate on MoE layers; plus the six hidden-sized tensors on a
GPU) and the output (f32 logits for the reserved rows plus one hidden-sized tensor). The phases
reproduce r095 (150.00 MiB), r208 (300.75) and both r223 devices (1080.00) and r223's host (36.01).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import re2

from vramlab.capacity.spec import ModelSpec
from vramlab.errors import ConfigError

HOST = -1  # device index of the host (CPU) in assignments


@dataclass(frozen=True)
class Tensor:
    name: str
    layer: int  # n_layer for the output layer, -1 for the input embedding
    bytes: int
    matrix: bool = True  # split by rows under --split-mode row (norms and biases are not)


# More patterns than any placement needs (llama.cpp's own -ot examples use one to a few dozen; --n-cpu-moe adds one per
# layer): the bound keeps a pasted list from costing minutes, the RE2 set keeps a thousand of them to milliseconds.
MAX_OVERRIDES = 4096


@dataclass(frozen=True)
class Override:
    pattern: str
    target: int  # HOST or a device index


class OverrideMatcher:
    """Every `-ot` pattern in one RE2 set, searched once per tensor name in time linear in the name; llama.cpp takes
    the first pattern in command-line order that matches (`std::regex_search`, llama-model-loader), so the lowest
    index wins. RE2 instead of `re`: a pattern such as `(.+)+!` cannot take exponential time. It takes what
    llama.cpp's ECMAScript grammar takes for names like these, except backreferences and look-arounds, which it
    refuses (parse_overrides says so)."""

    def __init__(self, overrides: tuple[Override, ...]) -> None:
        self._targets = [o.target for o in overrides]
        self._set: Any = None
        if overrides:
            self._set = re2.Set.SearchSet(_options())
            for o in overrides:
                self._set.Add(o.pattern)
            self._set.Compile()

    def target(self, name: str, home: int) -> int:
        if self._set is None:
            return home
        hits = self._set.Match(name)
        return self._targets[min(hits)] if hits else home


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the refusal below is the one line the user sees
    options.max_mem = 64 << 20
    return options


def _compiles(pattern: str) -> None:
    try:
        re2.compile(pattern, _options())
    except re2.error as exc:
        why = (
            exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        )
        raise ConfigError(
            f"--override-tensor {pattern!r}: not a regular expression vramlab reads ({why}; RE2 syntax: no "
            "backreferences or look-arounds)"
        ) from None


def parse_overrides(specs: tuple[str, ...], n_devices: int) -> tuple[Override, ...]:
    """`-ot 'REGEX=BUFT[,REGEX=BUFT]'` as llama.cpp reads it: BUFT is CPU or a device name (CUDA0, ...)."""
    out: list[Override] = []
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            pattern, sep, buft = part.rpartition("=")
            if not sep or not pattern:
                raise ConfigError(
                    f"--override-tensor {part!r}: expected REGEX=BUFFER_TYPE (e.g. '.ffn_.*_exps.=CPU')"
                )
            _compiles(pattern)
            out.append(Override(pattern, _buffer_type(buft.strip(), n_devices)))
            if len(out) > MAX_OVERRIDES:
                raise ConfigError(
                    f"--override-tensor: more than {MAX_OVERRIDES:,} patterns; a placement needs a few "
                    "(e.g. '.ffn_.*_exps.=CPU' for every expert)"
                )
    return tuple(out)


def _buffer_type(name: str, n_devices: int) -> int:
    upper = name.upper()
    if upper in ("CPU", "CPU_MAPPED", "CPU_REPACK", "CUDA_HOST"):
        return HOST
    m = re.fullmatch(r"(?:CUDA|ROCM|VULKAN|SYCL|METAL|MUSA)(\d+)", upper)
    if not m:
        raise ConfigError(f"--override-tensor: unknown buffer type {name!r} (CPU, CUDA0, CUDA1, ...)")
    index = int(m.group(1))
    if index >= n_devices:
        raise ConfigError(
            f"--override-tensor: {name} names device {index} but {n_devices} device(s) are planned"
        )
    return index


def cpu_moe_overrides(n_cpu_moe: int) -> tuple[Override, ...]:
    """`--n-cpu-moe N`: the experts of the first N layers stay on the host (common/arg.cpp)."""
    return tuple(Override(rf"blk\.{i}\.ffn_(up|down|gate)_exps", HOST) for i in range(n_cpu_moe))


def split_points(weights: list[float]) -> list[float]:
    """Cumulative, normalised split points (`splits[i] = sum(w[:i+1]) / sum(w)`)."""
    total = sum(weights)
    if total <= 0:
        raise ConfigError("--tensor-split: the proportions must add up to more than 0")
    acc, out = 0.0, []
    for w in weights:
        acc += w
        out.append(acc / total)
    return out


def layer_devices(
    n_layer: int, n_gpu_layers: int, points: list[float], mode: str, main_gpu: int
) -> list[int]:
    """The device of every repeating layer and, last, of the output layer (HOST for the CPU)."""
    n_devices = len(points)
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    act = 0 if n_devices == 0 else min(n_gpu_layers, n_layer + 1)
    out: list[int] = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(HOST)
        elif mode != "layer":
            out.append(main_gpu)
        else:
            x = (il - i_gpu_start) / act
            out.append(next((d for d, p in enumerate(points) if p > x), n_devices - 1))
    return out


@dataclass
class DeviceShare:
    """One device's (or the host's) buffers, in bytes."""

    name: str
    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    layers: list[int] = field(default_factory=list)  # repeating layers whose KV and graph run here
    has_output: bool = False
    tensors_overridden: int = 0  # tensors -ot moved here from their layer's device
    overridden_bytes: int = 0  # host only: what -ot / --n-cpu-moe moved off the devices
    mapped_bytes: int = 0  # host only: the CPU_Mapped buffer llama.cpp prints (the file span)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes


def place_tensors(
    tensors: list[Tensor],
    where: list[int],
    overrides: tuple[Override, ...],
    mode: str,
    points: list[float],
    shares: dict[int, DeviceShare],
    mmap: bool,
) -> None:
    """Sum every tensor into the buffer it lands in; the host's mapped span follows file order."""
    host = shares[HOST]
    first = last = None
    offset = 0
    matcher = OverrideMatcher(overrides)
    for t in tensors:  # file order: token_embd, blk.0 ... blk.n-1, output
        home = HOST if t.layer < 0 else where[t.layer]
        target = matcher.target(t.name, home)
        if target == HOST:
            host.model_bytes += t.bytes
            host.overridden_bytes += t.bytes if home != HOST else 0
            first = offset if first is None else first
            last = offset + t.bytes
        elif mode == "row" and t.matrix and target == home:
            shares_left = t.bytes
            prev = 0.0
            for d, p in enumerate(points):
                part = int(t.bytes * (p - prev)) if d < len(points) - 1 else shares_left
                shares[d].model_bytes += part
                shares_left -= part
                prev = p
        else:
            shares[target].model_bytes += t.bytes
        if target != home:
            shares[target].tensors_overridden += 1
        offset += t.bytes
    host.mapped_bytes = (last - first) if (mmap and first is not None and last is not None) else 0


def model_tensors(
    m: ModelSpec, ftype: str | None, device_bytes: int, host_embedding: int
) -> tuple[list[Tensor], bool]:
    """Every tensor in file order, and whether the sizes are tensor by tensor (a modelled GGUF mix) or
    the device figure spread over the layers by parameter counts (then expert tensors keep their share)."""
    from vramlab.capacity import gguf_mix

    n = m.num_layers
    out = [Tensor("token_embd.weight", -1, host_embedding)]
    if ftype and gguf_mix.supported(m, ftype):
        rules = gguf_mix.rules_for(m, ftype)
        for i in range(n):
            out += [
                Tensor(name, i, size, not name.endswith("norm.weight"))
                for name, size in gguf_mix.layer_tensors(m, rules, i, i, n)
            ]
        out += [
            Tensor(name, n, size, name == "output.weight") for name, size in gguf_mix.output_tensors(m, ftype)
        ]
        return out, True
    h = m.hidden_size
    output = h * m.vocab_size
    moe = set(m.moe_layer_indices())
    expert = 3 * h * m.moe_intermediate_size * m.num_experts
    dense = (2 if not m.gated_mlp else 3) * h * m.intermediate_size
    attn = _attention_params(m)
    shared = (
        3 * h * m.shared_expert_intermediate_size * max(1, m.num_shared_experts)
        if m.shared_expert_intermediate_size
        else 0
    )
    params = [attn + (expert + shared + h * m.num_experts if i in moe else dense) for i in range(n)]
    # the output matrix by the mix's rule (Q6_K in a K-quant) when the file type is known, else by its params
    head = sum(b for _, b in gguf_mix.output_tensors(m, ftype)) if ftype and gguf_mix.known_mix(ftype) else 0
    per = (device_bytes - head) / max(1, sum(params) + (0 if head else output))
    for i in range(n):
        if i in moe:
            out += [
                Tensor(f"blk.{i}.ffn_{p}_exps.weight", i, int(expert * per / 3))
                for p in ("gate", "up", "down")
            ]
        rest = int((params[i] - (expert if i in moe else 0)) * per)
        out.append(Tensor(f"blk.{i}.attn_output.weight", i, rest))  # the layer's other tensors, averaged
    out.append(Tensor("output.weight", n, device_bytes - sum(t.bytes for t in out[1:])))
    return out, False


def _attention_params(m: ModelSpec) -> int:
    """One layer's attention weights: MLA's low-rank projections (DeepSeek V2/V3), else Q, K, V and O."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.is_mla:
        nope, rope = m.qk_nope_head_dim or 0, m.qk_rope_head_dim or 0
        v, kv_rank, q_rank = m.mla_v_head_dim or m.head_dim, m.kv_lora_rank or 0, m.q_lora_rank or 0
        q = h * q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
        return q + h * (kv_rank + rope) + kv_rank * heads * (nope + v) + heads * v * h
    return 2 * h * heads * m.head_dim + 2 * h * m.num_kv_heads * m.head_dim


@dataclass(frozen=True)
class Phases:
    """The compute-buffer phases (bytes) of one graph split, from the shapes."""

    attention: int
    ffn_gpu: int
    ffn_host: int
    output: int


def phases(m: ModelSpec, n_kv: int, n_ubatch: int, outputs: int, flash_attn: bool) -> Phases:
    hidden = 6 * 4 * n_ubatch * m.hidden_size
    attention = 0 if flash_attn else 4 * n_kv * n_ubatch * (m.num_attention_heads + 1) + hidden
    n_ff = m.num_experts_per_tok * m.moe_intermediate_size if m.is_moe else m.intermediate_size
    ffn = 3 * 4 * n_ubatch * n_ff
    return Phases(attention, ffn + hidden, ffn, 4 * (outputs * m.vocab_size + n_ubatch * m.hidden_size))


def compute_bytes(share: DeviceShare, p: Phases, host: bool, expert_host: bool) -> int:
    """The device's peak: the largest phase among those that run on it."""
    runs: list[int] = []
    if share.layers:
        runs += [p.attention, p.ffn_host if host else p.ffn_gpu]
    if host and expert_host:  # the routed experts' matmuls run where their weights are
        runs.append(p.ffn_host)
    if share.has_output:
        runs.append(p.output)
    return max(runs, default=0)
