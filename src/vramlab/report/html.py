"""HTML renderer: one self-contained file (inline CSS and SVG charts, no scripts, no fetches)."""

from __future__ import annotations

from html import escape

from vramlab.report.blocks import Block, Bullets, Chart, Table, Text
from vramlab.report.sections import Document
from vramlab.report.svg import render_svg

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;margin-top:1.8em}
.sub{color:#666;margin-top:0}table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;
overflow-x:auto}th,td{border:1px solid #ddd;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}code{background:#f3f3f3;padding:0 .2em}
svg{max-width:100%;height:auto;margin:.5em 0}.ct{font-size:13px;font-weight:600}.tk{font-size:10px;fill:#555}
.al{font-size:11px;fill:#333}.lg{font-size:11px}.empty{color:#888}
"""


def _inline(text: str) -> str:
    """Escape, then turn Markdown's `code` and **bold** (used by sections) into tags."""
    out, parts = [], escape(text).split("`")
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{part}</code>")
        else:
            bold = part.split("**")
            out.append("".join(f"<b>{b}</b>" if j % 2 else b for j, b in enumerate(bold)))
    return "".join(out)


def _block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>"
    if isinstance(block, Table):
        head = "".join(f"<th>{escape(h)}</th>" for h in block.headers)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
        cap = f"<caption>{escape(block.caption)}</caption>" if block.caption else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if isinstance(block, Chart):
        return f'<figure class="chart">{render_svg(block)}</figure>'
    raise TypeError(f"unknown block {type(block).__name__}")


def render(doc: Document) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(doc.title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(doc.title)}</h1>",
        f'<p class="sub">{escape(doc.subtitle)}</p>',
    ]
    for section in doc.sections:
        parts.append(f'<section id="{escape(section.id)}"><h2>{escape(section.title)}</h2>')
        parts += [_block(b) for b in section.blocks]
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
