"""`vramlab plan`'s speculative-decoding, KV-offload and release-comparison flags, in each engine's own spelling.

vLLM: `--speculative-config JSON` (older releases: `--speculative-model`, `--num-speculative-tokens`),
`--kv-offloading-size`, `--kv-offloading-backend`, `--kv-transfer-config JSON`; SGLang: `--speculative-algorithm`,
`--speculative-draft-model-path`, `--speculative-num-steps`, `--speculative-eagle-topk`,
`--speculative-num-draft-tokens`, `--enable-hierarchical-cache`, `--hicache-ratio`, `--hicache-size`; llama.cpp:
`-md`, `--draft-max`, `-ngld`, `-cd`, `-ctkd`, `-ctvd`. The draft is resolved like `--model` (catalog name, Hub id,
directory, config.json or .gguf).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from vramlab.errors import ConfigError

if TYPE_CHECKING:
    from vramlab.capacity import GPU, Constants, EngineSettings, ModelSpec
    from vramlab.capacity.settings import KVOffload, Speculative

VLLM_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram", "deepseek_mtp")
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
SPELLED = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("speculative decoding and KV offload (each engine's own flags)")
    s.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='vLLM: e.g. \'{"method": "eagle3", "model": HEAD, "num_speculative_tokens": 3}\' '
        "(method eagle, eagle3, mtp, draft_model or ngram; model: catalog name, Hub id or path)",
    )
    s.add_argument("--speculative-model", help="older vLLM: the draft model")
    s.add_argument("--num-speculative-tokens", type=int, help="older vLLM: tokens drafted per step")
    s.add_argument("--speculative-algorithm", choices=SGLANG_ALGORITHMS, help="SGLang")
    s.add_argument("--speculative-draft-model-path", "--speculative-draft-model", help="SGLang: the draft")
    s.add_argument("--speculative-num-steps", type=int, help="SGLang (default: SGLang's own choice)")
    s.add_argument("--speculative-eagle-topk", type=int, help="SGLang")
    s.add_argument("--speculative-num-draft-tokens", type=int, help="SGLang")
    s.add_argument(
        "--model-draft", "-md", "--spec-draft-model", help="llama.cpp: the draft model (like --model)"
    )
    s.add_argument("--draft-max", "--spec-draft-n-max", type=int, help="llama.cpp: tokens drafted per step")
    s.add_argument(
        "--gpu-layers-draft", "-ngld", help="llama.cpp: draft layers on the GPU (N, all; default all)"
    )
    s.add_argument(
        "--ctx-size-draft", "-cd", help="llama.cpp: each slot's draft context (builds with one per slot)"
    )
    s.add_argument("--cache-type-k-draft", "-ctkd", help="llama.cpp: the draft's K cache type (default f16)")
    s.add_argument("--cache-type-v-draft", "-ctvd", help="llama.cpp: the draft's V cache type (default f16)")
    s.add_argument(
        "--kv-offloading-size", type=float, metavar="GIB", help="vLLM 0.11.1+: host KV tier, all GPUs"
    )
    s.add_argument("--kv-offloading-backend", choices=("native", "lmcache"), help="vLLM (default native)")
    s.add_argument(
        "--kv-transfer-config", metavar="JSON", help="vLLM: an OffloadingConnector / LMCacheConnectorV1"
    )
    s.add_argument("--enable-hierarchical-cache", action="store_true", help="SGLang HiCache: a host KV tier")
    s.add_argument("--hicache-ratio", type=float, help="SGLang: host pool / device pool tokens (default 2.0)")
    s.add_argument(
        "--hicache-size", type=float, metavar="GB", help="SGLang: host pool per GPU in GB (10^9 B)"
    )
    s.add_argument(
        "--host-memory-gib", type=float, help="host memory free for the engine: checks a host KV tier"
    )
    s.add_argument(
        "--vs-engine-version",
        "--vs",
        metavar="VERSION",
        help="also plan this release and compare component by component, naming the release rule that moved each",
    )


def _json(flag: str, text: str, example: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{flag}: not JSON: {exc.msg} at character {exc.pos} (example: {example})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object (example: {example})")
    return value


def _whole(flag: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{flag}: must be a whole number >= 1, got {value!r}")
    return value


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False)]


def _refuse_foreign(args: argparse.Namespace) -> None:
    """Each engine's flags with that engine only: one line naming the flag and the engine it belongs to."""
    owners = {
        "vllm": (
            "speculative_config",
            "speculative_model",
            "num_speculative_tokens",
            "kv_offloading_size",
            "kv_offloading_backend",
            "kv_transfer_config",
        ),
        "sglang": (
            "speculative_algorithm",
            "speculative_draft_model_path",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "enable_hierarchical_cache",
            "hicache_ratio",
            "hicache_size",
        ),
        "llama.cpp": (
            "model_draft",
            "draft_max",
            "gpu_layers_draft",
            "ctx_size_draft",
            "cache_type_k_draft",
            "cache_type_v_draft",
        ),
    }
    for engine, names in owners.items():
        given = _given(args, names)
        if given and args.engine != engine:
            raise ConfigError(
                f"{', '.join(given)}: {SPELLED[engine]} flags; add --engine {engine} (planning {args.engine})"
            )


def speculative(args: argparse.Namespace) -> tuple[Speculative | None, str | None]:
    """(the speculative settings without the draft's facts, the draft to resolve like --model)."""
    from vramlab.capacity.settings import Speculative

    _refuse_foreign(args)
    if args.speculative_config is not None or args.speculative_model is not None:
        return _vllm(args)
    if args.speculative_algorithm:
        from vramlab.capacity.speculative import SGLANG_ALGORITHMS as METHOD

        method = METHOD[args.speculative_algorithm]
        draft = args.speculative_draft_model_path
        if method in ("eagle", "eagle3", "draft_model") and not draft:
            raise ConfigError(
                f"--speculative-algorithm {args.speculative_algorithm}: add --speculative-draft-model-path"
            )
        spec = Speculative(
            method,
            num_speculative_tokens=_whole("--speculative-num-steps", args.speculative_num_steps),
            eagle_topk=_whole("--speculative-eagle-topk", args.speculative_eagle_topk),
            num_draft_tokens=_whole("--speculative-num-draft-tokens", args.speculative_num_draft_tokens),
        )
        return spec, draft if method != "mtp" else None
    if args.model_draft:
        from vramlab.capacity.planning import parse_count

        ngld = (args.gpu_layers_draft or "all").strip().lower()
        if ngld not in ("all", "auto", "-1") and not ngld.isdigit():
            raise ConfigError(
                f"--gpu-layers-draft: expected a count, all or auto, got {args.gpu_layers_draft!r}"
            )
        spec = Speculative(
            "draft_model",
            num_speculative_tokens=_whole("--draft-max", args.draft_max),
            draft_n_gpu_layers=int(ngld) if ngld.isdigit() else -1,
            draft_ctx_size=parse_count(args.ctx_size_draft) if args.ctx_size_draft else None,
            draft_cache_type_k=args.cache_type_k_draft,
            draft_cache_type_v=args.cache_type_v_draft,
        )
        return spec, args.model_draft
    stray = _given(
        args,
        (
            "speculative_draft_model_path",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "draft_max",
            "ctx_size_draft",
        ),
    )
    if stray or args.gpu_layers_draft or args.cache_type_k_draft or args.cache_type_v_draft:
        raise ConfigError(
            f"{', '.join(stray) or 'the draft flags'}: name the speculative method first "
            "(--speculative-config, --speculative-algorithm or -md)"
        )
    return None, None


def _vllm(args: argparse.Namespace) -> tuple[Speculative, str | None]:
    from vramlab.capacity.settings import Speculative

    example = '\'{"method": "eagle3", "model": "...", "num_speculative_tokens": 3}\''
    if args.speculative_config is not None:
        if args.speculative_model is not None:
            raise ConfigError("--speculative-model: give the draft inside --speculative-config, not both")
        config = _json("--speculative-config", args.speculative_config, example)
    else:
        config = {"model": args.speculative_model, "num_speculative_tokens": args.num_speculative_tokens}
    method = config.get("method")
    model = config.get("model")
    if method is None:
        if not model:
            raise ConfigError(
                '--speculative-config: give "method" or "model" (vLLM detects the method from it)'
            )
        lowered = str(model).lower()
        method = "eagle3" if "eagle3" in lowered else "eagle" if "eagle" in lowered else "draft_model"
    if method not in VLLM_METHODS:
        raise ConfigError(
            f"--speculative-config: method {method!r}: expected one of {', '.join(VLLM_METHODS)}"
        )
    method = "mtp" if method == "deepseek_mtp" else method
    if method in ("eagle", "eagle3", "draft_model") and not model:
        raise ConfigError(f'--speculative-config: method {method} needs "model"')
    if model is not None and not isinstance(model, str):
        raise ConfigError(f'--speculative-config: "model" must be a string, got {model!r}')
    tokens = _whole('--speculative-config "num_speculative_tokens"', config.get("num_speculative_tokens"))
    if tokens is None and method not in ("mtp", "ngram"):
        raise ConfigError('--speculative-config: "num_speculative_tokens" is required for ' + method)
    return Speculative(method, num_speculative_tokens=tokens), (
        model if method not in ("mtp", "ngram") else None
    )


def kv_offload(args: argparse.Namespace) -> KVOffload | None:
    """The host KV tier the flags ask for, or None."""
    from vramlab.capacity.settings import KVOffload

    _refuse_foreign(args)
    if args.kv_transfer_config is not None:
        if args.kv_offloading_size is not None:
            raise ConfigError("--kv-transfer-config: give the connector or --kv-offloading-size, not both")
        return _transfer_config(args.kv_transfer_config)
    if args.kv_offloading_size is not None:
        if not 0 < args.kv_offloading_size <= 1 << 20:
            raise ConfigError(
                f"--kv-offloading-size: a positive number of GiB, got {args.kv_offloading_size}"
            )
        return KVOffload(
            args.kv_offloading_backend or "native", size_bytes=int(args.kv_offloading_size * (1 << 30))
        )
    if args.kv_offloading_backend:
        raise ConfigError("--kv-offloading-backend: vLLM turns offloading on with --kv-offloading-size")
    if args.enable_hierarchical_cache:
        for flag, value in (("--hicache-ratio", args.hicache_ratio), ("--hicache-size", args.hicache_size)):
            if value is not None and not 0 < value <= 1 << 20:
                raise ConfigError(f"{flag}: must be a positive number, got {value}")
        size = int(args.hicache_size * 1e9) if args.hicache_size else None
        return KVOffload("hicache", size_bytes=size, ratio=args.hicache_ratio)
    if args.hicache_ratio is not None or args.hicache_size is not None:
        raise ConfigError("--hicache-ratio / --hicache-size: add --enable-hierarchical-cache")
    return None


def _transfer_config(text: str) -> KVOffload:
    from vramlab.capacity.settings import KVOffload

    example = '\'{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {...}}\''
    config = _json("--kv-transfer-config", text, example)
    connector = config.get("kv_connector")
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config: kv_connector_extra_config must be an object")
    if connector == "OffloadingConnector":
        size = extra.get("cpu_bytes_to_use")
        blocks = extra.get("num_cpu_blocks")
        for key, value in (("cpu_bytes_to_use", size), ("num_cpu_blocks", blocks)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ConfigError(f"--kv-transfer-config: {key} must be a positive number, got {value!r}")
        return KVOffload(
            "native",
            size_bytes=int(size) if size else None,
            num_cpu_blocks=int(blocks) if blocks else None,
            transfer_config=True,
        )
    if connector == "LMCacheConnectorV1":
        gib = extra.get("lmcache.max_local_cpu_size")
        if gib is not None and (isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0):
            raise ConfigError(
                f"--kv-transfer-config: lmcache.max_local_cpu_size must be positive, got {gib!r}"
            )
        return KVOffload("lmcache", size_bytes=int(gib * (1 << 30)) if gib else None, transfer_config=True)
    raise ConfigError(
        f"--kv-transfer-config: kv_connector {connector!r} is not a host KV tier vramlab plans "
        "(OffloadingConnector, LMCacheConnectorV1)"
    )


def host_memory(args: argparse.Namespace) -> int | None:
    if args.host_memory_gib is None:
        return None
    if not 0 < args.host_memory_gib <= 1 << 24:
        raise ConfigError(f"--host-memory-gib: a positive number of GiB, got {args.host_memory_gib}")
    return int(args.host_memory_gib * (1 << 30))


def with_draft(
    settings: EngineSettings, spec: Speculative | None, draft: str | None, offline: bool
) -> EngineSettings:
    """The settings with the draft's facts resolved like --model (catalog, Hub, directory, config.json, .gguf)."""
    if spec is None:
        return settings
    if draft is None:
        return settings.with_(speculative=spec)
    from dataclasses import replace

    from vramlab.sources import resolve_model

    return settings.with_(speculative=replace(spec, draft=resolve_model(draft, offline=offline)))


def check_comparison(args: argparse.Namespace, axes: list[Any]) -> list[Any]:
    """The sweep's axes, once --vs-engine-version is known not to be given with them."""
    if args.vs_engine_version and axes:
        raise ConfigError(
            "--vs-engine-version compares two releases; in a grid use --sweep engine-version=A,B"
        )
    return axes


def run_comparison(
    args: argparse.Namespace,
    model: ModelSpec,
    gpu: GPU,
    settings: EngineSettings,
    constants: Constants | None,
) -> int:
    """`--vs-engine-version B`: the plan at --engine-version (or the default release) and at B, compared."""
    from vramlab.capacity.regression import compare
    from vramlab.capacity.validation import check_settings
    from vramlab.report.plan_compare_text import render_comparison

    check_settings(settings.with_(engine_version=args.vs_engine_version))
    result = compare(model, gpu, settings, args.vs_engine_version, constants)
    if args.json:
        print(json.dumps({"model": model.name, "gpu": gpu.name, **result.to_json()}, indent=1))
    else:
        print(render_comparison(result, model.name, gpu.name))
    return 0
