"""Markdown renderer: GitHub-flavoured tables; charts become a pointer to the HTML report."""

from __future__ import annotations

from vramlab.report.blocks import Block, Bullets, Chart, Table, Text, Verdict
from vramlab.report.sections import Document


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _block(block: Block) -> str:
    if isinstance(block, Text):
        return block.text
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Table):
        lines = []
        if block.caption:
            lines.append(f"*{block.caption}*\n")
        lines.append("| " + " | ".join(_cell(h) for h in block.headers) + " |")
        lines.append("|" + "|".join("---" for _ in block.headers) + "|")
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        return "\n".join(lines)
    if isinstance(block, Chart):
        return f"*Chart: {block.title} (see `--format html`)*"
    if isinstance(block, Verdict):  # a quote block: the answer stands apart from the sections' text
        details = [f"> - {d}" for d in block.details]
        return "\n".join([f"> **{block.headline}**", *([">", *details] if details else [])])
    raise TypeError(f"unknown block {type(block).__name__}")


def render(doc: Document) -> str:
    parts = [f"# {doc.title}", "", f"_{doc.subtitle}_", ""]
    appendix = False
    for section in doc.sections:
        if section.appendix and not appendix:
            appendix = True
            parts += ["## Appendix", ""]
        parts += [f"{'###' if section.appendix else '##'} {section.title}", ""]
        for block in section.blocks:
            parts += [_block(block), ""]
    return "\n".join(parts).rstrip() + "\n"
