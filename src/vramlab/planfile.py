"""The one loader for YAML plan files: run plans, drill plans, pack's fleet and models files.

A file is read, parsed (YAML, keeping every key's line) and validated against a pydantic model;
every problem becomes one `ConfigError` line that names the file, the line and the field:

    plan.yaml:12: change.steps[1]: Input should be greater than 0
    fleet.yaml:5: nodes[1].gpu: unknown GPU 'h10'; did you mean 'h100-80gb'?

Lines: a mapping entry is reported at its key's line, a sequence item where it starts, and a
field that is missing at its parent's key. A validator may name the field it is about with a
leading "@path: " in its message ("@change.variable: request_rate needs load.mode: open").

    doc = read_yaml("plan.yaml", what="plan")      # ConfigError: no such file, not valid YAML
    plan = validate(Plan, doc, kind="a plan", keys="name:, target:, ...")
    plan = validate_plan({"experiment": Plan}, doc)  # a plan document: its kind: picks the model,
                                                     # older names load with a note (vramlab.plandoc)
    doc.where(("nodes", 1, "gpu"))                  # "fleet.yaml:5", for checks after validation

Like `vramlab.errors`, every package that reads a plan may import this module; PyYAML and
pydantic are imported on first use, not with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from vramlab.errors import ConfigError

M = TypeVar("M")
Loc = tuple[Any, ...]


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML document and the 1-based line of every mapping key and sequence item."""

    name: str  # how errors name the file
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)
    from_text: bool = False  # parsed here: errors carry lines (an empty file has none, but line 1)

    def line_of(self, loc: Loc) -> int:
        """The line of *loc*, or of its deepest part that is in the file (1 when none is)."""
        for n in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:n]))
            if line is not None:
                return line
        return 1

    def where(self, loc: Loc) -> str:
        return f"{self.name}:{self.line_of(loc)}"


def parse_yaml(text: str, name: str) -> YamlDocument:
    """Parse YAML text; a syntax error is a ConfigError ``name:line: not valid YAML: problem``."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{name}:{line}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply to be a plan") from None
    lines: dict[Loc, int] = {}

    # Iterative, and each node once: an alias repeats a node (a cycle with `a: &a [*a]`), and a deep
    # document must not need a deep Python stack.
    seen: set[int] = set()
    stack: list[tuple[Any, Loc]] = [(node, ())] if node is not None else []
    while stack:
        n, at = stack.pop()
        lines.setdefault(at, n.start_mark.line + 1)
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            first: dict[str, int] = {}
            for k, v in n.value:
                key = (*at, k.value)
                if isinstance(k, yaml.ScalarNode) and k.value in first:
                    raise ConfigError(
                        f"{name}:{k.start_mark.line + 1}: duplicate key {k.value!r} (first at line "
                        f"{first[k.value]}); YAML keeps only the last, so say it once"
                    )
                first[k.value] = k.start_mark.line + 1
                lines[key] = k.start_mark.line + 1
                stack.append((k, key))
                stack.append((v, key))
        elif isinstance(n, yaml.ScalarNode):
            _yaml11(n, name)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                stack.append((item, (*at, i)))
    return YamlDocument(name, data, lines, from_text=True)


def _yaml11(n: Any, name: str) -> None:
    """Refuse the YAML 1.1 readings a plan's author rarely means, which YAML 1.2 reads as text:
    yes/no/on/off/y/n as booleans (`rounds: yes` was 1) and base-60 numbers (`1:30` was 90)."""
    if n.style is not None:  # quoted: text, as written
        return
    line = n.start_mark.line + 1
    if n.tag.endswith(":bool") and n.value.lower() not in ("true", "false"):
        raise ConfigError(
            f"{name}:{line}: {n.value!r} is a YAML 1.1 boolean; write true or false, or quote it for text"
        )
    if n.tag.endswith((":int", ":float")) and ":" in n.value:
        raise ConfigError(
            f"{name}:{line}: {n.value!r} is a YAML 1.1 base-60 number; write the number, or quote it for text"
        )


def read_yaml(path: str | Path, what: str = "plan") -> YamlDocument:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError naming *what* it is."""
    from vramlab.infile import YAML_BYTES, read_text

    p = Path(path)
    text = read_text(p, what, YAML_BYTES, expect=f"a {what} file is YAML in UTF-8")
    return parse_yaml(text, str(p))


def field_name(loc: Loc) -> str:
    """A pydantic location as a reader writes it: ``models[0].settings``."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).startswith(("function-", "function_")):
            continue  # pydantic's validator frames add nothing for a reader
        else:
            name = str(p) if str(p).isprintable() else repr(str(p))  # keep the error on one line
            out += ("." if out else "") + name
    return out or "(top level)"


def _first_error(exc: Any) -> tuple[Loc, str, str]:
    """(location, message, " (and N more)") of a pydantic ValidationError."""
    errs = exc.errors(include_url=False)
    first = errs[0]
    loc = tuple(first["loc"])
    msg = " ".join(str(first["msg"]).removeprefix("Value error, ").split())
    if msg.startswith("@"):  # a cross-field check names the field it is about: "@change.variable: ..."
        path, _, msg = msg[1:].partition(": ")
        loc = loc + tuple(int(p) if p.isdigit() else p for p in path.split("."))
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return loc, msg, more


def validate(
    model: type[M], doc: YamlDocument | Any, name: str = "plan", *, kind: str = "a plan", keys: str = ""
) -> M:
    """*doc* validated as *model* (a pydantic model class).

    *doc* is a YamlDocument (errors carry ``file:line``) or a document already in memory (errors
    carry *name* and the field). The top level must be a mapping: *kind* and *keys* word the error.
    Passwords in the document's URLs are registered for redaction before anything can print them.
    """
    from pydantic import ValidationError

    source = doc if isinstance(doc, YamlDocument) else YamlDocument(name, doc)
    data, name = source.data, source.name

    def at(loc: Loc) -> str:  # file:line when the text was parsed here, else just the name
        return source.where(loc) if source.from_text else name

    if data is None:
        raise ConfigError(f"{at(())}: the file is empty")
    if not isinstance(data, dict):
        hint = f" ({keys})" if keys else ""
        raise ConfigError(f"{at(())}: {kind} is a mapping{hint}, got {type(data).__name__}")
    check_document_size(data, name)
    from vramlab.redact import register_urls_in

    register_urls_in(data)  # a URL's password is masked wherever it shows up later (vramlab.redact)
    try:
        return model.model_validate(data)  # type: ignore[attr-defined, no-any-return]
    except ValidationError as exc:
        loc, msg, more = _first_error(exc)
        raise ConfigError(f"{at(loc)}: {field_name(loc)}: {msg}{more}") from None
    except ConfigError as exc:  # a validator that already worded a user error
        raise ConfigError(f"{name}: {exc}") from None


MAX_DOCUMENT_VALUES = 100_000


def check_document_size(data: Any, name: str) -> None:
    """Refuse a loaded document of more than MAX_DOCUMENT_VALUES values: YAML aliases can make a
    few lines mean millions of values ("billion laughs") or a cycle (`a: &a [*a]`), which would
    take validation minutes or end in a RecursionError."""
    seen, stack = 0, [data]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_VALUES:
            raise ConfigError(
                f"{name}: expands to more than {MAX_DOCUMENT_VALUES:,} values (YAML aliases that "
                "repeat or refer to themselves?); a plan is a few dozen settings"
            )
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def load(model: type[M], path: str | Path, *, what: str = "plan", kind: str = "a plan", keys: str = "") -> M:
    """Read *path* and validate it as *model*: `read_yaml` then `validate`."""
    return validate(model, read_yaml(path, what), kind=kind, keys=keys)


def validate_plan(
    models: dict[str, type[M]],
    doc: YamlDocument | Any,
    name: str = "plan",
    *,
    kind: str = "a plan",
    keys: str = "",
) -> M:
    """A plan document validated as the model its `kind:` picks among *models* (the first is the
    kind of a document without `kind:`). A kind that belongs to another command is one line naming
    that command; old field names load (vramlab.plandoc.upgrade) and their notes ride on the plan
    (`old_name_notes()`), each prefixed with the file's name."""
    from vramlab.plandoc import RENAMES, DocumentError, document_kind, upgrade

    source = doc if isinstance(doc, YamlDocument) else YamlDocument(name, doc)
    if not isinstance(source.data, dict):
        return validate(next(iter(models.values())), source, kind=kind, keys=keys)  # its one-line refusal
    check_document_size(source.data, source.name)

    def at(loc: Loc) -> str:
        return source.where(loc) if source.from_text else source.name

    try:
        which = document_kind(source.data, tuple(models))
        data, notes = upgrade(source.data, which)
    except DocumentError as exc:
        raise ConfigError(
            f"{at(exc.at)}: {field_name(exc.at)}: {str(exc).replace('PLAN.yaml', source.name)}"
        ) from None
    lines = dict(source.lines)
    for _, old, new in RENAMES:  # errors about a renamed field point at the line of its old name
        for loc, line in source.lines.items():
            if loc[: len(old)] == old:
                lines.setdefault((*new, *loc[len(old) :]), line)
    plan = validate(
        models[which], YamlDocument(source.name, data, lines, source.from_text), kind=kind, keys=keys
    )
    plan._old_names = tuple(f"{source.name}: {n}" for n in notes)  # type: ignore[attr-defined]
    return plan


__all__ = [
    "YamlDocument",
    "check_document_size",
    "field_name",
    "load",
    "parse_yaml",
    "read_yaml",
    "validate",
    "validate_plan",
]
