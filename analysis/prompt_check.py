"""The prompt-size check: the client's own count of each prompt against the server's ``usage``.

The client counts the contents of the messages it sends with the run's tokenizer (loadgen's own,
or ``--tokenizer``); the server's ``prompt_tokens`` also count the chat template (role markers,
the generation prompt, tool-call JSON). So the per-request difference is the template's share
plus any tokenizer mismatch: a steady few tokens per message is the template, a difference that
grows with the prompt means the tokenizer is not the model's and prompt sizes are off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.records import RequestRecord


def prompt_tokens_check(records: list[RequestRecord], tokenizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """Totals and per-request differences (server - client) over requests with both counts."""
    pairs = [(r.client_prompt_tokens, r.prompt_tokens) for r in records if r.client_prompt_tokens is not None and r.prompt_tokens is not None]
    if not pairs:
        return None
    client = np.array([c for c, _ in pairs], dtype=np.int64)
    server = np.array([s for _, s in pairs], dtype=np.int64)
    diff = server - client
    rel = diff / np.maximum(server, 1)
    p50, p99 = np.percentile(diff, [50, 99])
    # Server-side history (previous_response_id): of the client's count, what was never sent.
    held = [r.server_held_prompt_tokens for r in records if r.server_held_prompt_tokens is not None]
    out = {
        "tokenizer": (tokenizer or {}).get("name", "builtin"),
        "requests": len(pairs),
        "client_tokens": int(client.sum()),
        "server_tokens": int(server.sum()),
        "difference_tokens": int(diff.sum()),
        "difference_share": float(diff.sum() / max(int(server.sum()), 1)),
        "per_request": {
            "min": int(diff.min()),
            "p50": float(p50),
            "p99": float(p99),
            "max": int(diff.max()),
            "share_p50": float(np.percentile(rel, 50)),
            "share_max": float(np.abs(rel).max()),
        },
    }
    if held:
        out["server_held_tokens"] = int(sum(held))
        out["sent_tokens"] = int(client.sum()) - int(sum(held))
    return out


def format_prompt_check(check: dict[str, Any] | None) -> str | None:
    """One line for the text report."""
    if not check:
        return None
    d = check["per_request"]
    line = (
        f"prompt      server {check['server_tokens']:,} tokens vs client {check['client_tokens']:,} "
        f"({check['tokenizer']}): {check['difference_share']:+.2%}; per request {d['min']:+d} .. {d['max']:+d} "
        f"(p50 {d['p50']:+.0f}; the chat template's tokens are the server's only)"
    )
    if "server_held_tokens" in check:
        line += (
            f"; sent {check['sent_tokens']:,} of the client's, the server held the other "
            f"{check['server_held_tokens']:,} (server-side history)"
        )
    return line
