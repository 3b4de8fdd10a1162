"""The model a llama.cpp start-up loaded, from the log alone.

llama.cpp prints the GGUF's metadata as it reads it (`llama_model_loader: - kv  15: qwen3moe.block_count
u32 = 48`) and then the hyperparameters it built from it (`print_info: n_layer = 48`, 2024's
`llm_load_print_meta:`), the file type, the tensors' total size and the parameter count
(src/llama-model.cpp `print_info`, b3000-b9300). That is the shape the capacity model needs, so a
model in no catalog still gets a prediction: the printed facts are written back as the GGUF keys
they came from and read by the same code that reads a GGUF file (sources/gguf_file.py
`config_from_gguf`). The tensors' total (`file size = 17.28 GiB`) is the weights.

Whether the output matrix is the input embedding (tied) is not printed: the parameter count says
it (the two differ by vocab x hidden); without it, untied.
"""

from __future__ import annotations

import re
from typing import Any

from vramlab.logs.base import Rule, rule, sized

# print_info's name -> the GGUF key it was read from ({arch}. in front), src/llama-model.cpp load_hparams.
HPARAM_KEYS = {
    "n_ctx_train": "context_length",
    "n_embd": "embedding_length",
    "n_layer": "block_count",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "n_embd_head_k": "attention.key_length",
    "n_embd_head_v": "attention.value_length",
    "n_ff": "feed_forward_length",
    "n_expert": "expert_count",
    "n_expert_used": "expert_used_count",
    "n_ff_exp": "expert_feed_forward_length",
    "n_ff_shexp": "expert_shared_feed_forward_length",
    "n_expert_shared": "expert_shared_count",
    "n_layer_dense_lead": "leading_dense_block_count",
    "n_swa": "attention.sliding_window",
    "n_swa_pattern": "attention.sliding_window_pattern",
    "n_lora_q": "attention.q_lora_rank",
    "n_lora_kv": "attention.kv_lora_rank",
    "n_embd_head_k_mla": "attention.key_length_mla",
    "n_embd_head_v_mla": "attention.value_length_mla",
    "n_rot": "rope.dimension_count",
    "ssm_d_conv": "ssm.conv_kernel",
    "ssm_d_inner": "ssm.inner_size",
    "ssm_d_state": "ssm.state_size",
    "ssm_dt_rank": "ssm.time_step_rank",
    "ssm_n_group": "ssm.group_count",
    "n_vocab": "vocab_size",
}
# What a KV prediction cannot do without (the rest has defaults or follows from these).
NEEDED = ("n_layer", "n_embd", "n_head", "n_vocab")
_PRINT = r"(?:llm_load_)?print_(?:info|meta):\s+"  # "print_" is the literal the prefilter looks for
_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _number(text: str) -> Any:
    """'48' -> 48; '[4, 4, 0, 4]' -> [4, 4, 0, 4] (per-layer values); else None."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.startswith("["):
        values = re.findall(r"-?\d+", text)
        return [int(v) for v in values] if values else None
    return None


def _hparam(m: re.Match[str]) -> dict[str, Any] | None:
    key, value = m.group(1), m.group(2)
    if key == "arch":
        return {"extra.hparams": {"arch": value.strip()}}
    number = _number(value)
    return {"extra.hparams": {key: number}} if number is not None else None


def _gguf_kv(m: re.Match[str]) -> dict[str, Any] | None:
    """`- kv  15: qwen3moe.block_count u32 = 48`; an array as its length (`arr[str,151936]`)."""
    key, kind, value = m.group(1), m.group(2), m.group(3).strip()
    if kind.startswith("arr["):
        length = re.search(r",\s*(\d+)\]", kind)
        if not length:
            return None
        if kind.startswith(("arr[i", "arr[u")):  # per-layer figures (head_count_kv of a hybrid)
            return {"extra.gguf": {key: [int(v) for v in re.findall(r"-?\d+", value)]}}
        return {"extra.gguf": {key: {"array_length": int(length.group(1))}}}
    if kind == "str":
        return {"extra.gguf": {key: value}}
    number = _number(value)
    return {"extra.gguf": {key: number}} if number is not None else None


def _params(m: re.Match[str]) -> dict[str, Any]:
    return {"extra.model_params": int(float(m.group(1)) * _UNITS[m.group(2)])}


RULES: list[Rule] = [
    rule(
        "hparam",
        _PRINT + r"(arch|" + "|".join(sorted(HPARAM_KEYS, key=len, reverse=True)) + r")\s*=\s*(.+?)\s*$",
        _hparam,
        shared=True,
    ),
    rule(
        "gguf_kv",
        r"llama_model_loader: - kv\s+\d+:\s+([\w.-]+)\s+(str|u8|i8|u16|i16|u32|i32|u64|i64|f32|f64|bool|arr\[[^\]]*\])"
        r"\s+=\s+(.*)$",
        _gguf_kv,
        shared=True,
    ),
    rule(
        "file_size",
        _PRINT + r"(?:file|model) size\s*=\s*([\d.]+) (GiB|MiB|KiB|B)\b(?: \(([\d.]+) BPW\))?",
        lambda m: {
            "extra.file_bytes": sized(m.group(1), m.group(2)),
            "extra.file_bpw": float(m.group(3)) if m.group(3) else None,
        },
        shared=True,
    ),
    rule("model_params", _PRINT + r"model params\s*=\s*([\d.]+) ([KMBT])\b", _params, shared=True),
]


def metadata(extra: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(architecture, GGUF metadata) from what the log printed: the loader's key/value lines as they
    are, and print_info's hyperparameters under the keys they were read from."""
    meta: dict[str, Any] = dict(extra.get("gguf") or {})
    hp: dict[str, Any] = extra.get("hparams") or {}
    arch = meta.get("general.architecture") or hp.get("arch")
    if not isinstance(arch, str) or not re.fullmatch(r"[\w.-]+", arch):
        return None, meta
    meta["general.architecture"] = arch
    for name, key in HPARAM_KEYS.items():
        value = hp.get(name)
        if value is None or (name == "n_swa" and not value):
            continue
        meta.setdefault(f"{arch}.{key}", value)
    return arch, meta


def missing(extra: dict[str, Any]) -> list[str]:
    """The facts a prediction needs that the log did not print, in print_info's words."""
    arch, meta = metadata(extra)
    out = [] if arch else ["arch"]
    for name in NEEDED:
        key = f"{arch}.{HPARAM_KEYS[name]}"
        if meta.get(key) is None and not (name == "n_vocab" and meta.get("tokenizer.ggml.tokens")):
            out.append(name)
    return out


def spec_from_log(extra: dict[str, Any], name: str, quantization: str | None) -> Any:
    """A ModelSpec of the model the log loaded. Raises ConfigError when a needed fact is missing."""
    from vramlab.capacity.quant_names import gguf_quant
    from vramlab.capacity.spec import QuantSpec
    from vramlab.capacity.weights import breakdown
    from vramlab.errors import ConfigError
    from vramlab.sources.gguf_file import GGUFFacts, config_from_gguf
    from vramlab.sources.hf_config import spec_from_config

    lacking = missing(extra)
    if lacking:
        raise ConfigError(f"the log does not print the model's {', '.join(lacking)}")
    arch, meta = metadata(extra)
    assert arch is not None

    def spec(tied: bool) -> Any:
        shapes: dict[str, tuple[int, ...]] = (
            {} if tied else {"output.weight": (1, 1)}
        )  # only its presence is read
        facts = GGUFFacts(arch, meta, {}, {}, shapes)
        return spec_from_config(
            config_from_gguf(facts, "the log"), name=name, source="the log's hyperparameters"
        )

    params = extra.get("model_params")
    untied, tied = spec(False), spec(True)
    if isinstance(params, int) and params > 0:
        counts = [breakdown(s, 1, 1, 0).total_params for s in (untied, tied)]
        chosen = tied if abs(counts[1] - params) < abs(counts[0] - params) else untied
    else:
        chosen = untied
    ftype = quantization or None
    quant = gguf_quant(ftype) if ftype else None
    bpw = extra.get("file_bpw")
    if quant is None and ftype:
        quant = QuantSpec("gguf", float(bpw or 16.0), gguf_type=ftype.upper(), unquantized_dtype="float32")
    file_bytes = extra.get("file_bytes")
    return chosen.with_(
        quant=quant,
        weights_bytes_exact=file_bytes if isinstance(file_bytes, int) and file_bytes > 0 else None,
        param_count_exact=params if isinstance(params, int) and params > 0 else None,
        weights_source="the log's `file size` (the tensors' total)" if file_bytes else None,
    )


__all__ = ["HPARAM_KEYS", "RULES", "metadata", "missing", "spec_from_log"]
