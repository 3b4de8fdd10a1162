"""The loopback endpoints both load benchmarks measure against (loadgen.py, tokens.py): nginx with one
worker, keep-alive without limit, every temp path in the run's own folder, the echo module for
streams with a known schedule (each benchmark writes only its `location` blocks); else vramlab's
stub in its own pinned process. Starting, waiting for the first answer and stopping are here once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")


def find_nginx() -> str | None:
    """nginx with its echo module (Debian: nginx-light + libnginx-mod-http-echo), else None."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    return nginx if nginx and ECHO_MODULE.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """`cmd` under taskset on `cpus` where taskset exists."""
    if not cpus or not shutil.which("taskset"):
        return cmd
    return ["taskset", "-c", ",".join(map(str, cpus))] + cmd


def start(
    nginx: str, folder: Path, locations: str, *, connections: int, cpus: list[int] | None
) -> tuple[subprocess.Popen[Any], str, str]:
    """Start nginx serving `locations` on a free loopback port: (process, URL, version)."""
    port = free_port()
    (folder / "tmp").mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = folder / "nginx.conf"
    conf.write_text(f"""load_module {ECHO_MODULE};
{user}daemon off;
worker_processes 1;
worker_rlimit_nofile {max(connections * 4, 4096)};
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {folder}/tmp/body;
    proxy_temp_path {folder}/tmp/proxy;
    fastcgi_temp_path {folder}/tmp/fastcgi;
    uwsgi_temp_path {folder}/tmp/uwsgi;
    scgi_temp_path {folder}/tmp/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 75s;
    tcp_nodelay on;
    server {{
        listen 127.0.0.1:{port} backlog={connections};
{locations}
    }}
}}
""")
    out = subprocess.run([nginx, "-v"], capture_output=True, text=True)
    version = (out.stderr or out.stdout).strip().split(":")[-1].strip()
    proc = subprocess.Popen(
        pinned([nginx, "-c", str(conf), "-p", str(folder)], cpus),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}", version


def start_stub(code: str, cpus: list[int] | None) -> tuple[subprocess.Popen[Any], Any]:
    """Run `code` (a stub endpoint that prints its URL(s) as one JSON line) in its own pinned process:
    (process, what it printed)."""
    proc = subprocess.Popen(
        pinned([sys.executable, "-c", code], cpus),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def wait_up(url: str, proc: subprocess.Popen[Any] | None, what: str, timeout_s: float = 10.0) -> None:
    """Until one streamed completion comes back whole ([DONE]); SystemExit with the endpoint's stderr
    when its process dies or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            req = urllib.request.Request(url + "/v1/chat/completions", data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                if b"[DONE]" in r.read():
                    return
        except OSError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                err = proc.stderr.read() if proc and proc.stderr else ""
                raise SystemExit(f"{what} endpoint did not come up: {err!r}") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen[Any] | None) -> None:
    """SIGTERM our own endpoint process (an nginx master's worker follows it), SIGKILL if it lingers."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
