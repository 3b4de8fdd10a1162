"""A real `transformers serve` (Hugging Face transformers 5.x, CPU) as a drill target, on a tiny
random-weight Llama the test writes itself; nothing is downloaded.

Needs an interpreter with `transformers[serving]` and PyTorch in VRAMLAB_TEST_TRANSFORMERS_PYTHON
(its `transformers` script beside it); without it every test here skips with the reason. Not in
scripts/test: the install is large and the start-up takes seconds.

Facts of this server (transformers 5.24.0) the tests rely on: the model to preload is the
positional FORCE_MODEL; it has /health and no /metrics; it refuses unknown request fields (422)
but ignores `stream_options` and still sends usage; its start-up lines need `--log-level info`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ENV = "VRAMLAB_TEST_TRANSFORMERS_PYTHON"
pytestmark = pytest.mark.slow

_MODEL_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
words, where = json.loads(sys.argv[1]), sys.argv[2]
special = ["<unk>", "<s>", "</s>", "<pad>"]
vocab = {w: i for i, w in enumerate(special + words)}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=1, eos_token_id=2, pad_token_id=3)
LlamaForCausalLM(cfg).save_pretrained(where)
fast.save_pretrained(where)
"""


def _serve() -> str:
    py = os.environ.get(ENV, "")
    if not py or not Path(py).exists():
        pytest.skip(
            f"{ENV} is not set to a Python with transformers[serving] and PyTorch (not in scripts/test: "
            "the install is large)"
        )
    exe = Path(py).parent / "transformers"
    if not exe.exists():
        pytest.skip(f"no `transformers` command beside {py}")
    return str(exe)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    exe = _serve()
    from vramlab.load.prompts import _WORDS

    where = tmp_path_factory.mktemp("tf") / "tiny-llama"
    words = sorted(set(_WORDS) | set("#:-0123456789seed"))
    subprocess.run(
        [os.environ[ENV], "-c", _MODEL_SCRIPT, json.dumps(words), str(where)],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return exe, where


def _drill(tmp_path: Path, command: str, model: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = {
        "name": "tf-e2e",
        "rounds": 1,
        "baseline_s": 2,
        "target": {
            "kind": "process",
            "environment": "test",
            "engine": "transformers",
            "command": command,
            "base_url": f"http://127.0.0.1:{port}",
            "model": model,
            "api": "openai-chat",
            "log_file": str(tmp_path / "serve.log"),
            "timeout_s": 60,
        },
        "load": {"concurrency": 1, "prompt_tokens": 16, "max_tokens": 2, "request_timeout_s": 30},
        "ramp": {
            "knob": "context",
            "mode": "geometric",
            "start": 32,
            "factor": 2,
            "ceiling": 64,
            "step_s": 2,
        },
        "recovery": {"limit_s": 20, "observe_s": 1},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(plan))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramlab",
            "drill",
            "p.yaml",
            "--db",
            str(tmp_path / "v.db"),
            "--json",
            "-o",
            "incident.md",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return res, tmp_path / "serve.log"


def test_a_short_drill_against_the_real_server(tiny, tmp_path):
    exe, model = tiny
    t = time.monotonic()
    res, log = _drill(
        tmp_path,
        f"exec {exe} serve {model} --host 127.0.0.1 --port {{port}} --device cpu --log-level info",
        str(model),
    )
    assert res.returncode == 0, (res.stdout[-1500:], res.stderr[-2500:])
    assert "no OOM up to 64 prompt tokens" in res.stderr
    from vramlab.report import load_context
    from vramlab.store import open_store

    with open_store(str(tmp_path / "v.db")) as store:
        (run,) = store.list_runs()
        ctx = load_context(store, run.run_id)
    reqs = list(ctx.requests)
    assert reqs and all(r.ok for r in reqs), {(r.status_code, r.error) for r in reqs if not r.ok}
    assert max(r.prompt_tokens or 0 for r in reqs) >= 60  # the server's own count reached the ramp's top
    # the start-up log the drill kept is read as transformers', with the model it loaded
    assert any("(transformers): no memory figure printed" in e.message for e in ctx.events), [
        e.message for e in ctx.events if "start-up log" in e.message
    ]
    from vramlab.logs.detect import parse_log

    (obs,) = parse_log(log).incomplete
    assert obs.engine == "transformers" and obs.model == str(model) and obs.extra["num_key_value_heads"] == 2
    assert time.monotonic() - t < 90


def test_a_missing_model_is_a_start_up_crash_with_the_servers_words(tiny, tmp_path):
    exe, _ = tiny
    missing = tmp_path / "no-such-model"
    res, log = _drill(
        tmp_path,
        f"exec {exe} serve {missing} --host 127.0.0.1 --port {{port}} --log-level info",
        str(missing),
    )
    assert res.returncode == 1, (res.stdout[-1500:], res.stderr[-2500:])
    assert "the target process exited with code 1" in res.stderr and "its log ends" in res.stderr
    assert "OSError" in res.stderr.split("its log ends")[1]
    assert "did not pass a health check" not in res.stderr
