"""Rehearsal GPU inference server, simulated card and co-tenant balloon.

  vramlab sim serve --model M --gpu G --engine vllm --max-model-len 8192 --port 8000
  vramlab sim balloon --device gpu0.ledger --gib 30
  vramlab sim status --device gpu0.ledger [--json]

See docs/sim.md for what is simulated and how it maps to the real engines.
"""

from __future__ import annotations

import argparse

from vramlab.engines import sim_engines
from vramlab.units import GIB, gib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", metavar="serve|balloon|status", help="what to run")
    sub.required = True
    s = sub.add_parser("serve", help="serve the OpenAI-compatible API as a simulated engine")
    s.add_argument("--model", default="llama-3.1-8b-instruct", help="catalog model the sim serves")
    s.add_argument(
        "--gpu", default="h100-80gb", help="catalog GPU the simulated card copies (see `vramlab gpus`)"
    )
    s.add_argument(
        "--engine",
        default="vllm",
        choices=sim_engines(),
        help="the engine it imitates: memory policy, metric names, log lines (default vllm)",
    )
    s.add_argument("--engine-version", default=None, help="engine release whose names and texts to use")
    _engine_settings(s)
    s.add_argument("--served-model-name", default=None, help="the model name the API answers to")
    s.add_argument("--plan", default=None, help="serve the Estimate in this `vramlab plan --json` file")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed in the log)")
    s.add_argument(
        "--device", default=None, help="simulated card (ledger file) shared with other sims/balloons"
    )
    s.add_argument("--speed", type=float, default=1.0, help="run simulated GPU time this many times faster")
    s.add_argument("--seed", type=int, default=0, help="seed of the simulated timings and outputs")
    s.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[@AFTER_S][:FACTOR]",
        help="arm a fault: hang, slow, crash, oom (repeatable)",
    )
    s.add_argument(
        "--allow-fault-injection", action="store_true", help="enable POST /sim/fault (loopback only)"
    )
    s.add_argument("--max-concurrent-requests", type=int, default=128, help="TGI: 429 beyond this")
    s.add_argument(
        "--watchdog-s", type=float, default=5.0, help="seconds from engine death to exit (vLLM: 5)"
    )
    s.add_argument(
        "--log-stats-interval-s", type=float, default=5.0, help="seconds between the engine's stats lines"
    )
    s.add_argument("--log-file", default=None, help="also write the engine log here")
    s.add_argument(
        "--start-barrier",
        default=None,
        metavar="FILE:N",
        help="rehearsal: N sims started at once meet before and after their memory snapshot",
    )
    b = sub.add_parser("balloon", help="hold memory on a simulated card like a co-tenant process")
    b.add_argument("--device", required=True, help="the simulated card's ledger file")
    b.add_argument("--gpu", default=None, help="card to create the ledger with, if it does not exist")
    size = b.add_mutually_exclusive_group(required=True)
    size.add_argument("--gib", type=float, help="GiB (2^30 bytes) to take")
    size.add_argument("--leave-gib", type=float, help="take all free memory but this many GiB")
    b.add_argument(
        "--hold-s", type=float, default=None, help="release after this many seconds (default: Ctrl-C)"
    )
    st = sub.add_parser("status", help="nvidia-smi-like view of a simulated card")
    st.add_argument("--device", required=True, help="the simulated card's ledger file")
    st.add_argument("--json", action="store_true", help="print one JSON object")


def _engine_settings(s: argparse.ArgumentParser) -> None:
    """The engine settings the sim sizes its memory with: vLLM's names, and SGLang's own for the same settings
    (an SGLang sim takes SGLang's flags)."""
    s.add_argument(
        "--gpu-memory-utilization",
        "--mem-fraction-static",
        dest="gpu_memory_utilization",
        type=float,
        default=None,
        help="vLLM --gpu-memory-utilization / SGLang --mem-fraction-static",
    )
    s.add_argument(
        "--max-model-len",
        "--context-length",
        dest="max_model_len",
        type=int,
        default=None,
        help="vLLM --max-model-len / SGLang --context-length",
    )
    s.add_argument(
        "--max-num-seqs",
        "--max-running-requests",
        dest="max_num_seqs",
        type=int,
        default=None,
        help="vLLM --max-num-seqs / SGLang --max-running-requests",
    )
    s.add_argument(
        "--max-num-batched-tokens",
        "--chunked-prefill-size",
        dest="max_num_batched_tokens",
        type=int,
        default=None,
        help="vLLM --max-num-batched-tokens / SGLang --chunked-prefill-size: the largest prefill step",
    )
    s.add_argument("--kv-cache-dtype", default="auto", help="KV cache dtype (default auto)")
    s.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's flag: prefix caching on/off (default: the engine's own: on in vLLM 0.8+, SGLang, TGI 3)",
    )
    s.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="SGLang's flag: no prefix caching",
    )
    s.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="vLLM's flag: usage.prompt_tokens_details.cached_tokens in every answer",
    )
    s.add_argument("-tp", "--tensor-parallel-size", "--tp-size", type=int, default=1, help="GPUs (default 1)")


def run(args: argparse.Namespace) -> int:
    return {"serve": _serve, "balloon": _balloon, "status": _status}[args.sim_command](args)


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from vramlab.errors import ConfigError
    from vramlab.sim.config import Fault, SimConfig, estimate_from_json
    from vramlab.sim.serve import serve_forever

    est = None
    if args.log_file:
        from vramlab.cli.outputs import check_writable

        check_writable(args.log_file, "engine log")  # before the server starts
    if args.plan:
        from vramlab.infile import read_text

        text = read_text(args.plan, "plan JSON", expect="expected `vramlab plan --json` output")
        try:
            est = estimate_from_json(json.loads(text))
        except (ValueError, RecursionError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(
                f"{args.plan}: not the JSON of `vramlab plan --json` ({type(exc).__name__})"
            ) from None
    if args.start_barrier:
        from vramlab.sim.barrier import StartBarrier

        try:
            StartBarrier.parse(args.start_barrier)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    cfg = SimConfig(
        model=args.model,
        gpu=args.gpu,
        engine=args.engine,
        engine_version=args.engine_version,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        host=args.host,
        port=args.port,
        device=args.device,
        speed=args.speed,
        seed=args.seed,
        faults=tuple(Fault.parse(f) for f in args.fault),
        allow_fault_injection=args.allow_fault_injection,
        log_file=args.log_file,
        max_concurrent_requests=args.max_concurrent_requests,
        served_model_name=args.served_model_name,
        watchdog_s=args.watchdog_s,
        log_stats_interval_s=args.log_stats_interval_s,
        estimate=est,
        start_barrier=args.start_barrier,
        prefix_caching=False if args.disable_radix_cache else args.enable_prefix_caching,
        prompt_tokens_details=args.enable_prompt_tokens_details,
    )
    return asyncio.run(serve_forever(cfg))


def _balloon(args: argparse.Namespace) -> int:
    from vramlab.sim.balloon import hold

    return hold(args.device, gib=args.gib, leave_gib=args.leave_gib, hold_s=args.hold_s, gpu=args.gpu)


def _status(args: argparse.Namespace) -> int:
    import json

    from vramlab.sim.balloon import device_status

    status = device_status(args.device)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"{status['name']}   {gib(status['used_bytes'], unit=True)} / {gib(status['total_bytes'], unit=True)} used "
        f"({gib(status['free_bytes'], unit=True)} free)"
    )
    print(f"{'PID':>8}  {'PROCESS':<24} {'USED GiB':>9}  BREAKDOWN (GiB)")
    for p in status["processes"]:
        parts = ", ".join(f"{k} {gib(v)}" for k, v in p["by_kind"].items())
        print(f"{p['pid']:>8}  {p['name']:<24} {p['used_bytes'] / GIB:>9.2f}  {parts}")
    if not status["processes"]:
        print("          no processes")
    return 0
