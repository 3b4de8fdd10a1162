"""Target control: how a drill starts, stops, restarts, checks and reads the logs of what it breaks.

A target is declared in the plan. `kind` picks a ready-made set of command templates (systemd,
docker, kubectl, and `ollama`: Ollama's own systemd unit, its loads and unloads on the timeline), a plain `command` set written by the user, a local `process` the drill spawns
itself (`vllm`: a vLLM API server, stopped by its whole process group, its leftovers cleaned), or the
rehearsal server `sim`. Every command runs with a timeout; a command that
overruns is killed with its whole process group.

Safety: a drill breaks things on purpose, so it only acts on a target declared
`environment: test` unless the operator passes the loudly named override flag.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vramlab.engines import ENGINES
from vramlab.errors import ConfigError, VramlabError
from vramlab.plandoc import SimSettings, metrics_endpoint

OVERRIDE_FLAG = "--i-understand-this-is-not-a-test-environment"

TargetKind = Literal["sim", "process", "vllm", "command", "systemd", "docker", "kubectl", "ollama"]
ACTIONS = ("start", "stop", "restart", "status", "logs")
SPAWNED_KINDS = ("sim", "process", "vllm")  # targets the drill starts, supervises and stops itself

# Ready-made forms. Placeholders are filled from the target's fields, each value shell-quoted.
# {since_epoch} / {since_s} are the start of the log window.
FORMS: dict[str, dict[str, str]] = {
    "systemd": {
        "start": "systemctl start {unit}",
        "stop": "systemctl stop {unit}",
        "restart": "systemctl restart {unit}",
        "status": "systemctl is-active --quiet {unit}",
        "logs": "journalctl -u {unit} --since @{since_epoch} --no-pager -o cat",
    },
    "docker": {
        "start": "docker start {container}",
        "stop": "docker stop -t 30 {container}",
        "restart": "docker restart {container}",
        "status": "test \"$(docker inspect -f '{{{{.State.Running}}}}' {container})\" = true",
        "logs": "docker logs --since {since_epoch} {container}",
    },
    "kubectl": {
        "start": "kubectl -n {namespace} scale {resource} --replicas={replicas}",
        "stop": "kubectl -n {namespace} scale {resource} --replicas=0",
        "restart": "kubectl -n {namespace} rollout restart {resource}",
        "status": "kubectl -n {namespace} rollout status {resource} --timeout=2s",
        "logs": "kubectl -n {namespace} logs {resource} --since={since_s}s --all-containers",
    },
}


# `ollama`: the systemd unit Ollama's Linux install creates (`ollama`), at Ollama's default address,
# with its model loads and unloads sampled from /api/ps (observe/ollama.py).
FORMS["ollama"] = dict(FORMS["systemd"])
OLLAMA_DEFAULTS = {
    "unit": "ollama",
    "base_url": f"http://127.0.0.1:{ENGINES['ollama'].default_port}",
    "engine": "ollama",
    "health_path": "/",
}


def http_url(v: str) -> str:
    """*v* if it is an http(s) URL with a host and a numeric port (if any); ValueError saying what is
    wrong otherwise. A literal "{port}" (a command's placeholder) or any other port that is not a
    number is refused by name here, not a ValueError deep in the client (exit 70)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(v)
    except ValueError:  # an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {v!r}")
    try:
        parts.port  # noqa: B018  (urlsplit checks the port only when asked)
    except ValueError:
        raise ValueError(
            f'the port of {v!r} is not a number from 0 to 65535 ("{{port}}" is filled in the command, not in the URL)'
        ) from None
    return v


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    kind: TargetKind = "sim"
    environment: str = Field(
        "unset", description="must be 'test' for a drill to act on it without the override flag"
    )
    engine: str = "vllm"
    base_url: str | None = None  # OpenAI-compatible root, e.g. http://127.0.0.1:8000
    model: str | None = None  # served model name sent in requests
    api: Literal["openai-completions", "openai-chat"] = (
        "openai-completions"  # chat for servers without /v1/completions
    )
    health_path: str = "/health"  # tried first; then /health, /v1/models, / (observe/health.py)
    metrics_url: str | None = None  # a URL, or a path on the target's root (default /metrics)
    api_key_env: str | None = None  # the NAME of an env var; the key itself never enters a plan

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else http_url(v)

    sim: SimSettings | None = None
    command: str | None = None  # process: the command line to spawn
    log_file: str | None = None  # process/command: where the target's log is
    unit: str | None = None  # systemd
    container: str | None = None  # docker
    resource: str | None = None  # kubectl, e.g. deployment/vllm
    namespace: str = "default"
    replicas: int = Field(1, ge=1)
    commands: dict[str, str] = Field(default_factory=dict)  # overrides per action
    timeout_s: float = Field(60.0, gt=0)
    timeouts_s: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _ollama_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "ollama":
            return {**OLLAMA_DEFAULTS, **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> TargetSpec:
        bad = sorted(set(self.commands) - set(ACTIONS))
        if bad:
            raise ValueError(f"target.commands: unknown action(s) {bad}; use {list(ACTIONS)}")
        need = {
            "systemd": "unit",
            "docker": "container",
            "kubectl": "resource",
            "process": "command",
            "vllm": "command",
        }
        field = need.get(self.kind)
        if field and not getattr(self, field):
            raise ValueError(f"target kind {self.kind} needs target.{field}")
        if (
            self.kind in ("process", "vllm", "command", "systemd", "docker", "kubectl", "ollama")
            and not self.base_url
        ):
            raise ValueError(f"target kind {self.kind} needs target.base_url (the endpoint to load)")
        return self

    def metrics_endpoint(self, root: str) -> str:
        """The Prometheus text endpoint for the target at *root* (which may move across restarts)."""
        return metrics_endpoint(self.metrics_url, root)

    def templates(self) -> dict[str, str]:
        return {**FORMS.get(self.kind, {}), **self.commands}

    def timeout_for(self, action: str) -> float:
        return float(self.timeouts_s.get(action, self.timeout_s))

    def public(self) -> dict[str, Any]:
        """What may be stored and reported (never a key; only the env var's name)."""
        return self.model_dump(exclude_none=True)


def check_environment(spec: TargetSpec, override: bool) -> str | None:
    """Refuse a target that is not declared a test environment. Returns a warning line when the
    override was used, so the run's notes and report carry it."""
    if spec.environment == "test":
        return None
    if not override:
        raise VramlabError(
            f"target environment is {spec.environment!r}, not 'test': a drill breaks its target on purpose; "
            f"mark it `environment: test` or pass {OVERRIDE_FLAG}"
        )
    return f"drill ran against a target declared environment {spec.environment!r} ({OVERRIDE_FLAG})"


class TargetCommandError(VramlabError):
    """A control command failed or overran its timeout."""


@dataclass(frozen=True)
class CommandResult:
    action: str
    command: str
    exit_code: int
    output: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def render(template: str, values: dict[str, Any]) -> str:
    """Fill a template; every value is shell-quoted so a name cannot inject a command."""
    quoted = {k: shlex.quote(str(v)) for k, v in values.items() if v is not None}
    try:
        return template.format(**quoted)
    except KeyError as exc:
        raise ConfigError(
            f"command template {template!r} uses {{{exc.args[0]}}}, which the target does not set"
        ) from None


def run_command(command: str, timeout_s: float, action: str = "command") -> CommandResult:
    """Run one shell command with a hard timeout; on overrun the whole process group is killed."""
    t = time.monotonic()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own group, so a timeout kills grandchildren too
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise TargetCommandError(
            f"target {action} command overran its {timeout_s:g} s timeout: {command}"
        ) from None
    return CommandResult(
        action, command, proc.returncode, out.decode(errors="replace")[-4000:], time.monotonic() - t
    )


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class TargetStatus:
    running: bool
    detail: str = ""
    exit_code: int | None = None
    oom_killed: bool | None = None  # the kernel OOM killer's counter rose since the start (None: unknown)


class Target(Protocol):
    """What the drill needs from a target. `url` may change across restarts."""

    spec: TargetSpec

    @property
    def url(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self) -> None: ...
    def status(self) -> TargetStatus: ...
    def logs(self, since_epoch: float) -> list[str]: ...
    def close(self) -> None: ...


class CommandTarget:
    """systemd / docker / kubectl / user-written command templates."""

    def __init__(self, spec: TargetSpec):
        self.spec = spec
        self.history: list[CommandResult] = []
        self._log_offset = 0

    @property
    def url(self) -> str:
        assert self.spec.base_url
        return self.spec.base_url

    def _values(self, since_epoch: float | None = None) -> dict[str, Any]:
        values = self.spec.model_dump(exclude={"commands", "timeouts_s", "sim"})
        since = since_epoch if since_epoch is not None else time.time() - 60
        values.update(since_epoch=int(since), since_s=max(1, int(time.time() - since)))
        return values

    def _run(self, action: str, since_epoch: float | None = None, check: bool = True) -> CommandResult | None:
        template = self.spec.templates().get(action)
        if not template:
            if check:
                raise ConfigError(
                    f"target kind {self.spec.kind} has no {action} command; add target.commands.{action}"
                )
            return None
        res = run_command(render(template, self._values(since_epoch)), self.spec.timeout_for(action), action)
        self.history.append(res)
        if check and not res.ok and action != "status":
            raise TargetCommandError(
                f"target {action} failed (exit {res.exit_code}): {res.output.strip()[-200:]}"
            )
        return res

    def start(self) -> None:
        self._run("start")

    def stop(self) -> None:
        self._run("stop")

    def restart(self) -> None:
        if "restart" in self.spec.templates():
            self._run("restart")
        else:
            self._run("stop", check=False)
            self._run("start")

    def status(self) -> TargetStatus:
        res = self._run("status", check=False)
        if res is None:
            return TargetStatus(True, "no status command; assumed running")
        return TargetStatus(res.ok, res.output.strip()[-200:], None if res.ok else res.exit_code)

    def logs(self, since_epoch: float) -> list[str]:
        if self.spec.log_file:
            return _read_new_lines(self, self.spec.log_file)
        res = self._run("logs", since_epoch=since_epoch, check=False)
        return res.output.splitlines() if res and res.ok else []

    def close(self) -> None:
        pass


def _read_new_lines(holder: Any, path: str) -> list[str]:
    """Lines appended to *path* since the last call (the offset lives on *holder*), at most 8 MiB a
    call; a log_file that is not a regular file (a FIFO, /dev/zero) gives nothing, never a hang."""
    from vramlab.errors import ConfigError
    from vramlab.infile import open_input

    try:
        with open_input(path, "target log") as fh:
            fh.seek(holder._log_offset)
            data = fh.read(8 << 20)
    except (OSError, ConfigError):
        return []
    end = data.rfind(b"\n") + 1  # keep a half-written line for next time
    holder._log_offset += end
    return data[:end].decode(errors="replace").splitlines()


__all__ = [
    "ACTIONS",
    "FORMS",
    "OVERRIDE_FLAG",
    "SPAWNED_KINDS",
    "CommandResult",
    "CommandTarget",
    "Target",
    "TargetCommandError",
    "TargetKind",
    "TargetSpec",
    "TargetStatus",
    "check_environment",
    "render",
    "run_command",
]
