"""A real llama.cpp engine for the end-to-end tests: llama-cpp-python's server (PyPI, built from
source by scripts/engine-llamacpp) on a tiny random-weight GGUF the tests write themselves.

Nothing is downloaded at test time. The engine's interpreter comes from VRAMLAB_TEST_LLAMACPP_PYTHON
(scripts/test sets it); without it the tests that need the engine skip with the reason, unless
VRAMLAB_REQUIRE_LLAMACPP=1 (scripts/test sets it too), which turns the skip into a failure.

Facts of this server (llama-cpp-python 0.3.x) the tests rely on: it binds its port only after the
model is loaded; it has no /health and no /metrics (a drill discovers /v1/models); it aborts an
in-flight stream when a second request arrives unless `--interrupt_requests false`; with
`--verbose true` llama.cpp's own start-up log (the KV buffer lines) goes to stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "VRAMLAB_TEST_LLAMACPP_PYTHON"

# A llama-architecture model small enough to load in well under a second on a busy 2-core box.
N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF, N_CTX_TRAIN = (
    128,
    4,
    2,
    2,
    256,
    4096,
)  # head_dim 32: quantized KV needs it


def engine_python() -> str:
    py = os.environ.get(ENV, "")
    if py and Path(py).exists():
        return py
    why = (
        f"{ENV} is not set to llama-cpp-python's interpreter (scripts/test installs it with "
        "scripts/engine-llamacpp)"
    )
    if os.environ.get("VRAMLAB_REQUIRE_LLAMACPP") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    """An SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, then letters and a few words."""
    toks: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    types = [2, 3, 3]  # unknown, control, control
    toks += [f"<0x{i:02X}>".encode() for i in range(256)]
    types += [6] * 256  # byte
    pieces = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        "\u2581" + w
        for w in (
            "the",
            "a",
            "of",
            "to",
            "and",
            "in",
            "is",
            "it",
            "you",
            "that",
            "was",
            "for",
            "on",
            "are",
            "with",
        )
    ]
    pieces += ["\u2581" + chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581", ".", ","]
    pieces = list(dict.fromkeys(pieces))  # llama.cpp refuses a vocabulary with a piece twice
    toks += [p.encode() for p in pieces]
    types += [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return toks, scores, types


def write_gguf(path: Path, seed: int = 0) -> Path:
    """A tiny llama GGUF with random F32 weights; KV per token per layer = 2 x N_HEAD_KV x head_dim."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    toks, scores, types = _vocab()
    n_vocab, head = len(toks), N_EMBD // N_HEAD
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("vramlab-tiny-random")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    # Random text, but never an early end: every embedding carries 1.0 in dimension 0, which the small
    # random layers leave dominant, so after the final norm h[0] is about +11 at every position; the
    # output rows give ordinary tokens +0.5 and <unk>/<s>/</s> -0.5 there (P(</s>) ~ 1e-6 per token).
    emb = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32) * 0.02
    emb[:, 0] = 1.0
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    out = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32) * 0.02
    out[:, 0] = 0.5
    out[:3, 0] = -0.5
    w.add_tensor("output.weight", out)
    kv = N_HEAD_KV * head
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_k.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_v.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(python: str, model: Path, port: int | str, n_ctx: int = 512, extra: str = "") -> str:
    """The shell command a drill's `process` target runs ({port} is filled by the drill)."""
    return (
        f"exec {python} -m llama_cpp.server --model {model} --host 127.0.0.1 --port {port} --n_ctx {n_ctx} "
        f"--n_threads 1 --n_batch 64 --interrupt_requests false --verbose true {extra}"
    ).strip()


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    load_s: float

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(
    python: str, model: Path, log: Path, n_ctx: int = 512, extra: str = "", limit_s: float = 120.0
) -> Server:
    """Start the server and wait until /v1/models answers 200 (it has no /health)."""
    import urllib.request

    port = free_port()
    t = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", server_command(python, model, port, n_ctx, extra)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() - t < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return Server(proc, url, log, time.monotonic() - t)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"llama.cpp server did not answer within {limit_s:g} s: {log.read_text()[-2000:]}")
