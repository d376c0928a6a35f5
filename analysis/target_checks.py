"""What run.json says about each target before load: its cold start and its quality gate.

Both are optional keys of a ``targets`` entry, written by the runtime (docs/results-format.md):
``cold_start`` (a list, one entry per process loadgen launched: ``name``, ``role``,
``listening_s``, ``healthy_s``, ``first_token_s``, seconds since that process's launch) and
``quality`` (``score``, ``correct``, ``total``, ``min_score``, ``passed``, ``items``). A target
loadgen did not launch has no ``cold_start``; one that was not evaluated has no ``quality``.
"""

from __future__ import annotations

from typing import Any

from analysis.html import esc, ok_mark, table

__all__ = ["target_checks_html", "target_checks_lines"]

_PHASES = (("listening_s", "listening"), ("healthy_s", "healthy"), ("first_token_s", "first token"))


def _s(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}"


def _gate(q: dict[str, Any]) -> str:
    if q.get("min_score") is None:
        return "no gate"
    return f"gate {q['min_score']:g}: {'pass' if q.get('passed') else 'FAIL'}"


def target_checks_lines(summary: dict[str, Any]) -> list[str]:
    """Plain-text lines for the terminal summary (none when no target has either)."""
    out: list[str] = []
    for t in summary.get("targets") or []:
        label = t.get("label")
        for cs in t.get("cold_start") or []:
            phases = ", ".join(f"{title} {_s(cs.get(key))} s" for key, title in _PHASES)
            err = f" ({cs['error']})" if cs.get("error") else ""
            out.append(f"cold start  {label}: {cs.get('role')} {cs.get('name')}: {phases} after launch{err}")
        q = t.get("quality")
        if q:
            wrong = [i["id"] for i in q.get("items") or [] if not i.get("correct")]
            shown = f"; wrong: {', '.join(wrong[:8])}{', ...' if len(wrong) > 8 else ''}" if wrong else ""
            out.append(
                f"quality     {label}: {q.get('correct')}/{q.get('total')} correct, score {q.get('score', 0):.3f}"
                f" ({_gate(q)}; eval {q.get('eval')}){shown}"
            )
    return out


def target_checks_html(summary: dict[str, Any]) -> str:
    """HTML tables for the report's targets section ('' when no target has either)."""
    parts: list[str] = []
    cold = [(t.get("label"), cs) for t in summary.get("targets") or [] for cs in t.get("cold_start") or []]
    if cold:
        rows = [
            [label, cs.get("role"), cs.get("name"), *(_s(cs.get(k)) for k, _ in _PHASES), cs.get("error") or ""]
            for label, cs in cold
        ]
        parts.append("<h3>Cold start (seconds from each process's launch)</h3>")
        parts.append(table(["target", "role", "process", *(t for _, t in _PHASES), "note"], rows, text_cols=(6,)))
    for t in summary.get("targets") or []:
        q = t.get("quality")
        if not q:
            continue
        verdict = ok_mark(q.get("passed"), "pass", "FAIL").html if q.get("min_score") is not None else "no gate"
        parts.append(
            f"<h3>Quality of {esc(t.get('label'))}: {esc(q.get('correct'))}/{esc(q.get('total'))} correct, "
            f"score {float(q.get('score', 0)):.3f} ({verdict}{'' if q.get('min_score') is None else ' at ' + esc(q['min_score'])}"
            f"; eval {esc(q.get('eval'))})</h3>"
        )
        rows = [
            [ok_mark(bool(i.get("correct")), "ok", "wrong"), i.get("id"), i.get("prompt"), i.get("expected"),
             i.get("answer") if i.get("answer") is not None else f"(no answer: {i.get('error')})"]
            for i in q.get("items") or []
        ]  # fmt: skip
        parts.append(table(["verdict", "id", "question", "expected", "answer"], rows, text_cols=(2, 3, 4)))
    return "".join(parts)
