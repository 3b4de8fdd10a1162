"""How many concurrent streams and tokens per second one `vramlab sim serve` process sustains.

    python benchmarks/sim.py --streams 1000 --max-tokens 32 [--speed 1000] [--json]

The sim runs as its own process (pinned to one core with taskset when available, the client
on another), so the numbers are the sim's, not the client's. The roofline is sped up so the
simulated GPU is never the limit: what is measured is the sim's own CPU cost per token. Every
stream must finish with all its tokens; the run stops by itself after one wave of streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

import aiohttp
import psutil

from vramlab.sim.launch import start_sim


async def _wave(url: str, streams: int, max_tokens: int) -> tuple[list[int], float, float]:
    conn = aiohttp.TCPConnector(limit=streams + 10)
    timeout = aiohttp.ClientTimeout(total=600)
    started = asyncio.Event()
    first_token_at: list[float] = []

    async def one(s: aiohttp.ClientSession, i: int) -> int:
        n = 0
        async with s.post(
            url + "/v1/completions",
            json={"prompt": f"stream {i}", "max_tokens": max_tokens, "stream": True, "ignore_eos": True},
        ) as r:
            async for line in r.content:
                if line.startswith(b"data: {") and b'"text": " ' in line:
                    if n == 0:
                        first_token_at.append(time.perf_counter())
                    n += 1
        return n

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        started.set()
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(s, i) for i in range(streams)))
        t1 = time.perf_counter()
    return counts, t1 - t0, (max(first_token_at) - t0) if first_token_at else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--speed", type=float, default=1000.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="vramlab-simbench-")
    plan = os.path.join(tmp, "plan.json")
    from vramlab.sim.testing import make_estimate

    with open(plan, "w") as f:  # a plan, so the benchmark does not depend on the capacity model's numbers
        json.dump(make_estimate(max_num_seqs=max(256, args.streams)).to_json(), f)
    env = {}
    cores = sorted(os.sched_getaffinity(0))
    sim = start_sim(
        ["--plan", plan, "--speed", str(args.speed), "--max-num-seqs", str(max(256, args.streams))],
        device=os.path.join(tmp, "gpu0.ledger"),
        env=env,
    )
    try:
        proc = psutil.Process(sim.pid)
        if len(cores) > 1 and hasattr(proc, "cpu_affinity"):
            proc.cpu_affinity([cores[-1]])  # the sim on one core
            psutil.Process().cpu_affinity(cores[:-1])  # the client on the others
        cpu0 = proc.cpu_times()
        counts, wall_s, last_first_token_s = asyncio.run(_wave(sim.url, args.streams, args.max_tokens))
        cpu1 = proc.cpu_times()
    finally:
        sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    sim_cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    tokens = sum(counts)
    result = {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "speed": args.speed,
        "complete_streams": sum(1 for c in counts if c == args.max_tokens),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 1),
        "sim_cpu_s": round(sim_cpu_s, 3),
        "sim_cpu_util": round(sim_cpu_s / wall_s, 3),
        "sim_cpu_us_per_token": round(1e6 * sim_cpu_s / max(1, tokens), 1),
        "all_streams_started_s": round(last_first_token_s, 3),
        "python": sys.version.split()[0],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")
    return 0 if result["complete_streams"] == args.streams else 1


if __name__ == "__main__":
    raise SystemExit(main())
