"""The installed CLI on hostile inputs and outputs, as a careless or hostile user would try them.

Every file a command reads is tried as a FIFO nobody writes to, a symlink to /dev/zero, a folder
and a 4 GiB sparse file; every output path as a missing folder, a folder and /dev/full. Each case
must end in bounded time and memory (the child runs under an address-space limit smaller than the
sparse file) with one clear line on stderr and the exit status the case names: 2 for bad input, 1
for a failure after the work, never 70 and never a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

VRAMLAB = [str(Path(sys.executable).with_name("vramlab"))]
ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
LOG = ROOT / "tests" / "fixtures" / "logs" / "vllm-v1-0.19-debug.log"
M = ["--model", "llama-3.1-8b-instruct", "--gpu", "h100-80gb"]
SWEEP = [*M, "--sweep", "max-num-seqs=16,64"]
MEMORY_LIMIT = 3 << 30  # address space of the child: less than the sparse file, so reading it whole fails
SPARSE = 4 << 30

# How a named input is made in tmp_path.
FIFO, ZERO, FOLDER, HUGE = "@fifo", "@zero-link", "@folder", "@sparse"
KINDS = {FIFO: "fifo", ZERO: "dev-zero-link", FOLDER: "folder", HUGE: "4gib-sparse"}


@dataclass
class Case:
    id: str
    argv: list[str]
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    exit: int = 2
    says: str = ""  # a piece of the one line
    timeout: float = 60


def _edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert old in text, (path.name, old)
    return text.replace(old, new, 1)


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


# Every reader the CLI has, with the argument that names the file ({x}) and its extension.
READERS: list[tuple[str, list[str], str]] = [
    ("run-plan", ["run", "{x}", "--db", "{v.db}"], ".yaml"),
    ("drill-plan", ["drill", "{x}", "--db", "{v.db}"], ".yaml"),
    ("alerts-plan", ["alerts", "{x}"], ".yaml"),
    ("pack-fleet", ["pack", "{x}", str(EX / "models.yaml")], ".yaml"),
    ("pack-models", ["pack", str(EX / "fleet.yaml"), "{x}"], ".yaml"),
    ("pack-trace", ["pack", str(EX / "fleet.yaml"), str(EX / "models.yaml"), "--simulate", "{x}"], ".jsonl"),
    ("plan-calibration", ["plan", *M, "--calibration", "{x}"], ".toml"),
    ("plan-config", ["plan", "--model", "{x}", "--gpu", "h100-80gb", "--offline"], ".json"),
    ("calibrate-jsonl", ["calibrate", "{x}"], ".jsonl"),
    ("calibrate-log", ["calibrate", "{x}"], ".log"),
    ("calibrate-model-configs", ["calibrate", str(LOG), "--model-configs", "{x}"], ".json"),
    ("check-log", ["check-log", "{x}"], ".log"),
]
# A folder is a legitimate input for these (a model directory, a folder of logs): said differently.
FOLDER_OK = {"plan-config", "calibrate-jsonl", "calibrate-log", "check-log"}


def _reader_cases() -> list[Case]:
    out = []
    for name, argv, ext in READERS:
        for kind in (FIFO, ZERO, FOLDER, HUGE):
            if kind == FOLDER and name in FOLDER_OK:
                continue
            x = "input" + ext
            args = [a.replace("{x}", "{" + x + "}") for a in argv]
            out.append(Case(f"{name}-{KINDS[kind]}", args, {x: kind}))
    return out


CASES: list[Case] = [
    *_reader_cases(),
    # -- output paths: before any work ---------------------------------------------------------------
    *[
        Case(f"{cmd}-{what}", [*argv, target], files, says=says)
        for cmd, argv in [
            ("plan-plot", ["plan", *SWEEP, "--plot"]),
            ("pack-plot", ["pack", str(EX / "fleet.yaml"), str(EX / "models.yaml"), "--plot"]),
            ("calibrate-o", ["calibrate", str(LOG), "-o"]),
            ("alerts-o", ["alerts", str(EX / "oom-drill.yaml"), "-o"]),
            ("report-o", ["report", "abcd", "--db", "{v.db}", "-o"]),
        ]
        for what, target, files, says in [
            ("missing-folder", "{nodir/out.png}", {}, "does not exist"),
            ("folder", "{adir}", {"adir/x": "x"}, "is a folder"),
            ("dev-full", "/dev/full", {}, "not a regular file"),
        ]
    ],
    Case(
        "sim-log-file-dev-full",
        ["sim", "serve", *M, "--port", "0", "--log-file", "/dev/full"],
        says="engine log",
    ),
    Case(
        "sim-log-file-missing-folder",
        ["sim", "serve", *M, "--port", "0", "--log-file", "{nodir/e.log}"],
        says="does not exist",
    ),
    Case(
        "examples-fifo-in-the-way",
        ["examples", "{ex}", "--force"],
        {"ex/oom-drill.yaml": FIFO},
        says="not a regular file",
    ),
    Case(
        "examples-dev-zero-link-in-the-way",
        ["examples", "{ex}"],
        {"ex/oom-drill.yaml": ZERO},
        says="already there and different",
    ),
    Case("run-db-proc", ["run", str(EX / "concurrency-ramp.yaml"), "--db", "/proc/nope/x.db"], says="store"),
    Case(
        "run-db-folder",
        ["run", str(EX / "concurrency-ramp.yaml"), "--db", "{adir}"],
        {"adir/x": "x"},
        says="is a folder",
    ),
    Case(
        "drill-db-dev-full", ["drill", str(EX / "oom-drill.yaml"), "--db", "/dev/full"], says="not a regular"
    ),
    # -- flags ---------------------------------------------------------------------------------------
    Case(
        "run-phase-s-nan",
        ["run", str(EX / "concurrency-ramp.yaml"), "--db", "{v.db}", "--phase-s", "nan"],
        says="--phase-s",
    ),
    Case(
        "run-phase-s-inf",
        ["run", str(EX / "concurrency-ramp.yaml"), "--db", "{v.db}", "--phase-s", "inf"],
        says="--phase-s",
    ),
    Case("check-log-max-bytes-huge", ["check-log", str(LOG), "--max-bytes", str(10**30)], says="--max-bytes"),
    Case("check-log-max-bytes-0", ["check-log", str(LOG), "--max-bytes", "0"], says="--max-bytes"),
    *[
        Case(
            f"pack-keep-alive-{v}",
            ["pack", str(EX / "fleet.yaml"), str(EX / "models.yaml"), "--keep-alive-s", v],
            says="--keep-alive-s",
        )
        for v in ("-5", "-0.5", "inf")
    ],
    # -- numbers and booleans in pack, fleet, drill files and model configs: refused by the field's name --
    *[
        Case(
            f"models-{key}-{label}",
            ["pack", str(EX / "fleet.yaml"), "{m.yaml}"],
            {"m.yaml": _edit(EX / "models.yaml", old, new)},
            says=key,
        )
        for key, label, old, new in [
            ("keep_alive_s", "negative", "keep_alive_s: 300", "keep_alive_s: -5"),
            ("keep_alive_s", "string", "keep_alive_s: 300", "keep_alive_s: '300'"),
            ("concurrency", "zero", "concurrency: 8", "concurrency: 0"),
            ("concurrency", "bool", "concurrency: 8", "concurrency: true"),
            ("concurrency", "string", "concurrency: 8", "concurrency: '8'"),
            ("rate_rps", "negative", "rate_rps: 2.0", "rate_rps: -2"),
            ("rate_rps", "nan", "rate_rps: 2.0", "rate_rps: .nan"),
            ("latency_ms", "zero", "latency_ms: 1500", "latency_ms: 0"),
            ("engine_start_s", "inf", "engine_start_s: 25", "engine_start_s: .inf"),
            ("load_gbps", "string", "load_gbps: 2.0", "load_gbps: fast"),
            ("priority", "float", "priority: 10", "priority: 10.5"),
        ]
    ],
    *[
        Case(
            f"fleet-{key}-{label}",
            ["pack", "{f.yaml}", str(EX / "models.yaml")],
            {"f.yaml": _edit(EX / "fleet.yaml", old, new)},
            says=key,
        )
        for key, label, old, new in [
            ("count", "zero", "count: 2", "count: 0"),
            ("count", "bool", "count: 2", "count: true"),
            ("pcie_gbps", "negative", "pcie_gbps: 25        #", "pcie_gbps: -25        #"),
            ("pcie_gbps", "string", "pcie_gbps: 25        #", "pcie_gbps: '25'        #"),
        ]
    ],
    *[
        Case(
            f"drill-{key}-{label}",
            ["drill", "{d.yaml}", "--db", "{v.db}"],
            {"d.yaml": _edit(EX / "oom-drill.yaml", old, new)},
            says=key,
        )
        for key, label, old, new in [
            ("concurrency", "zero", "concurrency: 4", "concurrency: 0"),
            ("concurrency", "string", "concurrency: 4", "concurrency: '4'"),
            ("request_timeout_s", "negative", "request_timeout_s: 5", "request_timeout_s: -5"),
            ("request_timeout_s", "bool", "request_timeout_s: 5", "request_timeout_s: true"),
            ("factor", "string", "factor: 2\n", "factor: '2'\n"),
            ("step_s", "zero", "step_s: 1", "step_s: 0"),
            ("ceiling", "nan", "ceiling: 32768", "ceiling: .nan"),
            (
                "ramp.start",
                "fraction",
                "start: 256",
                "start: 256.5",
            ),  # a token count is whole: not floored silently
        ]
    ],
    *[
        Case(
            f"config-{key}-{label}",
            ["plan", "--model", "{config.json}", "--gpu", "h100-80gb", "--offline"],
            {"config.json": json.dumps({**LLAMA_CONFIG, key: value})},
            says=key,
        )
        for key, label, value in [
            ("tie_word_embeddings", "string-false", "False"),
            ("tie_word_embeddings", "zero", 0),
            ("attention_bias", "string-true", "true"),
        ]
    ],
    # -- config.json shapes no engine loads: refused, not planned as something else --------------------
    *[
        Case(
            f"config-{label}",
            ["plan", "--model", "{config.json}", "--gpu", "h100-80gb", "--offline"],
            {"config.json": json.dumps(doc)},
            says=says,
        )
        for label, doc, says in [
            ("kv-heads-7-of-32", {**LLAMA_CONFIG, "num_key_value_heads": 7}, "num_key_value_heads (7)"),
            (
                "no-intermediate-size",
                {k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"},
                "intermediate_size",
            ),
            ("quant-config-a-string", {**LLAMA_CONFIG, "quantization_config": "awq"}, "must be an object"),
            ("quant-config-no-method", {**LLAMA_CONFIG, "quantization_config": {"bits": 4}}, "quant_method"),
            (
                "quant-method-unknown",
                {**LLAMA_CONFIG, "quantization_config": {"quant_method": "q9_z"}},
                "'q9_z' is not one vLLM knows",
            ),
            (
                "gptq-without-bits",
                {**LLAMA_CONFIG, "quantization_config": {"quant_method": "gptq", "group_size": 128}},
                "'bits'",
            ),
            (
                "awq-3-bits",
                {
                    **LLAMA_CONFIG,
                    "quantization_config": {"quant_method": "awq", "bits": 3, "group_size": 128},
                },
                "'bits' of 4",
            ),
            (
                "gptq-group-size-string",
                {
                    **LLAMA_CONFIG,
                    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": "x"},
                },
                "group_size",
            ),
        ]
    ],
    # -- plan files: YAML 1.1 surprises, duplicate keys, limits that cannot be --------------------------
    *[
        Case(
            f"run-plan-{label}",
            ["run", "{p.yaml}", "--db", "{v.db}"],
            {"p.yaml": _edit(EX / "concurrency-ramp.yaml", old, new)},
            says=says,
        )
        for label, old, new, says in [
            ("rounds-yes", "rounds: 3", "rounds: yes", "'yes' is a YAML 1.1 boolean"),
            ("base-60", "rounds: 3", "rounds: 1:30", "base-60"),
            ("duplicate-key", "rounds: 3", "rounds: 3\nrounds: 5", "duplicate key 'rounds'"),
            ("metric-negative", "p95_ttft_ms: 800", "p95_ttft_ms: -5", "metrics.p95_ttft_ms"),
            ("error-rate-above-1", "  error_rate: 0.01", "  error_rate: 5", "metrics.error_rate"),
        ]
    ],
    Case("runs-db-empty", ["runs", "--db", ""], says="an empty store"),
    Case("runs-db-sqlite-two-slashes", ["runs", "--db", "sqlite://rel.db"], says="three slashes"),
    Case("calibrate-argument-too-long", ["calibrate", "a" * 300], says="longer than the file system allows"),
    # -- a co-tenant that asks for more than the card ---------------------------------------------------
    Case(
        "drill-cotenant-bigger-than-card",
        ["drill", "{d.yaml}", "--db", "{v.db}"],
        {"d.yaml": "@oom-drill:cotenant:\n  hold_gib: 1000\n"},
        says="cotenant.hold_gib",
    ),
]


def _oom_drill(extra: str) -> str:
    import re

    text = (EX / "oom-drill.yaml").read_text()
    return re.sub(r"cotenant:.*\n(?:  .*\n)+", extra, text)


def _materialise(case: Case, tmp: Path) -> list[str]:
    for name, content in case.files.items():
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == FIFO:
            os.mkfifo(p)
        elif content == ZERO:
            p.symlink_to("/dev/zero")
        elif content == FOLDER:
            p.mkdir()
            (p / "x").write_text("x")
        elif content == HUGE:
            with open(p, "wb") as fh:
                fh.truncate(SPARSE)  # no disk used: a hole that reads as zeros
        elif isinstance(content, str) and content.startswith("@oom-drill:"):
            p.write_text(_oom_drill(content.removeprefix("@oom-drill:")))
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return [str(tmp / a[1:-1]) if a.startswith("{") and a.endswith("}") else a for a in case.argv]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VRAMLAB_DB", "VRAMLAB_DEBUG")}
    env.update(HF_HUB_OFFLINE="1", VRAMLAB_PIPE_WAIT_S="1")
    return subprocess.run(
        VRAMLAB + argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        preexec_fn=_limit_memory,
    )


@pytest.mark.skipif(
    not hasattr(os, "mkfifo") or not Path("/dev/full").exists(), reason="needs FIFOs and /dev/full"
)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_and_the_right_exit(case: Case, tmp_path: Path) -> None:
    res = run_cli(_materialise(case, tmp_path), tmp_path, case.timeout)
    err = res.stderr.strip()
    assert "Traceback" not in res.stderr + res.stdout, res.stderr[-2000:]
    assert res.returncode != 70, err
    assert res.returncode == case.exit, f"exit {res.returncode}: {err[-500:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-1000:]
    assert case.says in lines[0], lines[0]
    assert len(lines[0]) < 600


def test_the_corpus_covers_every_reader_and_kind() -> None:
    ids = {c.id for c in CASES}
    assert len(CASES) >= 60
    for name, _, _ in READERS:
        assert {f"{name}-fifo", f"{name}-dev-zero-link", f"{name}-4gib-sparse"} <= ids, name
    for must in (
        "plan-plot-dev-full",
        "pack-plot-missing-folder",
        "calibrate-o-folder",
        "run-db-proc",
        "run-phase-s-nan",
        "drill-cotenant-bigger-than-card",
        "pack-keep-alive--5",
    ):
        assert must in ids


# -- a write that fails after the work: exit 1, the old file kept, nothing half-written -------------
def test_a_write_that_fails_after_the_work_keeps_the_old_file(tmp_path: Path) -> None:
    from vramlab.cli.outputs import output_file, write_output
    from vramlab.errors import OutputError

    target = tmp_path / "report.md"
    target.write_text("the old report")
    old_mode = target.stat().st_mode & 0o777
    with pytest.raises(OutputError) as info, output_file(target, "report", "run abc is in the store") as tmp:
        tmp.write_text("half of the new one")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert info.value.exit_code == 1
    assert str(info.value) == (
        f"cannot write report {str(target)!r}: No space left on device; run abc is in the store"
    )
    assert target.read_text() == "the old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary file left
    write_output(target, "the new report", "report")
    assert target.read_text() == "the new report"
    assert target.stat().st_mode & 0o777 == old_mode  # not the temporary file's 0600


def test_calibrate_writes_no_profile_when_the_folder_goes_away(tmp_path: Path) -> None:
    """The check passed, then the folder vanished during the work: exit 1, the fit still printed."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = (
        "import shutil, sys; import vramlab.logs.calibrate as c; real = c.calibrate\n"
        "def slow(*a, **k):\n    r = real(*a, **k); shutil.rmtree(sys.argv[-1]); return r\n"
        "c.calibrate = slow\n"
        "from vramlab.cli.main import main; sys.exit(main(sys.argv[1:-1]))"
    )
    data = tmp_path / "m.jsonl"
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_calibrate_cli import measurements
    finally:
        sys.path.pop(0)
    measurements(data, tp2=2)
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "calibrate",
            str(data),
            "-o",
            str(out_dir / "p.toml"),
            "--json",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "cannot write calibration profile" in res.stderr
    assert "no profile written; the fit is printed" in res.stderr
    assert json.loads(res.stdout)["fitted_any"] is True  # the work is not lost


def test_a_folder_of_logs_with_a_fifo_and_a_device_link_in_it(tmp_path: Path) -> None:
    """A folder of logs is read; the FIFO and the /dev/zero link in it cannot block or flood it."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "good.log").write_text(LOG.read_text())
    os.mkfifo(folder / "stuck.log")
    (folder / "zero.log").symlink_to("/dev/zero")
    res = run_cli(["check-log", str(folder), "--json"], tmp_path, 60)
    assert res.returncode in (0, 2) and "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "good.log" in json.dumps(out)


def test_a_drill_target_log_file_that_is_a_fifo_or_a_device_is_never_opened(tmp_path: Path) -> None:
    """A plan's target.log_file is read while the drill runs: a FIFO or /dev/zero gives no lines
    (no hang, no flood); a regular file gives what was appended since the last read."""
    import time
    from types import SimpleNamespace

    from vramlab.drill.target import _read_new_lines
    from vramlab.drill.watch import _last_log_line

    fifo, zero, log = tmp_path / "fifo.log", tmp_path / "zero.log", tmp_path / "engine.log"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    log.write_text("first\nsecond\nhalf")
    t = time.monotonic()
    for path in (fifo, zero):
        assert _read_new_lines(SimpleNamespace(_log_offset=0), str(path)) == []
        assert _last_log_line(SimpleNamespace(log_path=str(path))) is None
    assert time.monotonic() - t < 5
    holder = SimpleNamespace(_log_offset=0)
    assert _read_new_lines(holder, str(log)) == ["first", "second"]  # the half line waits
    with open(log, "a") as fh:
        fh.write(" done\n")
    assert _read_new_lines(holder, str(log)) == ["half done"]
    assert _last_log_line(SimpleNamespace(log_path=str(log))) == "half done"
