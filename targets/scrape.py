"""Server metrics: read a Prometheus ``/metrics`` page and pick the numbers a load test needs.

``parse_text`` reads the Prometheus text exposition format (``# HELP``, ``# TYPE``, samples with
labels and escaped label values, optional timestamps; OpenMetrics' ``# EOF`` is accepted) into a
``Metrics`` object. ``scrape(url, timeout_s)`` fetches and parses. ``diff(before, after)`` turns
two scrapes into the counter increase over the window between them (histogram buckets, sums
and counts included; a counter that went down was reset, and its new value is the increase).

Engine-aware helpers read the engines' own names:

==============  ==========================================  ===============================  ==========================
engine          prefix-cache hit rate                       mean queue time                  queue depth
==============  ==========================================  ===============================  ==========================
vLLM            ``vllm:prefix_cache_hits_total`` /          ``vllm:request_queue_time_       ``vllm:num_requests_
                ``vllm:prefix_cache_queries_total``         seconds`` (histogram)            waiting``
                (tokens); v0: ``vllm:gpu_prefix_cache_
                hit_rate``
SGLang          ``sglang:cached_tokens_total`` /            ``sglang:queue_time_seconds``    ``sglang:num_queue_reqs``
                ``sglang:prompt_tokens_total``, else the
                ``sglang:cache_hit_rate`` gauge
llama-server    ``llamacpp:prompt_tokens_cached_total`` /   not exported                     ``llamacpp:requests_
                (that + ``llamacpp:prompt_tokens_total``,                                    deferred``
                which excludes cached tokens); older
                builds lack it: use each request's
                ``timings.cache_n``
sim             ``sim:prefix_cache_hits_total`` /           ``sim:queue_time_seconds``       ``sim:num_requests_
                ``sim:prefix_cache_queries_total``, else                                     waiting``
                the ``sim:prefix_cache_hit_rate`` gauge
==============  ==========================================  ===============================  ==========================

Mean TTFT on the engine's side: ``vllm:time_to_first_token_seconds`` or
``sglang:time_to_first_token_seconds`` (histograms). Preemptions: ``vllm:num_preemptions_total`` (vLLM; the sim exports it too) or
``sim:num_preemptions_total``. The sim exports vLLM's names beside its own (docs/sim.md); a page
with ``sim:`` names is the sim's, and the vLLM names give the same picks.

Series with different labels (engines, data-parallel ranks) are summed; a gauge hit rate is
averaged. Every helper returns None when the page lacks what it needs.
"""

from __future__ import annotations

import http.client
import math
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field

from .errors import TargetError

__all__ = [
    "Histogram",
    "MetricFamily",
    "Metrics",
    "Sample",
    "diff",
    "engine_of",
    "http_get",
    "mean_queue_time_s",
    "mean_ttft_s",
    "parse_text",
    "preemptions",
    "prefix_cache_hit_rate",
    "queue_depth",
    "scrape",
    "summarize",
]

ENGINE_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp", "sim:": "sim"}

# Sample-name suffixes that belong to a family of another name.
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gsum", "_gcount", "_info")
# Samples whose value only grows (what diff keeps).
_MONOTONIC_SUFFIXES = ("_total", "_count", "_sum", "_bucket")

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the page: ``name{labels} value [timestamp_ms]``; labels sorted by key."""

    name: str
    labels: Labels
    value: float
    timestamp_ms: int | None = None

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(slots=True)
class MetricFamily:
    """A ``# TYPE`` group: ``type`` is counter, gauge, histogram, summary or untyped."""

    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram summed over matching series: cumulative ``buckets`` as (upper bound, count)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as Prometheus' ``histogram_quantile``."""
        if not self.buckets or self.count <= 0:
            return None
        rank = q * self.buckets[-1][1]
        prev_le, prev_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if math.isinf(le):
                    return prev_le
                if n == prev_n:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
            prev_le, prev_n = le, n
        return prev_le


class Metrics:
    """A parsed page: families by name and an index of samples by sample name."""

    def __init__(self, families: dict[str, MetricFamily] | None = None, invalid_lines: int = 0) -> None:
        self.families: dict[str, MetricFamily] = families or {}
        self.invalid_lines = invalid_lines
        self._by_name: dict[str, list[Sample]] = {}
        for fam in self.families.values():
            for s in fam.samples:
                self._by_name.setdefault(s.name, []).append(s)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    def __contains__(self, sample_name: str) -> bool:
        return sample_name in self._by_name

    def sample_names(self) -> list[str]:
        return sorted(self._by_name)

    def samples(self, name: str, **labels: str) -> list[Sample]:
        """Samples called ``name`` whose labels include all of ``labels``."""
        out = self._by_name.get(name, [])
        if labels:
            want = labels.items()
            out = [s for s in out if all(s.label(k) == v for k, v in want)]
        return out

    def value(self, name: str, *, agg: str = "sum", **labels: str) -> float | None:
        """``sum`` (default), ``max`` or ``mean`` of the matching samples; None if there are none."""
        vals = [s.value for s in self.samples(name, **labels) if not math.isnan(s.value)]
        if not vals:
            return None
        if agg == "sum":
            return math.fsum(vals)
        if agg == "max":
            return max(vals)
        if agg == "mean":
            return math.fsum(vals) / len(vals)
        raise ValueError(f"agg must be sum, max or mean, not {agg!r}")

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """Histogram ``name`` (without suffix), buckets summed by bound over matching series."""
        by_le: dict[float, float] = {}
        for s in self.samples(name + "_bucket", **labels):
            le = s.label("le")
            if le is None:
                continue
            try:
                bound = float(le)
            except ValueError:
                continue
            by_le[bound] = by_le.get(bound, 0.0) + s.value
        total = self.value(name + "_sum", **labels)
        count = self.value(name + "_count", **labels)
        if not by_le and count is None:
            return None
        return Histogram(tuple(sorted(by_le.items())), total or 0.0, count or 0.0)


# ---- parsing -----------------------------------------------------------------------------------


def parse_text(text: str) -> Metrics:
    """Parse the Prometheus text exposition format. Lines that do not parse are counted in
    ``invalid_lines`` and skipped, so one odd line never loses the page."""
    families: dict[str, MetricFamily] = {}
    invalid = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line[1:].split(None, 3)
            if len(parts) >= 3 and parts[0] in ("HELP", "TYPE"):
                fam = families.get(parts[1])
                if fam is None:
                    fam = families[parts[1]] = MetricFamily(parts[1])
                rest = line[1:].split(None, 2)[2] if parts[0] == "HELP" else parts[2]
                if parts[0] == "HELP":
                    fam.help = _unescape_help(rest)
                else:
                    fam.type = rest.strip().lower()
            continue
        try:
            sample = _parse_sample(line)
        except ValueError:
            invalid += 1
            continue
        _family_for(families, sample.name).samples.append(sample)
    return Metrics(families, invalid)


def _family_for(families: dict[str, MetricFamily], sample_name: str) -> MetricFamily:
    fam = families.get(sample_name)
    if fam is not None:
        return fam
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix):
            fam = families.get(sample_name[: -len(suffix)])
            if fam is not None:
                return fam
    fam = families[sample_name] = MetricFamily(sample_name)
    return fam


def _is_name_char(c: str) -> bool:
    return c.isalnum() or c in "_:"


def _parse_sample(line: str) -> Sample:
    n = len(line)
    i = 0
    while i < n and _is_name_char(line[i]):
        i += 1
    name = line[:i]
    if not name or name[0].isdigit():
        raise ValueError("bad metric name")
    labels: list[tuple[str, str]] = []
    if i < n and line[i] == "{":
        i += 1
        while True:
            while i < n and line[i] in " \t,":
                i += 1
            if i < n and line[i] == "}":
                i += 1
                break
            j = i
            while j < n and _is_name_char(line[j]):
                j += 1
            key = line[i:j]
            while j < n and line[j] in " \t":
                j += 1
            if not key or j + 1 >= n or line[j] != "=" or line[j + 1] != '"':
                raise ValueError("bad label")
            j += 2
            chars: list[str] = []
            while True:
                if j >= n:
                    raise ValueError("unterminated label value")
                c = line[j]
                if c == "\\" and j + 1 < n:
                    nxt = line[j + 1]
                    chars.append("\n" if nxt == "n" else nxt)
                    j += 2
                    continue
                if c == '"':
                    j += 1
                    break
                chars.append(c)
                j += 1
            labels.append((key, "".join(chars)))
            i = j
    rest = line[i:].split()
    if not rest or len(rest) > 2:
        raise ValueError("bad value")
    value = float(rest[0])  # accepts NaN, +Inf, -Inf
    ts = int(rest[1]) if len(rest) == 2 else None
    return Sample(name, tuple(sorted(labels)), value, ts)


def _unescape_help(s: str) -> str:
    """HELP text escapes only backslash and newline."""
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "\\n":
            out.append("\n" if s[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# ---- windows -----------------------------------------------------------------------------------


def diff(before: Metrics, after: Metrics) -> Metrics:
    """The increase of every counter-like sample between two scrapes.

    Kept: samples of counter, histogram and summary families ending in ``_total``, ``_count``,
    ``_sum`` or ``_bucket`` (and untyped ones with those names). Gauges and ``_created`` are
    dropped. A series that went down was reset: its increase is its new value; a series absent
    before counts from zero.
    """
    old = {(s.name, s.labels): s.value for fam in before.families.values() for s in fam.samples}
    families: dict[str, MetricFamily] = {}
    for fam in after.families.values():
        if fam.type == "gauge":
            continue
        kept = []
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if fam.type != "counter" and not s.name.endswith(_MONOTONIC_SUFFIXES):
                continue  # summary quantiles, info and unknown samples
            prev = old.get((s.name, s.labels))
            delta = s.value if prev is None or s.value < prev else s.value - prev
            kept.append(Sample(s.name, s.labels, delta))
        if kept:
            families[fam.name] = MetricFamily(fam.name, fam.type, fam.help, kept)
    return Metrics(families)


# ---- engine-aware picks ------------------------------------------------------------------------


def engine_of(metrics: Metrics) -> str | None:
    """The engine whose metric prefix dominates the page (vllm, sglang, llama.cpp, sim); a page
    with ``sim:`` names is the sim's, though it exports vLLM's names too."""
    counts: dict[str, int] = {}
    for name in metrics.sample_names():
        for prefix, engine in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                counts[engine] = counts.get(engine, 0) + 1
    if "sim" in counts:
        return "sim"
    return max(counts, key=counts.__getitem__) if counts else None


def _ratio(metrics: Metrics, num: str, den: str) -> float | None:
    n, d = metrics.value(num), metrics.value(den)
    if n is None or d is None or d <= 0:
        return None
    return n / d


def _gauge_rate(metrics: Metrics, name: str) -> float | None:
    v = metrics.value(name, agg="mean")
    if v is None:
        return None
    return v / 100.0 if v > 1.0 else v  # some SGLang versions export a percentage


def prefix_cache_hit_rate(metrics: Metrics) -> float | None:
    """Share of prompt tokens served from the prefix cache (0..1), per the table above.

    On a ``diff`` this is the hit rate over the window; on a single scrape, over the server's
    lifetime (or the engine's own recent-window gauge where only that exists).
    """
    for num, den in (
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        ("sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
        ("sim:prefix_cache_hits_total", "sim:prefix_cache_queries_total"),
    ):
        r = _ratio(metrics, num, den)
        if r is not None:
            return r
    # llama-server counts evaluated and cached prompt tokens apart: queried = the two together.
    cached = metrics.value("llamacpp:prompt_tokens_cached_total")
    evaluated = metrics.value("llamacpp:prompt_tokens_total")
    if cached is not None and evaluated is not None and cached + evaluated > 0:
        return cached / (cached + evaluated)
    for gauge in ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate", "sim:prefix_cache_hit_rate"):
        r = _gauge_rate(metrics, gauge)
        if r is not None:
            return r
    return None


def mean_queue_time_s(metrics: Metrics) -> float | None:
    """Mean time requests waited in the engine's queue, from its queue-time histogram."""
    for name in (
        "vllm:request_queue_time_seconds",
        "sglang:queue_time_seconds",
        "sim:queue_time_seconds",
        "sim:request_queue_time_seconds",
    ):
        h = metrics.histogram(name)
        if h is not None and h.mean is not None:
            return h.mean
    return None


def queue_depth(metrics: Metrics) -> float | None:
    """Requests waiting right now (a gauge; absent from a ``diff``)."""
    for name in (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
        "sim:num_requests_waiting",
    ):
        v = metrics.value(name)
        if v is not None:
            return v
    return None


def mean_ttft_s(metrics: Metrics) -> float | None:
    """The engine's own mean time to first token, from its TTFT histogram (vLLM's name, which the
    sim exports too, or SGLang's): beside the client's TTFT it shows the time outside the engine."""
    for name in ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"):
        h = metrics.histogram(name)
        if h is not None and h.mean is not None:
            return h.mean
    return None


def preemptions(metrics: Metrics) -> float | None:
    """Requests the engine preempted under KV pressure (a counter: on a ``diff``, over the window)."""
    for name in ("vllm:num_preemptions_total", "sim:num_preemptions_total"):
        v = metrics.value(name)
        if v is not None:
            return v
    return None


def summarize(metrics: Metrics) -> dict[str, float | str | None]:
    """The picks above in one dict, for the run record and the live view."""
    return {
        "engine": engine_of(metrics),
        "prefix_cache_hit_rate": prefix_cache_hit_rate(metrics),
        "mean_queue_time_s": mean_queue_time_s(metrics),
        "queue_depth": queue_depth(metrics),
        "mean_ttft_s": mean_ttft_s(metrics),
        "preemptions": preemptions(metrics),
    }


# ---- fetching ----------------------------------------------------------------------------------


def http_get(
    url: str,
    timeout_s: float,
    *,
    headers: dict[str, str] | None = None,
    max_bytes: int = 16 << 20,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` within ``timeout_s`` in total: (status, headers lower-cased, body).

    Plain ``http.client``, so it cooperates with gevent once sockets are patched (Locust) and
    works without. ``ssl_context`` verifies an ``https`` URL (``targets.tls``). Raises ``OSError``
    (``TimeoutError`` past the deadline, ``ssl.SSLError`` for a refused certificate) on failure.
    """
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    deadline = time.monotonic() + timeout_s
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout_s, context=ssl_context)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        conn.request("GET", target, headers={"Accept": "*/*", **(headers or {})})
        resp = conn.getresponse()
        chunks, size = [], 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete answer within {timeout_s:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            chunk = resp.read1(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                break
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, b"".join(chunks)
    finally:
        conn.close()


def scrape(url: str, timeout_s: float = 5.0, *, headers: dict[str, str] | None = None) -> Metrics:
    """Fetch and parse ``url`` (a ``/metrics`` page). Failures raise a one-line ``TargetError``."""
    try:
        status, _, body = http_get(url, timeout_s, headers=headers)
    except TimeoutError:
        raise TargetError(f"metrics {url}: no answer within {timeout_s:g} s") from None
    except OSError as e:
        raise TargetError(f"metrics {url}: {_reason(e)}") from None
    if status != 200:
        hint = "; is the metrics endpoint enabled (llama-server needs --metrics)?" if status == 404 else ""
        raise TargetError(f"metrics {url}: HTTP {status}{hint}")
    return parse_text(body.decode("utf-8", "replace"))


def _reason(e: OSError) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    return (e.strerror or str(e) or type(e).__name__).lower()
