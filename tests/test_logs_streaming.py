"""Reading a log costs bounded time and memory: /dev/zero, a pipe that never ends, a pasted
megabyte-long line. Bounds are generous (a loaded 2-core machine); what is asserted is that
the command finishes and says what it left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vramlab.logs.detect import parse_log, read_log

LOGS = Path(__file__).parent / "fixtures" / "logs"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "vramlab", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_refused_and_piped_in_is_read_up_to_the_cap():
    r = cli("check-log", "/dev/zero", "--max-bytes", "8000000")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "character device" in r.stderr
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with open("/dev/zero", "rb") as zero:
        r = subprocess.run(
            [sys.executable, "-m", "vramlab", "check-log", "-", "--max-bytes", "8000000"],
            stdin=zero,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    # the cap is named: "no line of a known engine found" alone would hide that most was not read
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no line of a known engine" in r.stderr and "8,000,000 bytes" in r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_nobody_writes_to_ends_in_one_line(tmp_path):
    fifo = tmp_path / "nobody.log"
    os.mkfifo(fifo)
    env = dict(os.environ, HF_HUB_OFFLINE="1", VRAMLAB_PIPE_WAIT_S="1")
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "check-log", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "had no writer for 1 s" in r.stderr, r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_an_endless_pipe_is_read_up_to_the_cap(tmp_path):
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)
    head = (LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8")
    filler = "(APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:1] Engine 000: Running: 1 reqs\n" * 1000
    written = {"bytes": 0}

    def writer() -> None:
        try:
            with open(fifo, "w", encoding="utf-8") as fh:
                fh.write(head)
                while written["bytes"] < 50_000_000:  # a safety stop if the reader never stops
                    fh.write(filler)
                    written["bytes"] += len(filler)
        except (BrokenPipeError, OSError):
            pass  # the reader stopped at its cap: that is the point

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    r = cli("check-log", str(fifo), "--max-bytes", "2000000", "--json")
    t.join(timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["observations"] and out["observations"][0]["kv_cache_bytes"] > 0
    assert any("2,000,000 bytes" in n for n in out["notes"])
    assert written["bytes"] < 50_000_000  # it stopped reading long before the writer gave up


def test_an_over_long_line_keeps_its_start_and_the_lines_after_it(tmp_path):
    p = tmp_path / "pasted.log"
    good = (LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8")
    p.write_text("x" * 3_000_000 + "\n" + good, encoding="utf-8")
    lines = read_log(p, max_line=4096)
    assert len(lines[0]) == 4096 and lines[1:] == good.splitlines()
    assert parse_log(p).observations  # the start-up after the blob is still read


def test_a_byte_cap_says_so(tmp_path):
    p = tmp_path / "big.log"
    good = (LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8")
    p.write_text(good + "INFO filler line\n" * 20000, encoding="utf-8")
    parsed = parse_log(p, max_bytes=len(good.encode()) + 100)
    assert parsed.observations and parsed.notes and "bytes only" in parsed.notes[0]
    assert not parse_log(p).notes  # under the default cap nothing is left out


def test_a_log_piped_on_stdin():
    text = (LOGS / "real" / "vllm-0.7-v0-pr12126.log").read_text(encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-m", "vramlab", "check-log", "-", "--json"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["source"] == "-" and out["observations"][0]["gpu_blocks"] == 6001


def _filler(n: int, unique: bool) -> str:
    if not unique:  # one shape: throughput and access lines
        return "".join(
            # vLLM's periodic stats line as it prints it (loggers.py), "GPU KV cache usage" and all
            f"(APIServer pid=1) INFO 01-01 00:00:{i % 60:02d} [loggers.py:123] Engine 000: Avg prompt throughput: "
            f"{i % 997}.0 tokens/s, Avg generation throughput: {i % 113}.3 tokens/s, Running: {i % 9} reqs, "
            f"Waiting: 0 reqs, GPU KV cache usage: {i % 100}.2%, Prefix cache hit rate: 0.0%\n"
            f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "POST /v1/completions HTTP/1.1" 200 OK\n'
            for i in range(n // 2)
        )
    import hashlib

    return "".join(
        f"request {hashlib.sha1(str(i).encode()).hexdigest()} prompt: {'lorem ipsum dolor ' * (i % 5)}\n"
        for i in range(n)
    )


@pytest.mark.parametrize("unique", [False, True], ids=["repeated-shapes", "unique-lines"])
def test_the_long_log_prefilter_never_drops_a_line_a_rule_reads(tmp_path, monkeypatch, unique):
    """Every fixture log, repeated past the head after filler: parsed with and without the prefilter
    that blanks lines no rule can match, the result is the same."""
    import dataclasses

    from vramlab.logs import detect, prefilter
    from vramlab.logs.prefilter import blank_unread_lines

    # The prefilter's head and sample at a tenth of their size (5,000 / 2,000 lines): the same code
    # path for every log, the filler a tenth as long (97 logs, each parsed twice, took 80-90 s).
    monkeypatch.setattr(prefilter, "HEAD_LINES", 500)
    monkeypatch.setattr(prefilter, "_SAMPLE_LINES", 200)
    logs = sorted(LOGS.glob("*.log")) + sorted((LOGS / "real").glob("*.log"))
    assert len(logs) >= 20
    filler = _filler(510, unique)  # just past the head the prefilter leaves alone
    checked = 0
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        p = tmp_path / log.name
        p.write_text(text + filler + text, encoding="utf-8")

        def parse(path):
            try:
                return detect.parse_log(path, label="log")
            except Exception as exc:
                return repr(exc)

        fast = parse(p)  # blanked as it is read
        with monkeypatch.context() as m:
            m.setattr(detect, "blank_unread_lines", lambda lines: 0)
            full = parse(detect.read_log(p, prefilter=False))
        if isinstance(full, str):
            assert fast == full, log.name
            continue
        assert dataclasses.asdict(fast) == dataclasses.asdict(full), log.name
        checked += 1
    assert checked >= 20
    assert blank_unread_lines(list(filler.splitlines()) * 2) > 0  # the filler is blanked
    p.write_text(filler * 3, encoding="utf-8")
    assert sum(1 for line in detect.read_log(p) if not line) > 700  # and blanked as it is read


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_pipe_that_goes_quiet_is_read_up_to_where_it_stopped(tmp_path):
    """`kubectl logs -f` into a FIFO: the start-up comes, then nothing; the read ends after the
    pipe's silence, says so, and what came is parsed."""
    fifo = tmp_path / "follow.log"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write((LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8"))
            fh.flush()
            done.wait(30)  # the writer stays open, silent

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    env = dict(os.environ, HF_HUB_OFFLINE="1", VRAMLAB_PIPE_WAIT_S="1")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "vramlab", "check-log", str(fifo), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        done.set()
        t.join(timeout=10)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["observations"] and any("sent nothing more for 1 s" in n for n in out["notes"]), out["notes"]


_PEAK = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"  # KiB on Linux
)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_a_log_at_the_byte_cap_costs_a_fraction_of_the_cap_in_memory(tmp_path):
    """check-log's peak memory on a log at its byte cap (a start-up, then throughput and access lines
    to 64 MiB), less its peak on the start-up alone: under half the cap. Holding the text, its decoded
    copy and its lines at once cost about 3.5 times the cap; each log is read in its own process,
    whose peak resident memory the kernel counts, so the figure does not depend on the machine's load."""
    head = (LOGS / "vllm-v1-0.19-debug.log").read_text(encoding="utf-8")
    cap = 64 << 20
    small, big = tmp_path / "startup.log", tmp_path / "big.log"
    small.write_text(head, encoding="utf-8")
    block = _filler(20_000, unique=False)
    with big.open("w", encoding="utf-8") as fh:
        fh.write(head)
        for _ in range(cap // len(block) + 1):
            fh.write(block)
    assert big.stat().st_size > cap

    def peak_kib(path: Path) -> int:
        exe = str(Path(sys.executable).with_name("vramlab"))
        cmd = [sys.executable, "-c", _PEAK, exe, "check-log", str(path), "--max-bytes", str(cap)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        return int(r.stdout.split()[-1])

    extra = (peak_kib(big) - peak_kib(small)) * 1024
    assert extra < cap / 2, f"{extra / (1 << 20):.0f} MiB over the start-up alone for a {cap >> 20} MiB log"
