"""TTFT split into the engine's prefill and everything before it, from server-reported timings.

An engine that reports its own per-request timings (llama-server's ``timings`` object, kept in
each record's ``server_timings``) says how long it spent on the prompt: ``prompt_ms``, from the
moment a slot took the request to the logits of the first token, for the ``prompt_n`` tokens it
evaluated (``cache_n`` more came from its prefix cache). The client's TTFT contains that span, so
for every such request

    ttft_ms = client_minus_prefill_ms + prefill_ms

* ``prefill_ms`` = ``timings.prompt_ms``: compute, and what the prefix cache saves;
* ``client_minus_prefill_ms`` = TTFT - ``prompt_ms``: network, HTTP and router time, the wait for
  a free slot (queue), and sampling and sending the first token.

A negative difference (a client TTFT shorter than the server's own prefill) means the two do not
describe the same request, e.g. a router retried it elsewhere: it is counted in
``ttft_below_prefill`` and recorded as 0. Requests without ``prompt_ms`` (vLLM, SGLang, the sim)
are left out; ``requests`` says how many of ``requests_with_ttft`` had it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from analysis import hlog
from analysis.distribution import PERCENTILES, distribution
from analysis.metric_registry import TURN_CLASSES
from analysis.records import RequestRecord

__all__ = ["SPLIT_SOURCE", "prefill_us", "ttft_split"]

SPLIT_SOURCE = "server_timings.prompt_ms"


def prefill_us(rec: RequestRecord) -> int | None:
    """``server_timings.prompt_ms`` in µs (rounded), or None when the record lacks a number there."""
    t = rec.server_timings
    if not isinstance(t, dict):
        return None
    ms = t.get("prompt_ms")
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
        return None
    return round(ms * 1000)


def ttft_split(
    measured: Iterable[RequestRecord], *, percentiles: tuple[float, ...] | None = None
) -> dict[str, Any] | None:
    """The split over the successful ``measured`` requests with a TTFT, overall and by turn class.

    Returns None when none of them carries ``server_timings.prompt_ms``. Otherwise a group
    (``requests``, ``requests_with_ttft``, ``ttft_below_prefill``, ``ttft_ms``, ``prefill_ms``,
    ``client_minus_prefill_ms``: distributions in ms over the same requests, ``prefill_share``:
    total prefill ÷ total TTFT, ``prompt_tokens_evaluated`` / ``prompt_tokens_cached``: sums of
    ``prompt_n`` / ``cache_n``, ``cached_share``) plus ``source`` and ``by_turn_class``.
    """
    with_ttft = [r for r in measured if r.ok and r.ttft_us is not None]
    if not any(prefill_us(r) is not None for r in with_ttft):
        return None
    out: dict[str, Any] = {"source": SPLIT_SOURCE, **_group(with_ttft, percentiles)}
    classes = {r.turn_class for r in with_ttft}
    order = [c for c in TURN_CLASSES if c in classes] + sorted(classes - set(TURN_CLASSES))
    out["by_turn_class"] = {
        tc: _group([r for r in with_ttft if r.turn_class == tc], percentiles) for tc in order
    }
    return out


def _group(with_ttft: list[RequestRecord], percentiles: tuple[float, ...] | None) -> dict[str, Any]:
    pct = percentiles or PERCENTILES
    ttft_h, prefill_h, rest_h = hlog.new_histogram(), hlog.new_histogram(), hlog.new_histogram()
    n = below = 0
    ttft_sum = prefill_sum = 0
    evaluated = cached = 0
    have_tokens = False
    for r in with_ttft:
        p = prefill_us(r)
        if p is None:
            continue
        ttft = r.ttft_us
        assert ttft is not None  # with_ttft holds only requests with a first token
        n += 1
        rest = ttft - p
        if rest < 0:
            below += 1
            rest = 0
        ttft_h.record_value(hlog.clamp_us(ttft))
        prefill_h.record_value(hlog.clamp_us(p))
        rest_h.record_value(hlog.clamp_us(rest))
        ttft_sum += ttft
        prefill_sum += p
        t = r.server_timings or {}
        pn, cn = t.get("prompt_n"), t.get("cache_n")
        if isinstance(pn, int) and isinstance(cn, int):
            have_tokens = True
            evaluated += pn
            cached += cn
    return {
        "requests": n,
        "requests_with_ttft": len(with_ttft),
        "ttft_below_prefill": below,
        "ttft_ms": distribution(ttft_h if n else None, percentiles=pct),
        "prefill_ms": distribution(prefill_h if n else None, percentiles=pct),
        "client_minus_prefill_ms": distribution(rest_h if n else None, percentiles=pct),
        "prefill_share": round(min(prefill_sum, ttft_sum) / ttft_sum, 4) if ttft_sum > 0 else None,
        "prompt_tokens_evaluated": evaluated if have_tokens else None,
        "prompt_tokens_cached": cached if have_tokens else None,
        "cached_share": round(cached / (cached + evaluated), 4)
        if have_tokens and cached + evaluated
        else None,
    }
