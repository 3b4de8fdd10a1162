"""Start an experiment plan, as ``vramlab run`` and the demo do: the checks before anything is
stored (production, the API key, a target that answers), the run's own sim when `target.sim` asks
for one, then the experiment in the one session (run/session.py: store writer, signals, capacity
plan, exit policy).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vramlab.errors import ConfigError
from vramlab.experiment.kind import ExperimentKind, RunOptions
from vramlab.experiment.plan import Plan, load_plan
from vramlab.records.store import Store
from vramlab.run.events import Handler
from vramlab.run.session import Card, SessionResult, own_sim, run_session


def api_key_for(plan: Plan) -> str | None:
    name = plan.target.api_key_env
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"target.api_key_env: the environment variable {name} is not set")
    from vramlab.redact import register

    register(value)  # masked wherever a server or a message echoes it (vramlab.redact)
    return value


def check_target(plan: Plan, allow_production: bool) -> None:
    if plan.target.environment == "production" and not allow_production:
        raise ConfigError(
            "target.environment is production: refusing to load it; pass "
            "--i-understand-this-is-production to run anyway"
        )


def check_reachable(plan: Plan, timeout_s: float = 5.0) -> None:
    """Refuse (ConfigError: one line, exit 2) before anything is stored when nothing answers at the
    target's address. Any HTTP answer counts as reachable (a 401 or 404 is the endpoint's to give)."""
    import http.client
    import urllib.error
    import urllib.parse
    import urllib.request

    from vramlab.experiment.wiring import _root

    tg = plan.target
    parts = urllib.parse.urlsplit(tg.health_url or _root(tg.url) + "/health")
    # urllib would take user:password@ for part of the host name; any answer (a 401 too) will do here.
    url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout_s):
            return
    except (urllib.error.HTTPError, http.client.HTTPException):
        return  # it answered HTTP (an error, over 100 headers, a bad status line): the samplers say more
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        hint = (
            "start the server first, or give target: {kind: sim, sim: {gpu: ...}} to let vramlab start a "
            "rehearsal server"
            if tg.sim is None
            else "the run's own sim stopped answering"
        )
        raise ConfigError(
            f"target {tg.url} is not reachable ({getattr(why, 'strerror', None) or why}); nothing "
            f"was stored; {hint}"
        ) from None


def run_plan(
    plan: Plan,
    *,
    plan_dir: Path,
    open_store: Callable[[], Store],
    rounds: int | None = None,
    allow_production: bool = False,
    subscribers: Sequence[Handler] = (),
    options: RunOptions | None = None,
    card: Card | None = None,
) -> SessionResult:
    """Run *plan* into the store *open_store* opens (after the checks: a refused plan, or one whose
    target does not answer, touches no store); the store is closed when the run ends. The caller
    picks the store (`vramlab run`: `vramlab.store.open_store(--db)`), so this package depends on
    the `Store` port only. A plan with `target.sim` and no base_url gets its own rehearsal server
    for the run (run/session.py's ``own_sim``)."""
    check_target(plan, allow_production)
    opts = options or RunOptions()
    opts.api_key = api_key_for(plan)
    opts.rounds = rounds if rounds is not None else opts.rounds
    opts.base_dir = plan_dir
    if opts.rounds is not None and opts.rounds < 1:
        raise ConfigError("--rounds must be at least 1")
    if plan.target.sim is None or plan.target.base_url is not None:
        check_reachable(plan)
        return _run_checked(plan, open_store, opts, subscribers, card)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vramlab-run-sim-") as tmp, own_sim(plan.target.sim, tmp) as sim:
        own = with_sim(plan, sim.url, sim.pid, str(sim.log_path), tmp)
        check_reachable(own)
        return _run_checked(own, open_store, opts, subscribers, card)


def with_sim(plan: Plan, url: str, pid: int, log_file: str, workdir: str) -> Plan:
    """*plan* pointed at the sim started for it: its URL, pid, log and ledger filled in."""
    ledger = str(Path(workdir) / "sim-gpu0.ledger")
    doc = plan.model_dump(mode="json")
    doc["target"].update(base_url=url + "/v1", pid=pid, metrics_url=None, health_url=None, log_file=log_file)
    doc["samplers"]["ledger"] = doc["samplers"].get("ledger") or ledger
    return Plan.model_validate(doc).with_notes_of(plan)


def _run_checked(
    plan: Plan,
    open_store: Callable[[], Store],
    options: RunOptions,
    subscribers: Sequence[Handler],
    card: Card | None,
) -> SessionResult:
    store = open_store()
    try:
        return run_session(ExperimentKind(plan, options), store, subscribers=subscribers, card=card)
    finally:
        store.close()


def run_plan_file(path: str | Path, phase_s: float | None = None, **kw: Any) -> SessionResult:
    plan = load_plan(path)
    if phase_s is not None:
        import math

        if not math.isfinite(phase_s) or phase_s <= 0:
            raise ConfigError(f"--phase-s must be a positive number of seconds, got {phase_s}")
        doc = plan.model_dump(mode="json")
        doc["phases"]["duration_s"] = phase_s
        doc["phases"].pop("requests", None)
        doc["phases"]["drain_s"] = min(doc["phases"]["drain_s"], phase_s)
        from vramlab.planfile import validate

        plan = validate(Plan, doc, f"{path} with --phase-s {phase_s:g}").with_notes_of(
            plan
        )  # an error is one line
    return run_plan(plan, plan_dir=Path(path).resolve().parent, **kw)
