"""HTML renderer: one self-contained file (inline CSS and SVG charts, no scripts, no fetches)."""

from __future__ import annotations

import re
from html import escape

from vramlab.report.blocks import Block, Bullets, Chart, Table, Text, Verdict
from vramlab.report.sections import Document
from vramlab.report.svg import render_svg

# Laid out for a laptop (1366-1400 px), a phone (390 px) and paper. The answer comes first (a
# coloured verdict box). Text columns wrap (a 250-character log line wraps inside its cell instead of
# widening the table), short numeric columns stay on one line and right-aligned; a table still wider
# than the screen (a phone) scrolls inside its own box, never the page; charts scale to the column;
# long tokens (hashes, URLs) break anywhere. The page loads nothing (see CSP below).
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1240px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.2em;overflow-wrap:anywhere}h2{font-size:1.2em;border-bottom:1px solid #ddd;
margin-top:1.8em}h3{font-size:1em;margin:1em 0 .3em}.sub{color:#666;margin-top:0}
p,li,h2,h3{overflow-wrap:anywhere}
.tw{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;max-width:100%}
figcaption{font-style:italic;color:#555;padding:.2em 0;font-size:.85em;overflow-wrap:anywhere}
figure.table{margin:.6em 0}figure.table table{margin:0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f5f5f5;font-weight:600;overflow-wrap:normal}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}td.n{white-space:nowrap}
code{background:#f3f3f3;padding:0 .2em;overflow-wrap:anywhere}
figure{margin:.5em 0}svg{max-width:100%;height:auto}figure.chart svg{width:100%;max-width:760px}
.ct{font-size:13px;font-weight:600}.tk{font-size:10px;fill:#555}
.al{font-size:11px;fill:#333}.lg{font-size:11px}.empty{color:#888}
.verdict{border-left:.4em solid #888;background:#f6f6f6;padding:.5em .9em;margin:.6em 0}
.verdict .vh{font-size:1.1em;font-weight:600;margin:.2em 0}.verdict ul{margin:.3em 0;padding-left:1.2em}
.verdict.held{border-color:#2ca02c;background:#eef8ee}.verdict.not-held{border-color:#d62728;background:#fcefee}
.verdict.recovered{border-color:#e8a317;background:#fdf6e6}
.appendix{margin-top:3em;border-top:3px double #bbb}.appendix h2{font-size:1.05em;color:#444}
@media (max-width:600px){body{padding:0 .6em;margin:.8em auto}h1{font-size:1.25em}.verdict .vh{font-size:1em}}
@media print{body{max-width:none;margin:0;padding:0;font-size:10pt}h2{break-after:avoid}
tr,figure.chart,svg,.verdict{break-inside:avoid}thead{display:table-header-group}table{font-size:8.5pt}
.tw{overflow:visible}}
@page{size:A4;margin:12mm}
"""

# Nothing may be fetched: inline styles and SVG only (a report opened offline or in a locked-down
# viewer looks the same, and cannot leak that it was opened).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_NUMERIC = re.compile(r"^[-+−]?[\d,]*\.?\d+\s*(%|×|s|ms|GiB|/s|x)?$|^–$|^[+-]?\d[\d,.]*\s*/\s*[\d,.]+$")


def _inline(text: str) -> str:
    """Escape, then turn the Markdown the sections use (`code`, **bold**, a whole _(aside)_) into tags,
    so no literal Markdown shows in the HTML."""
    aside = len(text) > 2 and text.startswith("_") and text.endswith("_")
    if aside:
        text = text[1:-1]
    out, parts = [], escape(text).split("`")
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{part}</code>")
        else:
            bold = part.split("**")
            out.append("".join(f"<b>{b}</b>" if j % 2 else b for j, b in enumerate(bold)))
    return f"<em>{''.join(out)}</em>" if aside else "".join(out)


def numeric_columns(table: Table) -> set[int]:
    """Columns whose every cell is a short number (with its unit): right-aligned, kept on one line."""
    out = set()
    for i in range(len(table.headers)):
        cells = [r[i] for r in table.rows if i < len(r)]
        if (
            cells
            and any(c != "–" for c in cells)
            and all(len(c) <= 16 and _NUMERIC.match(c.strip()) for c in cells)
        ):
            out.add(i)
    return out


def _table(block: Table) -> str:
    num = numeric_columns(block)

    def cls(i: int) -> str:
        return ' class="n"' if i in num else ""

    head = "".join(f"<th{cls(i)}>{_inline(h)}</th>" for i, h in enumerate(block.headers))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{_inline(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in block.rows
    )
    # The wrapper scrolls sideways when the table cannot fit (a phone), so the page never does; the
    # caption stands outside it, so it wraps to the screen instead of scrolling with the columns.
    table = f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    if not block.caption:
        return table
    return f'<figure class="table"><figcaption>{_inline(block.caption)}</figcaption>{table}</figure>'


def _block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Chart):
        return f'<figure class="chart">{render_svg(block)}</figure>'
    if isinstance(block, Verdict):
        details = "".join(f"<li>{_inline(d)}</li>" for d in block.details)
        return (
            f'<div class="verdict {escape(block.status)}" id="verdict" role="status">'
            f'<p class="vh">{_inline(block.headline)}</p>'
            + (f"<ul>{details}</ul>" if details else "")
            + "</div>"
        )
    raise TypeError(f"unknown block {type(block).__name__}")


def render(doc: Document) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(doc.title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(doc.title)}</h1>",
        f'<p class="sub">{escape(doc.subtitle)}</p>',
    ]
    appendix = False
    for section in doc.sections:
        if section.appendix and not appendix:
            appendix = True
            parts.append('<div class="appendix" id="appendix"><h2>Appendix</h2>')
        tag = "h3" if section.appendix else "h2"
        parts.append(f'<section id="{escape(section.id)}"><{tag}>{escape(section.title)}</{tag}>')
        parts += [_block(b) for b in section.blocks]
        parts.append("</section>")
    if appendix:
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
