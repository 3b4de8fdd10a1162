"""scripts/device-check: on this CPU machine it says plainly that there is no GPU; its allocation
and composition checks run here against the sim's ledger (the same four reads NVML answers)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device-check"
GIB = 1 << 30


def _module():
    loader = importlib.machinery.SourceFileLoader("device_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("device_check", loader)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    loader.exec_module(mod)
    return mod


def test_without_a_gpu_it_says_so_and_checks_nothing(tmp_path: Path) -> None:
    if _module().no_gpu_reason() is None:
        pytest.skip("this machine has a GPU: the script runs for real here")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and res.stdout.startswith("device-check: no NVIDIA GPU here: "), res
    assert "Nothing was checked." in res.stdout and not list(tmp_path.iterdir())
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--require-gpu"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1 and "no NVIDIA GPU here" in res.stdout


def test_the_allocation_and_composition_checks_on_the_sims_card(tmp_path: Path) -> None:
    from vramlab.sim.ledger import DeviceLedger

    ledger = DeviceLedger(tmp_path / "gpu0.ledger", gpu="h100-80gb")
    ctx = ledger.allocate(512 << 20, "non_torch")  # a CUDA context before the first reading
    out = _module().check_allocations(ledger, lambda n: ledger.allocate(n, "other"), os.getpid())
    assert out["failures"] == [], out["failures"]
    assert [s["gpu_delta_bytes"] for s in out["steps"]] == [GIB, 4 * GIB]
    assert [s["process_delta_bytes"] for s in out["steps"]] == [GIB, 4 * GIB] and out["per_process_readings"]
    comp = out["composition"]
    assert comp["resident_model"]["measured_bytes"] == GIB and comp["kv_cache"]["measured_bytes"] == 4 * GIB
    assert comp["runtime_overhead"]["measured_bytes"] == 512 << 20 and comp["peak"][
        "measured_bytes"
    ] == 5 * GIB + (512 << 20)
    assert ctx


def test_the_allocation_check_fails_on_a_reading_that_misses_memory(tmp_path: Path) -> None:
    from vramlab.sim.ledger import DeviceLedger

    ledger = DeviceLedger(tmp_path / "gpu0.ledger", gpu="h100-80gb")

    class Short:  # a driver that under-reports by 100 MiB per reading after the first allocation
        def __init__(self) -> None:
            self.calls = 0

        def memory_info(self, i: int) -> tuple[int, int, int]:
            total, used, free = ledger.memory_info(i)
            self.calls += 1
            return total, used - (100 << 20) * (self.calls > 1), free

        def processes(self, i: int) -> list[tuple[int, int, str]]:
            return ledger.processes(i)

    out = _module().check_allocations(Short(), lambda n: ledger.allocate(n, "other"), os.getpid())
    assert any(f.startswith("GPU reading grew") for f in out["failures"]), out["failures"]


def test_the_serve_command_follows_transformers_serves_own_help(tmp_path: Path, monkeypatch) -> None:
    # the real `transformers serve --help` of 5.24.0: the model to preload is the positional FORCE_MODEL
    # (there is no --force-model), the start-up lines need --log-level info
    helptext = Path(__file__).parent / "fixtures" / "transformers-5.24-serve-help.txt"
    fake = tmp_path / "transformers"
    fake.write_text(f"#!/bin/sh\ncat {helptext}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cmd = _module().serve_command(Path("/models/tiny"), "cpu")
    assert cmd == (
        f"exec {fake} serve /models/tiny --host 127.0.0.1 --port {{port}} --attn-implementation eager "
        "--device cpu --log-level info"
    )
    # an older help text that names --force-model gets the flag
    fake.write_text("#!/bin/sh\necho '  --force-model TEXT  --port INTEGER  --device TEXT'\n")
    assert _module().serve_command(Path("/m"), "cuda") == (
        f"exec {fake} serve --force-model /m --host 127.0.0.1 --port {{port}} --device cuda"
    )


def test_a_cpu_drill_that_did_not_serve_is_a_problem() -> None:
    problems = _module().drill_problems
    ok: dict[str, Any] = {
        "exit_code": 0,
        "run_id": "r",
        "requests": {"sent": 9, "ok": 9, "errors": [], "max_prompt_tokens": 258},
    }
    assert problems(ok) == [] and problems({"skipped": "not installed"}) == []
    assert (
        "errors ['422 http_4xx']"
        in problems({**ok, "requests": {**ok["requests"], "errors": ["422 http_4xx"]}})[0]
    )
    assert (
        "at most 40 prompt tokens"
        in problems({**ok, "requests": {**ok["requests"], "max_prompt_tokens": 40}})[0]
    )
    assert problems({"exit_code": 1, "stderr_tail": "boom"})[0].startswith("drill exit 1: boom")
