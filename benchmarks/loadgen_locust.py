"""Locust side of benchmarks/loadgen.py (run by it through the locust CLI, headless).

RateUser: FastHttpUser, no think time (the rate run). HoldUser + ProbeUser: the overhead run,
HoldUser keeps a stream open against the hold endpoint, ProbeUser paces requests against the
endpoint that answers at once. A side greenlet resets the stats after WARMUP_S, reads them
MEASURE_S later, writes RESULT_JSON and quits, so the run stops by itself.
"""

from __future__ import annotations

import json
import os
import random
import time

import gevent
from locust import FastHttpUser, constant, constant_pacing, events, task

WARMUP = float(os.environ.get("WARMUP_S", "3"))
MEASURE = float(os.environ.get("MEASURE_S", "10"))
STREAMS = int(os.environ.get("STREAMS", "500"))
PROBE_USERS = int(os.environ.get("PROBE_USERS", "50"))
PROBE_RATE = float(os.environ.get("PROBE_RATE", "500"))
CHAT = "/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "bench",
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}],
    }
)
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


class RateUser(FastHttpUser):
    host = os.environ.get("BASE_URL")
    wait_time = constant(0)

    @task
    def post(self) -> None:
        self.client.post(CHAT, data=BODY, headers=HEADERS, name="rate")


class HoldUser(FastHttpUser):
    fixed_count = STREAMS
    host = os.environ.get("HOLD_URL")
    wait_time = constant(0)
    network_timeout = 120.0
    connection_timeout = 120.0

    def on_start(self) -> None:
        gevent.sleep(random.uniform(0, float(os.environ.get("HOLD_S", "1"))))  # out of step

    @task
    def post(self) -> None:
        self.client.post(CHAT, data=BODY, headers=HEADERS, name="hold")


class ProbeUser(FastHttpUser):
    fixed_count = PROBE_USERS
    host = os.environ.get("BASE_URL")
    wait_time = constant_pacing(PROBE_USERS / PROBE_RATE)

    @task
    def post(self) -> None:
        self.client.post(CHAT, data=BODY, headers=HEADERS, name="probe")


def _cpu() -> tuple[float, float]:
    t = os.times()
    return time.perf_counter(), t.user + t.system


@events.test_start.add_listener
def _window(environment, **_kw):  # type: ignore[no-untyped-def]
    def run() -> None:
        name = os.environ.get("MEASURE_NAME", "rate")
        gevent.sleep(WARMUP + (2 * float(os.environ.get("HOLD_S", "1")) if name == "probe" else 0))
        environment.runner.stats.reset_all()
        a = _cpu()
        gevent.sleep(MEASURE)
        b = _cpu()
        stats = environment.runner.stats
        e = stats.get(name, "POST")
        wall = b[0] - a[0]
        res = {
            "ok": e.num_requests - e.num_failures,
            "errors": e.num_failures,
            "rps": round(e.num_requests / wall, 1),
            "p50_ms": e.get_response_time_percentile(0.50),
            "p99_ms": e.get_response_time_percentile(0.99),
            "held_ok": stats.get("hold", "POST").num_requests if name == "probe" else None,
            "window_s": round(wall, 3),
            "client_cpu_s": round(b[1] - a[1], 3),
            "client_cpu_pct": round(100 * (b[1] - a[1]) / wall, 1),
            "loop": "gevent",
        }
        with open(os.environ["RESULT_JSON"], "w") as f:
            json.dump(res, f)
        environment.runner.quit()

    gevent.spawn(run)
