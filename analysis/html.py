"""The HTML page shell shared by the reports: one self-contained file, inline CSS, no script."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from analysis.svg import CSS as SVG_CSS

_CSS = """
:root { --fg: #1b1f24; --muted: #5b6570; --line: #d8dde3; --bg-alt: #f6f8fa; --bad: #b3261e; --good: #1a7f37; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); }
main { max-width: 1020px; margin: 0 auto; padding: 24px 20px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 34px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; }
p.meta, .muted { color: var(--muted); }
table { border-collapse: collapse; margin: 6px 0 12px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { font-weight: 600; background: var(--bg-alt); }
tr:nth-child(even) td { background: #fbfcfd; }
td.text, th.text { text-align: left; white-space: normal; }
.banner { padding: 10px 14px; border-radius: 6px; margin: 12px 0; border: 1px solid; }
.banner.bad { background: #fdecea; border-color: #f1b8b4; color: #6b1410; }
.banner.warn { background: #fff8e1; border-color: #f0d98c; color: #5c4400; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.badge.good { background: #dafbe1; color: var(--good); }
.badge.bad { background: #fdecea; color: var(--bad); }
.ok { color: var(--good); font-weight: 600; }
.fail { color: var(--bad); font-weight: 600; }
ul.verdicts li { margin: 3px 0; }
figure { margin: 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 10px 18px; }
pre { background: var(--bg-alt); padding: 10px; overflow-x: auto; font-size: 12px; border-radius: 6px; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""


def esc(x: object) -> str:
    return escape("" if x is None else str(x))


def page(title: str, body: Iterable[str]) -> str:
    """A complete HTML document; ``body`` parts are already-escaped HTML."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}{SVG_CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def section(id_: str, title: str, *parts: str) -> str:
    return f'<section id="{esc(id_)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def table(header: Sequence[str], rows: Iterable[Sequence[object]], *, text_cols: Iterable[int] = ()) -> str:
    """A table; cells are escaped unless they are ``Raw``. ``text_cols`` are left-aligned and wrap."""
    tc = set(text_cols)

    def cell(tag: str, i: int, v: object) -> str:
        cls = ' class="text"' if i in tc else ""
        content = v.html if isinstance(v, Raw) else esc(v)
        return f"<{tag}{cls}>{content}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Raw:
    """Trusted HTML for a table cell (already escaped)."""

    def __init__(self, html: str) -> None:
        self.html = html


def ok_mark(ok: bool | None, yes: str = "ok", no: str = "missed") -> Raw:
    if ok is None:
        return Raw('<span class="muted">-</span>')
    return Raw(f'<span class="{"ok" if ok else "fail"}">{esc(yes if ok else no)}</span>')


def charts(*svgs: str) -> str:
    return f'<div class="charts">{"".join(f"<figure>{s}</figure>" for s in svgs)}</div>'


__all__ = ["Raw", "charts", "esc", "ok_mark", "page", "section", "table"]
