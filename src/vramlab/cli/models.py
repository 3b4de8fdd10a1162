"""List the bundled model catalog, filterable by family, text, size and quantization.

`vramlab models NAME` shows what vramlab reads for one model instead: a catalog name, alias or
Hub id, a local directory, `config.json` or `.gguf` (the same resolution `plan --model` uses).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.capacity.spec import ModelSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", help="show one model's facts (catalog name, Hub id, directory, config.json, .gguf)"
    )
    parser.add_argument(
        "--online", action="store_true", help="with NAME: allow reading a Hub id that is not in the catalog"
    )
    parser.add_argument("--revision", help="with NAME and --online: a Hub branch, tag or commit")
    parser.add_argument(
        "--family", help="only this family (llama, qwen, mistral, gemma, phi, deepseek, gpt-oss, granite)"
    )
    parser.add_argument(
        "--search", metavar="TEXT", help="only entries whose name, Hub id or alias contains TEXT"
    )
    parser.add_argument("--min-params", type=float, metavar="B", help="at least B billion parameters")
    parser.add_argument("--max-params", type=float, metavar="B", help="at most B billion parameters")
    parser.add_argument(
        "--quantized",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only quantized checkpoints (--no-quantized: only unquantized ones)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    from vramlab.errors import VramlabError
    from vramlab.sources.catalog import load_catalog

    if args.name:
        return _show(args)
    catalog = load_catalog()
    if args.family and args.family.lower() not in catalog.families:
        raise VramlabError(f"unknown family {args.family!r}; families: {', '.join(catalog.families)}")
    entries = catalog.filter(
        family=args.family,
        text=args.search,
        min_params_b=args.min_params,
        max_params_b=args.max_params,
        quantized=args.quantized,
    )
    if args.json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
        return 0
    if not entries:
        print("no catalog entry matches; `vramlab models` lists them all")
        return 0
    rows = [("NAME", "FAMILY", "PARAMS", "QUANT", "HUGGING FACE ID")]
    rows += [(e.name, e.family, f"{e.params_b:g}B", e.quant_label or "-", e.hf_id) for e in entries]
    print(render_table(rows, right_aligned={2}))
    print(
        f"\n{len(entries)} of {len(catalog)} models. `vramlab plan --model NAME` takes a name, alias or Hub id."
    )
    return 0


def render_table(
    rows: Sequence[Sequence[str]], right_aligned: frozenset[int] | set[int] = frozenset()
) -> str:
    """Plain aligned columns (no rich: this command must start fast)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right_aligned else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    from vramlab.sources import resolve_model
    from vramlab.sources.catalog import find_entry

    spec = resolve_model(
        args.name, offline=not args.online, revision=args.revision, online_hint="pass --online"
    )
    entry = find_entry(args.name) if args.revision is None else None
    facts = spec_facts(spec)
    if args.json:
        out = {**(entry.to_json() if entry else {}), "spec": facts}
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    if entry:
        rows += [
            ("name", entry.name),
            ("hugging face id", entry.hf_id),
            ("aliases", ", ".join(entry.aliases) or "-"),
            ("family", entry.family),
            ("parameters", f"{entry.params_b:g}B (published)"),
        ]
        if entry.note:
            rows.append(("note", entry.note))
    rows += [(k.replace("_", " "), _fmt(v)) for k, v in facts.items() if v not in (None, 0, "", [], {})]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0


def spec_facts(spec: ModelSpec) -> dict[str, Any]:
    """The memory-relevant facts of a ModelSpec, for display and --json."""
    kinds: dict[str, int] = {}
    for k in spec.kinds:
        kinds[k] = kinds.get(k, 0) + 1
    q = spec.quant
    return {
        "source": spec.source,
        "architecture": spec.architecture,
        "model_type": spec.model_type,
        "num_layers": spec.num_layers,
        "layer_kinds": kinds,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "torch_dtype": spec.torch_dtype,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "sliding_window": spec.sliding_window,
        "attention_chunk_size": spec.attention_chunk_size,
        "kv_lora_rank": spec.kv_lora_rank,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_shared_experts": spec.num_shared_experts,
        "quantization": None
        if q is None
        else {"method": q.method, "bits": q.bits, "group_size": q.group_size, "gguf_type": q.gguf_type},
        "weights_bytes_exact": spec.weights_bytes_exact,
        "weights_bytes_by_dtype": spec.weights_bytes_by_dtype,
        "param_count_exact": spec.param_count_exact,
        "weights_source": spec.weights_source,
    }


def _fmt(v: object) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items() if x not in (None, 0))
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and v >= 1 << 20:
        return f"{v:,} ({v / (1 << 30):.2f} GiB)"
    return str(v)
