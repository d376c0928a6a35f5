"""The output-token check: what ``usage.completion_tokens`` claims against what arrived.

A server's ``usage`` is its exact count, and loadgen uses it, unless it claims fewer tokens than
the token-bearing chunks carried (impossible: then the chunks' count is used; docs/metrics.md).
Either way a disagreement is worth knowing: a usage that claims more tokens than arrived means
the server batched tokens into chunks without saying how many each carried (its TPOT then rests
on usage alone), or counts tokens it never streamed.
"""

from __future__ import annotations

from typing import Any

from analysis.records import RequestRecord

__all__ = ["usage_check", "usage_note"]


def usage_check(records: list[RequestRecord]) -> dict[str, Any] | None:
    """Over successful requests with both counts: how many disagree, which way, and by how much
    (``usage - chunks`` in tokens: min, max, and the sum); None when no request has both."""
    pairs = [
        (r.usage_completion_tokens, r.chunk_output_tokens)
        for r in records
        if r.ok and r.usage_completion_tokens is not None and r.chunk_output_tokens is not None
    ]
    if not pairs:
        return None
    diffs = [u - c for u, c in pairs if u != c]
    return {
        "requests": len(pairs),
        "disagree": len(diffs),
        "usage_above_chunks": sum(1 for d in diffs if d > 0),
        "usage_below_chunks": sum(1 for d in diffs if d < 0),
        "usage_minus_chunks_min": min(diffs) if diffs else 0,
        "usage_minus_chunks_max": max(diffs) if diffs else 0,
        "usage_minus_chunks_sum": sum(diffs),
        "count_used": "usage, unless it is below the chunks' count",
    }


def usage_note(check: dict[str, Any] | None) -> str | None:
    """One line for the summary's notes when any reply's usage disagreed with its chunks."""
    if not check or not check["disagree"]:
        return None
    return (
        f"{check['disagree']} of {check['requests']} replies: usage.completion_tokens disagreed with the tokens "
        f"their chunks carried ({check['usage_above_chunks']} above, {check['usage_below_chunks']} below; usage - "
        f"chunks from {check['usage_minus_chunks_min']} to {check['usage_minus_chunks_max']} tokens); the count used "
        "is usage unless it is below the chunks' count"
    )
