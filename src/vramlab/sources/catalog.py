"""The bundled model catalog: popular open models with the config facts that drive memory.

`data/models.json` is a list of entries, each holding the Hugging Face `config.json` fields the
capacity model needs and the public source they were copied from (see docs/model-sources.md).
The file is read once, on first use. It is parsed with the standard library rather than
pydantic because `vramlab plan --model NAME` must answer in well under 0.3 s from a cold start;
the few checks below are what a schema would enforce.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlab.errors import ConfigError, unknown

if TYPE_CHECKING:
    from vramlab.capacity.spec import ModelSpec

CATALOG_PATH = Path(__file__).resolve().parent.parent / "data" / "models.json"

_REQUIRED = ("name", "hf_id", "family", "params_b", "source", "config")


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    hf_id: str
    family: str
    params_b: float
    source: str
    config: dict[str, Any] = field(compare=False, hash=False)
    aliases: tuple[str, ...] = ()
    note: str = ""

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        """The checkpoint's `quantization_config`, at the top level or inside `text_config`."""
        qc = self.config.get("quantization_config")
        if qc is None and isinstance(self.config.get("text_config"), dict):
            qc = self.config["text_config"].get("quantization_config")
        return qc if isinstance(qc, dict) else None

    @property
    def is_quantized(self) -> bool:
        return self.quantization_config is not None

    @property
    def quant_label(self) -> str:
        """A short label for listings: awq-4bit, gptq-4bit, fp8, bnb-nf4, w8a8-int8, mxfp4..."""
        qc = self.quantization_config
        if qc is None:
            return ""
        method = str(qc.get("quant_method", "?"))
        if method in ("awq", "gptq"):
            return f"{method}-{qc.get('bits', '?')}bit"
        if method == "bitsandbytes":
            return (
                "bnb-" + str(qc.get("bnb_4bit_quant_type", "nf4")) if qc.get("load_in_4bit") else "bnb-int8"
            )
        if method == "compressed-tensors":
            group = next(iter((qc.get("config_groups") or {}).values()), None) or {}
            weights, acts = group.get("weights") or {}, group.get("input_activations") or {}
            bits, kind = weights.get("num_bits"), weights.get("type")
            if kind == "float" and bits == 8:
                return "fp8"
            if not bits:
                return method
            act_bits = acts.get("num_bits", 16) if acts else 16
            return f"w{bits}a{act_bits}-{kind}{bits}"
        if method.startswith("modelopt"):  # hf_quant_config.json nests the algorithm under "quantization"
            nested = qc.get("quantization")
            algo = (nested if isinstance(nested, dict) else qc).get("quant_algo")
            return str(algo or method).lower()
        return method

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hf_id": self.hf_id,
            "aliases": list(self.aliases),
            "family": self.family,
            "params_b": self.params_b,
            "quantization": self.quant_label or None,
            "source": self.source,
        }

    def spec(self) -> ModelSpec:
        """The entry as a `ModelSpec` (architecture from the bundled config)."""
        from vramlab.sources.hf_config import spec_from_config

        return spec_from_config(self.config, name=self.name, source=self.source, hf_id=self.hf_id)


class Catalog:
    """Entries with a case-insensitive index of names, aliases, Hub ids and Hub repo names."""

    def __init__(self, entries: list[CatalogEntry]):
        self.entries: tuple[CatalogEntry, ...] = tuple(entries)
        self._index: dict[str, CatalogEntry] = {}
        repo_names: dict[str, list[CatalogEntry]] = {}
        for e in self.entries:
            for key in (e.name, e.hf_id, *e.aliases):
                k = key.lower()
                other = self._index.get(k)
                if other is not None and other is not e:
                    raise ConfigError(f"model catalog: {key!r} names both {other.name!r} and {e.name!r}")
                self._index[k] = e
            repo_names.setdefault(e.hf_id.rsplit("/", 1)[-1].lower(), []).append(e)
        # The bare repo name ("Llama-3.1-8B-Instruct") works too, where it is unambiguous.
        for k, es in repo_names.items():
            if len(es) == 1:
                self._index.setdefault(k, es[0])

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.entries)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def find(self, name: str) -> CatalogEntry | None:
        return self._index.get(name.strip().lower())

    def get(self, name: str) -> CatalogEntry:
        entry = self.find(name)
        if entry is None:
            raise unknown("model", name, self.names + [e.hf_id for e in self.entries])
        return entry

    def filter(
        self,
        *,
        family: str | None = None,
        text: str | None = None,
        min_params_b: float | None = None,
        max_params_b: float | None = None,
        quantized: bool | None = None,
    ) -> list[CatalogEntry]:
        """Entries matching every given criterion (text: substring of name, Hub id or alias)."""
        out = []
        needle = text.lower() if text else None
        for e in self.entries:
            if family and e.family.lower() != family.lower():
                continue
            if needle and not any(needle in s.lower() for s in (e.name, e.hf_id, *e.aliases)):
                continue
            if min_params_b is not None and e.params_b < min_params_b:
                continue
            if max_params_b is not None and e.params_b > max_params_b:
                continue
            if quantized is not None and e.is_quantized != quantized:
                continue
            out.append(e)
        return out

    @property
    def families(self) -> list[str]:
        return sorted({e.family for e in self.entries})


def _entry(raw: Any, i: int) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"model catalog entry {i}: expected an object, got {type(raw).__name__}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"model catalog entry {i} ({raw.get('name', '?')}): missing {', '.join(missing)}")
    if not isinstance(raw["config"], dict) or not raw["source"]:
        raise ConfigError(
            f"model catalog entry {raw['name']!r}: config must be an object and source non-empty"
        )
    return CatalogEntry(
        name=str(raw["name"]),
        hf_id=str(raw["hf_id"]),
        family=str(raw["family"]),
        params_b=float(raw["params_b"]),
        source=str(raw["source"]),
        config=raw["config"],
        aliases=tuple(str(a) for a in raw.get("aliases", ())),
        note=str(raw.get("note", "")),
    )


def parse_catalog(data: Any) -> Catalog:
    if not isinstance(data, list):
        raise ConfigError("model catalog: expected a JSON list of entries")
    return Catalog([_entry(raw, i) for i, raw in enumerate(data)])


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The bundled catalog, read once per process."""
    try:
        data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the bundled model catalog {CATALOG_PATH}: {exc}") from exc
    return parse_catalog(data)


def get_entry(name: str) -> CatalogEntry:
    """Look up a catalog entry by short name, alias or Hub id (case-insensitive)."""
    return load_catalog().get(name)


def find_entry(name: str) -> CatalogEntry | None:
    return load_catalog().find(name)
