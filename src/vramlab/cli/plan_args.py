"""`vramlab plan`'s flags, one group per concept, and which engines read each one (ENGINE_FLAGS).

The flags keep the engines' own names; one spelling covers the same idea in several engines (the docstring of
each says how it maps). A flag the chosen engine does not read is refused (cli/plan_settings.py): planned
silently it would answer a question nobody asked.
"""

from __future__ import annotations

import argparse
from typing import Any

from vramlab.cli import plan_device
from vramlab.engines import names

ENGINES = names()  # every engine vramlab plans (vramlab.engines)
SERVERS = ("vllm", "sglang", "tgi", "transformers")  # the GPU servers: tensor parallel, dtype, a paged pool
GGUF = ("llama.cpp", "ollama")

# dest -> (the engines whose plan reads it, the value that asks nothing: the parser's default). Flags read by every
# engine (--model, --gpu, --max-model-len, --kv-cache-dtype, --quantization, ...) are not listed.
ENGINE_FLAGS: dict[str, tuple[tuple[str, ...], Any]] = {
    "vllm_engine": (("vllm",), None),
    "gpu_memory_utilization": (("vllm", "sglang", "tgi"), None),
    "max_num_seqs": (("vllm", "sglang", "transformers"), None),
    "max_num_batched_tokens": (("vllm", "sglang", "tgi"), None),
    "tensor_parallel_size": (SERVERS, 1),
    "pipeline_parallel_size": (("vllm", "sglang"), 1),
    "dtype": (SERVERS, "auto"),
    "enforce_eager": (("vllm", "sglang", "tgi"), False),
    "block_size": (("vllm", "tgi"), None),
    "kv_cache_memory": (("vllm",), None),
    "num_gpu_blocks_override": (("vllm",), None),
    "mem_fraction_static": (("sglang",), None),
    "chunked_prefill_size": (("sglang",), None),
    "max_batch_prefill_tokens": (("tgi",), None),
    "enable_chunked_prefill": (("vllm",), None),
    "flashinfer_sampler": (("vllm",), None),
    "gpu_p2p": (("vllm",), None),
    "allow_long_max_model_len": (("vllm",), False),
    "rope_scaling_factor": (("vllm", "transformers"), None),
    "disable_sliding_window": (("vllm",), False),
    "continuous_batching": (("transformers",), False),
    "llm_class": (("vllm",), False),
    "in_trainer": (("vllm",), False),
    "enable_lora": (("vllm",), False),
    "max_lora_rank": (("vllm",), None),
    "max_loras": (("vllm",), None),
    "limit_mm_per_prompt": (("vllm",), None),
    "ctx_size": (("llama.cpp",), None),
    "parallel": (GGUF, None),
    "cache_type_v": (("llama.cpp",), None),
    "flash_attn": (GGUF, None),
    "ubatch_size": (("llama.cpp",), None),
    "llamacpp_server": (("llama.cpp",), None),
    "n_gpu_layers": (GGUF, None),
    "override_tensor": (("llama.cpp",), []),
    "n_cpu_moe": (("llama.cpp",), 0),
    "cpu_moe": (("llama.cpp",), False),
    "tensor_split": (("llama.cpp",), None),
    "split_mode": (("llama.cpp",), "layer"),
    "main_gpu": (("llama.cpp",), 0),
    "fit": (("llama.cpp",), None),
    "fit_target": (("llama.cpp",), None),
    "fit_ctx": (("llama.cpp",), None),
    "no_kv_offload": (("llama.cpp",), False),
    "no_mmap": (("llama.cpp",), False),
    "ollama_gpu_overhead": (("ollama",), None),
}


def add_arguments(p: argparse.ArgumentParser, epilog: str | None) -> None:
    p.epilog = epilog
    _model_and_card(p.add_argument_group("model and card"))
    e = p.add_argument_group("engine settings (the engines' own names and meanings)")
    _serving(e)
    _vllm(p.add_argument_group("vLLM only"))
    _sglang_tgi_transformers(p.add_argument_group("SGLang, TGI and transformers only"))
    _llamacpp(p.add_argument_group("llama.cpp (and Ollama where said)"))
    _ollama(p.add_argument_group("Ollama only"))
    from vramlab.cli import plan_options

    plan_options.add_arguments(p)
    _output(p.add_argument_group("questions and output"))


def _model_and_card(m: argparse._ArgumentGroup) -> None:
    m.add_argument(
        "--model", required=True, help="catalog name, Hugging Face id, directory, config.json or .gguf"
    )
    m.add_argument("--revision", help="Hub revision for a Hub id")
    m.add_argument("--offline", action="store_true", help="never touch the network (cache and catalog only)")
    plan_device.add_card_arguments(m)


def _serving(e: argparse._ArgumentGroup) -> None:
    """What every engine reads, and what the GPU servers (vLLM, SGLang, TGI, transformers) share."""
    e.add_argument("--engine", choices=ENGINES, default="vllm", help="the serving engine (default vllm)")
    e.add_argument("--engine-version", help="engine release, e.g. 0.8.5 (default: the newest modelled)")
    e.add_argument(
        "--max-model-len",
        help="context length per request (accepts 8k, 128k); vLLM 0.12+: auto or -1 = the longest that fits; "
        "llama.cpp: per slot; Ollama: num_ctx",
    )
    e.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="KV cache type (vLLM fp8, SGLang fp8_e5m2, llama.cpp/Ollama q8_0, q4_0; default auto)",
    )
    e.add_argument(
        "--quantization",
        help="load-time quantization (fp8, awq, gptq, bitsandbytes, ...) or a GGUF file type (Q4_K_M, Q8_0, ...)",
    )
    e.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vLLM's fraction of the card (SGLang: --mem-fraction-static's fallback; TGI: CUDA_MEMORY_FRACTION)",
    )
    e.add_argument("--max-num-seqs", help="vLLM max_num_seqs / SGLang max_running_requests / batch size")
    e.add_argument(
        "--max-num-batched-tokens",
        help="vLLM's token budget per step (SGLang: --chunked-prefill-size's fallback; TGI: the warm-up prefill)",
    )
    e.add_argument(
        "-tp", "--tensor-parallel-size", type=int, default=1, help="GPUs one model is split over (default 1)"
    )
    e.add_argument(
        "-pp", "--pipeline-parallel-size", type=int, default=1, help="vLLM/SGLang pipeline stages (default 1)"
    )
    e.add_argument("--dtype", default="auto", help="weights and activations dtype (auto, bfloat16, float16)")
    e.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs (vLLM; SGLang/TGI: graphs disabled)"
    )
    e.add_argument("--block-size", type=int, help="KV cache block size in tokens (vLLM, TGI)")


def _vllm(e: argparse._ArgumentGroup) -> None:
    e.add_argument(
        "--vllm-engine", choices=("v0", "v1"), help="vLLM engine generation (default: the release's own)"
    )
    e.add_argument(
        "--kv-cache-memory",
        "--kv-cache-memory-bytes",
        help="vLLM --kv-cache-memory-bytes: the KV pool, bypassing gpu_memory_utilization (bytes, or e.g. 20GiB); "
        "the CPU build's VLLM_CPU_KVCACHE_SPACE=N is NGiB",
    )
    e.add_argument(
        "--num-gpu-blocks-override",
        help="vLLM --num-gpu-blocks-override: the pool is this many blocks (128 tokens each on the CPU build)",
    )
    e.add_argument(
        "--enable-chunked-prefill",
        choices=("on", "off", "auto"),
        help="vLLM V0 (default auto: on above a 32k context)",
    )
    e.add_argument(
        "--flashinfer-sampler",
        choices=("on", "off", "auto"),
        help="vLLM V1: the profiled sampler runs FlashInfer (on) or sorts the vocabulary (off); auto = the "
        "release's default (before 0.11.1 it depends on whether FlashInfer is installed; the log says "
        "'Using FlashInfer for top-p & top-k sampling')",
    )
    e.add_argument(
        "--gpu-p2p",
        choices=("on", "off", "auto"),
        help="vLLM: off when the GPUs cannot reach each other over P2P/NVLink (the log: 'Custom allreduce is "
        "disabled because your platform lacks GPU P2P capability' or '... spans across nodes'); "
        "on / auto = from the card (SXM cards sit on an NVSwitch, PCIe cards do not)",
    )
    e.add_argument(
        "--allow-long-max-model-len",
        action="store_true",
        help="vLLM with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: plan a max_model_len above the trained context",
    )
    e.add_argument(
        "--rope-scaling-factor",
        type=float,
        help="a rope-scaling override (vLLM --hf-overrides / --rope-scaling; transformers) that extends the context",
    )
    e.add_argument(
        "--disable-sliding-window",
        action="store_true",
        help="vLLM --disable-sliding-window: max_model_len capped at the window, every layer full attention",
    )
    e.add_argument(
        "--llm-class", action="store_true", help="vLLM: defaults of the offline LLM class, not `vllm serve`"
    )
    e.add_argument(
        "--in-trainer",
        action="store_true",
        help="vLLM's LLM class inside a training process (Unsloth, TRL colocate): implies --llm-class; "
        "the trainer's own allocations are not modelled, so the bands widen",
    )
    e.add_argument(
        "--enable-lora",
        action="store_true",
        help="vLLM --enable-lora: the LoRA slots it allocates at load count as weights",
    )
    e.add_argument("--max-lora-rank", type=int, help="vLLM --max-lora-rank (default 16)")
    e.add_argument("--max-loras", type=int, help="vLLM --max-loras (default 1)")
    e.add_argument(
        "--limit-mm-per-prompt",
        metavar="SPEC",
        help="vLLM --limit-mm-per-prompt, as JSON or image=2,video=0: which images and videos V1 profiles "
        "through the vision encoder at start-up (default 999 each)",
    )


def _sglang_tgi_transformers(e: argparse._ArgumentGroup) -> None:
    e.add_argument("--mem-fraction-static", type=float, help="SGLang: the static fraction of the card")
    e.add_argument("--chunked-prefill-size", type=int, help="SGLang: the prefill chunk (-1 = off)")
    e.add_argument("--max-batch-prefill-tokens", type=int, help="TGI: the warm-up's prefill tokens")
    e.add_argument(
        "--continuous-batching", action="store_true", help="transformers serve --continuous-batching"
    )


def _llamacpp(e: argparse._ArgumentGroup) -> None:
    """llama.cpp's own flags (placement over cards and the host); Ollama reads -np, -fa and -ngl too."""
    e.add_argument("--ctx-size", "-c", help="llama.cpp n_ctx over all slots (accepts 32k)")
    e.add_argument("--parallel", "-np", type=int, help="llama.cpp slots (Ollama: OLLAMA_NUM_PARALLEL)")
    e.add_argument("--cache-type-v", help="llama.cpp V cache type (default: the K type, --kv-cache-dtype)")
    e.add_argument(
        "--flash-attn",
        "-fa",
        choices=("on", "off", "auto"),
        help="llama.cpp flash attention (Ollama: OLLAMA_FLASH_ATTENTION=1 with on)",
    )
    e.add_argument("--ubatch-size", "-ub", help="llama.cpp n_ubatch (default 512)")
    e.add_argument(
        "--llamacpp-server",
        choices=("llama-server", "llama-cpp-python"),
        help="whose defaults: upstream llama-server (the default) or `python -m llama_cpp.server`",
    )
    e.add_argument(
        "--n-gpu-layers",
        "-ngl",
        help="layers on the GPUs (the last N; all or -1 = every layer and the output layer; default all; "
        "Ollama: num_gpu)",
    )
    e.add_argument(
        "--override-tensor",
        "-ot",
        action="append",
        default=[],
        metavar="REGEX=BUFT",
        help="llama.cpp: tensors whose name matches REGEX go to BUFT (CPU, CUDA1, ...); repeatable; RE2 syntax "
        "(no backreferences or look-arounds)",
    )
    e.add_argument(
        "--n-cpu-moe",
        type=int,
        default=0,
        help="llama.cpp: keep the MoE experts of the first N layers on the host",
    )
    e.add_argument("--cpu-moe", action="store_true", help="llama.cpp: keep every MoE expert on the host")
    e.add_argument(
        "--tensor-split",
        "-ts",
        help="llama.cpp proportions per card, e.g. 3,1 (finite, >= 0, not all 0; default: by free memory)",
    )
    e.add_argument(
        "--split-mode",
        "-sm",
        choices=("layer", "row", "none"),
        default="layer",
        help="llama.cpp: split layers (default), rows, or one card",
    )
    e.add_argument(
        "--main-gpu", "-mg", type=int, default=0, help="llama.cpp: the card for --split-mode none/row"
    )
    e.add_argument(
        "--fit",
        "-fit",
        choices=("on", "off"),
        help="llama-server --fit: cut the context / move weights to the host to keep --fit-target free "
        "(default on from b7414; settings you give are never changed)",
    )
    e.add_argument(
        "--fit-target", "-fitt", help="llama.cpp --fit margin per device in MiB, e.g. 1024 or 512,2048"
    )
    e.add_argument(
        "--fit-ctx", "-fitc", help="llama.cpp --fit: the shortest context it may cut to (default 4096)"
    )
    e.add_argument("--no-kv-offload", "-nkvo", action="store_true", help="llama.cpp: KV cache in host memory")
    e.add_argument(
        "--no-mmap", action="store_true", help="llama.cpp: host tensors in a CPU buffer, not mapped"
    )


def _ollama(e: argparse._ArgumentGroup) -> None:
    e.add_argument(
        "--ollama-gpu-overhead",
        help="Ollama OLLAMA_GPU_OVERHEAD (bytes, or e.g. 1GiB) held back per GPU; "
        "with --engine ollama, --max-model-len is num_ctx, --parallel OLLAMA_NUM_PARALLEL, -ngl num_gpu, "
        "--flash-attn on OLLAMA_FLASH_ATTENTION=1 and --kv-cache-dtype OLLAMA_KV_CACHE_TYPE",
    )


def _output(o: argparse._ArgumentGroup) -> None:
    o.add_argument(
        "--concurrency", type=int, help="also report the largest max_model_len for this many sequences"
    )
    o.add_argument("--margin", type=float, default=0.10, help="safety margin of the KV pool (default 0.10)")
    o.add_argument(
        "--prefix-shared-tokens",
        type=int,
        metavar="N",
        help="every request shares its first N tokens (a system prompt): how many more users the pool "
        "holds with prefix caching (at --request-tokens)",
    )
    o.add_argument(
        "--request-tokens",
        type=int,
        metavar="L",
        help="with --prefix-shared-tokens: one request's whole length, prompt and answer (default max-model-len)",
    )
    o.add_argument("--calibration", help="a calibration profile from `vramlab calibrate`")
    o.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep a setting (repeat for a grid), e.g. max-model-len=2k,8k,32k",
    )
    o.add_argument("--plot", help="with --sweep: write a PNG of the grid")
    o.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (docs/plan-json.md); the exit code is the verdict's either way",
    )
