"""Two servers of one engine writing one file at once, with no shipper's prefix to tell them apart.

`vllm serve A >> server.log &` and `vllm serve B >> server.log &` interleave two start-ups line by
line; read as one log, the second's banner opens a start-up in the middle of the first's and the
figures of both are shared out among three start-ups. vLLM V1 names the process of every line
(`(APIServer pid=2801)`, `(EngineCore_DP0 pid=2950)`, `(VllmWorker rank=1 pid=3011)`): an API
server is a server, and each of the other processes belongs to one of them:

1. the servers whose facts agree with the process's are the candidates, when any agree: the model
   it names (its engine config line, `Starting to load model X`), its version, the length it serves
   (`'max_model_len': 8192` in the arguments, `max_seq_len=8192` in the engine config,
   `Maximum concurrency for 8,192 tokens`);
2. of those, the first started before the process that has no process of that role yet
   (`EngineCore_DP0`, `VllmWorker rank=1`): two servers started side by side get one engine each;
3. else the one started last before it.

A line without a process prefix stays with the process before it. Only API servers whose lines
overlap are split: one after another is a restart, which logs/base.py reads as a second start-up.

Pure: lines in, streams out (logs/split.py `Stream`, with the file's line numbers).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from vramlab.logs.base import strip_outer
from vramlab.logs.split import Stream

_PROC = re.compile(r"^\s*\((?P<role>[A-Za-z_][\w-]*)(?P<args>[^()]*?)\bpid=(?P<pid>\d+)[^()]*\)")
_MORE = re.compile(r"^\s*\((?P<role>[A-Za-z_][\w-]*)(?P<args>[^()]*)\)")
_FACTS = {
    "model": re.compile(r"""(?:['"]model['"]\s*:\s*|\bmodel=|Starting to load model )['"]?([^'",\s]+)"""),
    "version": re.compile(r"(?:vLLM API server version |LLM engine \(v)v?([\w.+-]+?)\)?(?:\s|$)"),
    "max_len": re.compile(
        r"""(?:['"]max_model_len['"]\s*:\s*|\bmax_seq_len=|Maximum concurrency for |Using max model len )([\d,]+)"""
    ),
}
MAX_SERVERS = 64  # more API servers than this writing one file is no pair started side by side
_RANK = re.compile(r"\brank=(\d+)|\bTP(\d+)\b|_TP(\d+)\b|_DP(\d+)\b")


@dataclass
class _Process:
    pid: str
    role: str  # its role and rank: 'APIServer', 'EngineCore#0', 'VllmWorker#1'
    first: int
    last: int
    facts: dict[str, str] = field(default_factory=dict)  # model, version, max_len, as first printed
    server: int = -1  # index into the servers, once assigned


def _process(line: str) -> tuple[str, str, dict[str, str]] | None:
    """(pid, role, facts the line names) of a line a vLLM process printed."""
    if "pid=" not in line:
        return None
    text = strip_outer(line)
    m = _PROC.match(text)
    if not m:
        return None
    prefix, rest = m.group(0), text[m.end() :]
    more = _MORE.match(rest)  # a nested prefix: (Worker pid=1) (Worker_TP0 pid=1)
    if more:
        prefix += more.group(0)
    role = m.group("role").split("_", 1)[0]
    rank = _RANK.search(prefix)
    number = next((g for g in rank.groups() if g is not None), "0") if rank else "0"
    facts = {}
    for key, pattern in _FACTS.items():
        found = pattern.search(rest)
        if found:
            facts[key] = found.group(1).replace(",", "")
    return m.group("pid"), role if role == "APIServer" else f"{role}#{number}", facts


def split_servers(lines: Sequence[str]) -> list[Stream] | None:
    """A stream per vLLM server when two or more API servers wrote at once; None otherwise."""
    procs: dict[str, _Process] = {}
    owner: list[str | None] = []  # the process of each line (None: no prefix)
    for i, line in enumerate(lines):
        got = _process(line) if line else None
        if got is None:
            owner.append(None)
            continue
        pid, role, facts = got
        p = procs.get(pid)
        if p is None:
            p = procs[pid] = _Process(pid, role, i, i)
        p.last = i
        for key, value in facts.items():
            p.facts.setdefault(key, value)
        owner.append(pid)
    servers = sorted((p for p in procs.values() if p.role == "APIServer"), key=lambda p: p.first)
    if not 2 <= len(servers) <= MAX_SERVERS:
        return None
    for s, p in enumerate(servers):
        p.server = s
    taken: set[tuple[int, str]] = set()  # (server, role) pairs already given a process
    for p in sorted(procs.values(), key=lambda p: p.first):
        if p.server < 0:
            p.server = _server_of(p, servers, taken)
            taken.add((p.server, p.role))
    spans = [[len(lines), -1] for _ in servers]
    for q in procs.values():
        span = spans[q.server]
        span[0], span[1] = min(span[0], q.first), max(span[1], q.last)
    if not any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)):
        return None  # one server after another: a restart, read as a second start-up
    out: list[list[str]] = [[] for _ in servers]
    numbers = [array("L") for _ in servers]
    cur = 0
    for i, (line, who) in enumerate(zip(lines, owner, strict=True)):
        if who is not None:
            cur = procs[who].server
        out[cur].append(line)
        numbers[cur].append(i + 1)
    return [
        Stream(f"vLLM server {s + 1} (APIServer pid={p.pid})", out[s], numbers[s][0], numbers[s])
        for s, p in enumerate(servers)
        if out[s]
    ]


def _server_of(p: _Process, servers: list[_Process], taken: set[tuple[int, str]]) -> int:
    shared = [s for s in servers if set(s.facts) & set(p.facts)]
    agree = [s for s in shared if all(s.facts.get(k, v) == v for k, v in p.facts.items())]
    pool = agree or servers
    started = [s for s in pool if s.first < p.first] or pool[:1]
    free = [s.server for s in started if (s.server, p.role) not in taken]
    return free[0] if free else started[-1].server


__all__ = ["split_servers"]
