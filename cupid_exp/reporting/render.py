"""The report as Markdown, HTML or CSV, by pandas; the HTML is one self-contained page."""

from __future__ import annotations

import base64
import html
from typing import Sequence

import pandas as pd

from cupid_exp.reporting.tables import Table

FORMATS = ("markdown", "csv", "html")
STYLE = ("body{font-family:sans-serif;font-size:14px;max-width:100%} table{border-collapse:collapse}"
         ".scroll{overflow-x:auto;max-width:100%;margin-bottom:8px}"
         "td,th{border:1px solid #ccc;padding:3px 6px;white-space:nowrap} tr.paper{color:#666;"
         "font-style:italic;background:#f6f6f6} figure{display:inline-block;margin:0 12px 12px 0;max-width:100%}"
         "figure img{max-width:100%;height:auto} figcaption{font-size:12px;color:#444}")
Image = tuple[str, bytes]  # (caption, PNG bytes)


def _markdown_table(frame: pd.DataFrame) -> str:
    # cells are finished text: no number parsing (it would reformat '4.70'), and a '|' must not split a cell
    escaped = frame.astype(str).map(lambda text: text.replace("|", "\\|"))
    return escaped.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)


def _html_table(frame: pd.DataFrame) -> str:
    """``to_html``, with the paper's rows (first cell 'paper: …') in class ``paper``."""
    text = frame.to_html(index=False, border=0)
    head, body = text.split("<tbody>", 1)
    chunks = body.split("<tr>")
    paper = frame.iloc[:, 0].astype(str).str.startswith("paper:").tolist() if len(frame.columns) else []
    return head + "<tbody>" + chunks[0] + "".join(
        ('<tr class="paper">' if is_paper else "<tr>") + chunk
        for is_paper, chunk in zip(paper, chunks[1:], strict=False))


def _figure(caption: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(caption, quote=True)}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def render(tables: Sequence[Table], notes: Sequence[str], fmt: str, images: Sequence[Image] = ()) -> str:
    """The report in ``fmt``; ``images`` (caption, PNG) go inside an HTML page (the other formats name files)."""
    if fmt == "csv":  # every number of every table, a row each (the tables' ``long`` frames, columns united)
        frames = [t.long for t in tables if not t.long.empty]
        return pd.concat(frames, ignore_index=True).to_csv(index=False) if frames else ""
    if fmt == "markdown":
        out = []
        for t in tables:
            out += [f"### {t.title}", "", _markdown_table(t.frame), ""]
            out += [f"- {n}" for n in t.notes] + ([""] if t.notes else [])
        if notes:
            out += ["Notes:", ""] + [f"- {n}" for n in notes]
        return "\n".join(out) + "\n"
    if fmt != "html":
        raise ValueError(f"format {fmt!r}; expected one of {', '.join(FORMATS)}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>CUPID report</title><style>{STYLE}</style>"
             "</head><body>"]
    for t in tables:
        parts.append(f"<h3>{html.escape(t.title)}</h3>")
        parts.append(f"<div class='scroll'>{_html_table(t.frame)}</div>")
        parts.extend(f"<p>{html.escape(n)}</p>" for n in t.notes)
    if notes:  # above the plots: what was left out (a failed run, a subset) is read with the tables
        parts.append("<h4>Notes</h4><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if images:
        parts.append("<h3>Plots</h3>")
        parts.extend(_figure(caption, png) for caption, png in images)
    parts.append("</body></html>")
    return "\n".join(parts)
