"""What every engine policy shares: the resolved context and the policy's result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from vramlab.capacity import defaults, devices
from vramlab.capacity import kv as kvmod
from vramlab.capacity import weights as wmod
from vramlab.capacity.constants import Constants
from vramlab.capacity.estimate import EXACT, FORMULA, Component, Limits, band
from vramlab.capacity.gpus import GPU
from vramlab.capacity.settings import EngineSettings
from vramlab.capacity.spec import ModelSpec, QuantSpec, dtype_bytes
from vramlab.errors import ConfigError

SXM_FAMILIES = ("a100", "h100", "h200", "b200", "b100", "gb200")
LORA_IN_WEIGHTS_FROM = (0, 8)  # 0.7.3 logs PunicaWrapperGPU after the weights line, 0.8.1 before it (r067)
BNB_DQ_EXPANDED_FROM = (0, 9, 2)  # vLLM PR #19742 (merged 2025-06-18): first release v0.9.2


@dataclass
class Context:
    model: ModelSpec
    gpu: GPU
    settings: EngineSettings
    constants: Constants

    def __post_init__(self) -> None:
        self.tp = max(1, self.settings.tensor_parallel_size)
        self.pp = max(1, self.settings.pipeline_parallel_size)
        if self.pp > self.model.num_layers:
            raise ConfigError(
                f"--pipeline-parallel-size {self.pp} exceeds the model's {self.model.num_layers} layers"
            )
        self.version = self.settings.version
        self.quant: QuantSpec | None = wmod.effective_quant(self.model, self.settings.quantization)
        self.dtype = wmod.resolve_dtype(
            self.model, self.settings.dtype, self.quant, self.settings.engine, self.version
        )
        if (
            self.dtype == "bfloat16"
            and self.gpu.arch in ("pascal", "volta", "turing")
            and self.settings.dtype in ("auto", None)
            and self.settings.engine in ("vllm", "sglang", "tgi")
        ):
            self.dtype = "float16"  # no bf16 before Ampere: the serving engines cast to float16 under `auto`
        devices.check_target(self.gpu, self.settings)
        self.total = self.gpu.memory_bytes
        self.other = devices.held_before_start(self.gpu, self.settings)  # the OS's share on unified memory

    def layer_range(self, stage: int = 0) -> range:
        split = wmod.pp_layer_split(self.model.num_layers, self.pp)
        start = sum(split[:stage])
        return range(start, start + split[stage])

    def weights(self, stage: int = 0) -> tuple[int, str]:
        value, how = wmod.weight_bytes(
            self.model,
            self.dtype,
            self.settings.quantization,
            self.tp,
            self.pp,
            stage,
            rope_cache=self.settings.engine in ("vllm", "sglang"),
            bnb_nested_absmax=self.bnb_nested_absmax,
            mxfp4_layout=self.mxfp4_layout,
        )
        return value + self.lora_bytes(stage), how

    def lora_bytes(self, stage: int = 0) -> int:
        """vLLM `--enable-lora`: the LoRA slots allocated while loading (counted in its weights line).

        vLLM 0.7.x creates them after its weights line (its logs print `PunicaWrapperGPU` after "Loading
        model weights took"; 0.8.1+ before "Model loading took"): there they land in the profiled
        activation figure, which the V0 activation terms were read off, so they are not added here."""
        s = self.settings
        if not s.enable_lora or s.engine != "vllm" or (self.version and self.version < LORA_IN_WEIGHTS_FROM):
            return 0
        elems = wmod.lora_slot_params(
            self.model, self.tp, self.pp, stage, max(1, s.max_lora_rank), max(1, s.max_loras)
        )
        return int(elems * dtype_bytes(self.dtype))

    @property
    def mxfp4_layout(self) -> str:
        """The MXFP4 MoE backend vLLM picks by card (`get_mxfp4_backend`): Marlin on NVIDIA cards below Blackwell,
        FlashInfer on Blackwell. Hopper runs Marlin unless triton_kernels is installed (`mxfp4_hopper_triton_bytes`
        widens the band to that layout). llama.cpp and Ollama load ggml's unpadded blocks; SGLang and other vendors keep
        the FlashInfer padding."""
        if self.settings.engine in ("llama.cpp", "ollama"):
            return "gguf"
        if self.settings.engine != "vllm" or self.gpu.vendor != "nvidia" or self.gpu.arch == "blackwell":
            return "flashinfer"
        return "marlin"

    def mxfp4_hopper_triton_bytes(self, stage: int = 0) -> int | None:
        """vLLM on Hopper with the triton_kernels package: the Triton layout's weights (None elsewhere)."""
        q = self.quant
        if self.settings.engine != "vllm" or self.gpu.arch != "hopper" or q is None or q.method != "mxfp4":
            return None
        value, _ = wmod.weight_bytes(
            self.model,
            self.dtype,
            self.settings.quantization,
            self.tp,
            self.pp,
            stage,
            rope_cache=True,
            bnb_nested_absmax=self.bnb_nested_absmax,
            mxfp4_layout="triton",
        )
        return value + self.lora_bytes(stage)

    @property
    def bnb_nested_absmax(self) -> bool:
        """vLLM before 0.9.2 kept double-quantized bitsandbytes statistics compressed; 0.9.2 expands them
        to fp32 at load (PR #19742, `dequantize_dq` in model_loader/bitsandbytes_loader.py)."""
        return self.settings.engine == "vllm" and bool(self.version) and self.version < BNB_DQ_EXPANDED_FROM

    def weights_component(self, stage: int = 0) -> Component:
        value, how = self.weights(stage)
        lora = self.lora_bytes(stage)
        lora_note = (
            (
                f"; includes {lora / 2**30:.2f} GiB of LoRA slots ({self.settings.max_loras} x rank "
                f"{self.settings.max_lora_rank}; embedding/LM-head LoRA not counted)"
            )
            if lora
            else ""
        )

        if how == "exact":
            return band(
                "weights",
                value,
                0.005,
                0.01,
                EXACT,
                "bytes from the weight files' headers; load-time buffers add a little" + lora_note,
            )
        q = self.quant
        note = "computed from the architecture"
        rel = 0.02
        if q is not None:
            note += f" and {q.method} {q.bits:g}-bit storage (scales, zeros, unquantized layers)"
            # FP8 stores one byte and a scale; group quantizers vary with skipped modules; bnb most of all.
            rel = 0.02 if "fp8" in q.method else 0.08 if q.method == "bitsandbytes" else 0.05
        if self.model.vision_params:
            note += "; vision tower from its config"
            rel = max(rel, 0.05)
        note += lora_note
        comp = band("weights", value, rel, rel, FORMULA, note)
        triton = self.mxfp4_hopper_triton_bytes(stage)
        if triton is not None and triton < comp.low_bytes:
            comp = Component(
                "weights",
                comp.bytes,
                triton,
                comp.high_bytes,
                FORMULA,
                note + f"; Hopper: Marlin's padded layout, {triton / 2**30:.2f} GiB in the Triton kernels' "
                "layout if triton_kernels is installed (band widened to it)",
            )
        return comp

    def constant_component(
        self, name: str, key: str, note: str, in_budget: bool = True, extra_band: float = 0.0
    ) -> Component:
        """A component that is one calibratable constant, with its band and provenance."""
        rel = self.constants.band(key) + extra_band
        return band(name, self.constants[key], rel, rel, self.constants.provenance(key), note, in_budget)

    @property
    def on_nvswitch(self) -> bool:
        """SXM data-centre cards sit on an NVSwitch: NCCL maps NVLink buffers and vLLM's custom
        all-reduce runs at any TP up to 8 with registered IPC buffers; PCIe cards get neither
        (custom all-reduce is off above two PCIe GPUs). GPUs that cannot reach each other (`gpu_p2p` False:
        other nodes, or a container without P2P, as vLLM's custom_all_reduce.py warns) get neither either."""
        name = self.gpu.name
        if self.settings.gpu_p2p is False:
            return False
        if (
            self.gpu.nvswitch is not None
        ):  # the catalog says (PCIe RTX PRO, MIG slices, unified machines, H20)
            return self.gpu.nvswitch
        return name.startswith(SXM_FAMILIES) and not any(tag in name for tag in ("pcie", "nvl"))

    def nccl_component(self, note: str, in_budget: bool = True) -> Component:
        """NCCL communicators created at start-up; their size follows the interconnect."""
        key = "nccl_init_bytes" if self.on_nvswitch else "nccl_init_pcie_bytes"
        return self.constant_component(
            "nccl",
            key,
            note + ("" if self.on_nvswitch else " (no NVSwitch: ring buffers only)"),
            in_budget=in_budget,
        )

    def kv_shapes(self, stage: int = 0) -> tuple[kvmod.KVShape, ...]:
        shapes = kvmod.kv_shapes(
            self.model, self.settings.kv_cache_dtype, self.dtype, self.tp, self.layer_range(stage)
        )
        if self.settings.speculative is not None and stage == self.pp - 1:
            from vramlab.capacity import speculative

            if speculative.shares_pool(self):  # vLLM: the drafter's layers are layers of the pool
                shapes = speculative.merge_shapes(shapes, speculative.draft_kv_shapes(self))
        return shapes

    def kv_bytes_per_token(self, stage: int = 0) -> int:
        return kvmod.kv_bytes_per_token(
            self.model, self.settings.kv_cache_dtype, self.dtype, self.tp, self.layer_range(stage)
        )

    def state_bytes_per_seq(self, stage: int = 0, recurrent_dtype: str = "float32") -> int:
        return kvmod.state_bytes_per_sequence(
            self.model, self.dtype, self.tp, self.layer_range(stage), recurrent_dtype
        )

    @cached_property
    def model_max_len(self) -> int:
        """The context this engine and release derive from the config (rope scaling as they apply it);
        with a rope-scaling override, the base length times the user's factor (capacity/defaults.py)."""
        return defaults.settings_context(self.model, self.settings).tokens

    @cached_property
    def default_context(self) -> int:
        """max_model_len when none is given: the derived context less the release's cap (TGI 1.x-2.x)."""
        return defaults.default_context(self.model, self.settings)

    def longer_than_trained(self, length: int, engine: str, allowed: bool, how: str) -> list[str]:
        """A context above the derived one: a warning when the engine was allowed to take it, else
        the engine's own refusal (ConfigError)."""
        trained = self.model_max_len
        if not trained or length <= trained:
            return []
        if not allowed:
            rule = defaults.settings_context(self.model, self.settings).rule
            raise ConfigError(
                f"{engine}: max_model_len {length} is greater than the derived max_model_len ({trained} for "
                f"{self.model.name}: {rule}); {how}"
            )
        return [
            f"max_model_len {length} is above the model's trained context {trained}: quality past "
            f"{trained} tokens is not guaranteed (planned because {engine} was allowed to take it)"
        ]

    def check_tp(self, engine: str) -> None:
        m = self.model
        if m.num_attention_heads % self.tp:
            raise ConfigError(
                f"{engine}: total number of attention heads ({m.num_attention_heads}) must be divisible by "
                f"tensor parallel size ({self.tp})"
            )


@dataclass
class PolicyResult:
    """An engine's answer before the generic bookkeeping (limits at the band ends, verdict)."""

    components: list[Component]  # everything but the KV cache
    budget_bytes: int
    kv_rule: Callable[[list[Component], str], int]  # KV bytes given components at band point "mid|low|high"
    limits: Callable[[int], Limits]  # blocks, tokens and concurrency for a KV size
    max_model_len: int
    block_size: int
    kv_bytes_per_token: int
    settings: dict[str, object]
    kv_provenance: str
    kv_note: str
    kv_fixed: bool = False  # KV sized by settings (llama.cpp, transformers), not a leftover
    per_sequence_state_bytes: int = 0
    reasons: list[str] = field(default_factory=list)  # why it does not fit / would refuse to start
    notes: list[str] = field(default_factory=list)
    min_blocks_needed: int = 1  # blocks one max_model_len request needs
    extra: dict[str, object] = field(default_factory=dict)


def pick(components: list[Component], point: str, names: tuple[str, ...] | None = None) -> int:
    """Sum of in-budget components at a band point: 'mid' (expected), 'low' or 'high'."""
    total = 0
    for comp in components:
        if not comp.in_budget or (names is not None and comp.name not in names):
            continue
        total += {"mid": comp.bytes, "low": comp.low_bytes, "high": comp.high_bytes}[point]
    return total
