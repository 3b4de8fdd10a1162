"""Start `vramlab sim serve` as a child process and wait until it answers, for tests and drills.

A drill needs a target that can really die, be killed and be restarted, so the sim runs in its
own process; `start_sim` waits for the "running on http://..." line in its log (the port is
chosen by the child when port=0) and for `/health` to answer 200.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from vramlab.errors import VramlabError
from vramlab.sim.config import SimConfig

_URL = re.compile(r"(?:running|listening|Listening) on (http://[0-9.]+:\d+)")


class SimStartError(VramlabError):
    """The sim exited (or never answered) before it was ready."""

    def __init__(self, message: str, exit_code: int | None, log_tail: str):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[assignment]
        self.log_tail = log_tail


def config_args(cfg: SimConfig) -> list[str]:
    """The `vramlab sim serve` arguments for a config (estimate overrides cannot cross; use --plan)."""
    out = [
        "--model",
        cfg.model,
        "--gpu",
        cfg.gpu,
        "--engine",
        cfg.engine,
        "--speed",
        str(cfg.speed),
        "--seed",
        str(cfg.seed),
        "--host",
        cfg.host,
        "--watchdog-s",
        str(cfg.watchdog_s),
    ]
    opt = {
        "--engine-version": cfg.engine_version,
        "--gpu-memory-utilization": cfg.gpu_memory_utilization,
        "--max-model-len": cfg.max_model_len,
        "--max-num-seqs": cfg.max_num_seqs,
        "--device": cfg.device,
        "--max-num-batched-tokens": cfg.max_num_batched_tokens,
        "--start-barrier": cfg.start_barrier,
    }
    for flag, value in opt.items():
        if value is not None:
            out += [flag, str(value)]
    for f in cfg.faults:
        out += ["--fault", f"{f.kind}@{f.after_s}:{f.factor}"]
    if cfg.allow_fault_injection:
        out.append("--allow-fault-injection")
    if cfg.tensor_parallel_size != 1:
        out += ["-tp", str(cfg.tensor_parallel_size)]
    return out


@dataclass
class SimProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)
    err_path: Path | None = None  # the process's stderr: why it refused to start (a bad flag, a taken port)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def err_tail(self, nbytes: int = 4096) -> str:
        """The end of what the process wrote on stderr (vramlab's own one-line errors land there)."""
        if self.err_path is None:
            return ""
        try:
            with open(self.err_path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - nbytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.proc.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not go; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_sim(
    args: list[str] | SimConfig,
    port: int = 0,
    device: str | None = None,
    log_path: str | None = None,
    wait_ready: bool = True,
    timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
) -> SimProcess:
    """Run `vramlab sim serve ARGS` in a child process; by default wait until /health answers 200."""
    argv = config_args(args) if isinstance(args, SimConfig) else list(args)
    tmp = None
    if log_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="vramlab-simlog-")
        log_path = str(Path(tmp.name) / "sim.log")
    if device is not None:
        argv += ["--device", device]
    argv += ["--port", str(port), "--log-file", log_path]
    Path(log_path).touch()
    err_path = Path(log_path).with_name(Path(log_path).name + ".stderr")
    cmd = [sys.executable, "-m", "vramlab", "sim", "serve", *argv]
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    sim = SimProcess(proc, Path(log_path), _tmp=tmp, err_path=err_path)
    if wait_ready:
        _wait_ready(sim, timeout_s)
    return sim


def _wait_ready(sim: SimProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = sim.poll()
        if code is not None:  # its stderr last: a refused flag or a taken port says why there
            tail = "\n".join([*sim.log_text().splitlines()[-20:], *sim.err_tail().splitlines()[-5:]])
            raise SimStartError(f"the sim exited with code {code} before it was ready", code, tail)
        if not sim.url:
            m = _URL.search(sim.log_text())
            if m:
                sim.url = m.group(1)
        if sim.url:
            try:
                with urllib.request.urlopen(sim.url + "/health", timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.05)
    sim.kill()
    raise SimStartError(
        f"the sim did not become ready within {timeout_s:g} s",
        None,
        "\n".join(sim.log_text().splitlines()[-20:]),
    )
