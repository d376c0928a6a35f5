"""What the master's /metrics endpoint costs: per scrape, and per request merged.

Builds a master-side aggregate the way a run does (a worker ``Recorder``, encoded deltas merged
with ``decode_and_add``) for a chosen label cardinality, then measures

* the render of one scrape (``collect`` + ``render``: one cumulative sum per histogram, one
  percentile query, the text), and its size;
* a whole scrape over HTTP through the gevent server, as Prometheus would do it (cache off);
* what the per-label totals add to merging one record (``_count_by_labels``: labels, tokens and
  the exact ``_sum`` of every value, ITL gaps included).

    .venv/bin/python bench/prometheus_scrape.py                       # 2 turn classes x 4 tenants x 2 targets
    .venv/bin/python bench/prometheus_scrape.py --tenants 20 --targets 4 --tokens 1000

Prints figures; it is not a test. The server binds 127.0.0.1 on a free port and is stopped.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gevent import monkey

monkey.patch_all()

import urllib.request  # noqa: E402

from analysis.records import RequestRecord  # noqa: E402
from loadgen.config import RunConfig  # noqa: E402
from loadgen.engine.recorder import MetricsAggregate, Recorder  # noqa: E402
from loadgen.live import metrics_endpoint  # noqa: E402
from loadgen.live.exposition import render  # noqa: E402
from loadgen.live.prometheus import collect  # noqa: E402
from loadgen.live.snapshot import RunSnapshot  # noqa: E402


def _records(n: int, tenants: int, targets: int, tokens: int, rng: random.Random) -> list[RequestRecord]:
    out = []
    for i in range(n):
        send = 1_000 * i + rng.randrange(50, 5_000)
        first = send + int(rng.lognormvariate(11.5, 0.8))
        gaps = [int(rng.lognormvariate(9.5, 0.5)) for _ in range(tokens - 1)]
        rec = RequestRecord(
            request_id=f"r{i}", session_id=f"s{i}", session_index=i, turn_index=i % 4,
            turn_class="first" if i % 4 == 0 else "follow-up", tenant=f"tenant-{i % tenants}",
            target=f"target-{i % targets}", worker="w", status="ok", t_sched_us=1_000 * i, t_send_us=send,
            t_first_us=first, t_last_us=first + sum(gaps), t_end_us=first + sum(gaps) + 200,
            output_tokens=tokens, chunks=tokens, prompt_tokens=2_000, itl_us=gaps,
        )  # fmt: skip
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4_000)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--targets", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--scrapes", type=int, default=30)
    args = ap.parse_args()

    rng = random.Random(1)
    recs = _records(args.requests, args.tenants, args.targets, args.tokens, rng)
    recorder = Recorder()
    for r in recs:
        recorder.record_request(r)
    delta = recorder.take_delta()

    plain = MetricsAggregate()
    plain._count_by_labels = lambda r: None  # type: ignore[method-assign]
    t = time.perf_counter()
    plain.merge(delta)
    merge_plain_s = time.perf_counter() - t
    agg = MetricsAggregate()
    t = time.perf_counter()
    agg.merge(delta)
    merge_s = time.perf_counter() - t

    rt = RunSnapshot(
        config=RunConfig(run_id="bench", workload="agentic-coding", rate_per_s=10.0), aggregate=agg,
        t0_unix_s=time.time(), t_end_unix_s=None, sessions_started=args.requests, sessions_in_flight=10,
        requests_in_flight=5, workers={"active": 1, "lost": 0, "standby": 0},
    )  # fmt: skip
    renders = []
    for _ in range(args.scrapes):
        t = time.perf_counter()
        body = render(collect(rt))
        renders.append(time.perf_counter() - t)

    endpoint = metrics_endpoint.MetricsEndpoint(lambda: rt, "127.0.0.1", 0)
    endpoint.start()
    assert endpoint._server is not None
    endpoint.port = endpoint._server.server_port
    http = []
    for _ in range(args.scrapes):
        endpoint._cache = None  # every scrape renders, as with one scraper every >= 1 s
        t = time.perf_counter()
        with urllib.request.urlopen(endpoint.url, timeout=5) as resp:
            resp.read()
        http.append(time.perf_counter() - t)
    endpoint.close()

    histograms = len(agg.cumulative)
    lines = body.count("\n")
    per_record_us = (merge_s - merge_plain_s) / len(recs) * 1e6
    print(f"labels: 2 turn classes x {args.tenants} tenants x {args.targets} targets; {histograms} histograms")
    print(f"scrape text: {lines} lines, {len(body) / 1024:.1f} KiB")
    print(f"render (collect + text): median {statistics.median(renders) * 1e3:.2f} ms, max {max(renders) * 1e3:.2f} ms")
    print(f"HTTP scrape (gevent server, no cache): median {statistics.median(http) * 1e3:.2f} ms, max {max(http) * 1e3:.2f} ms")
    print(
        f"per-label totals while merging: {per_record_us:.1f} us per record of {args.tokens} tokens "
        f"(merge {merge_plain_s / len(recs) * 1e6:.1f} us without them)"
    )


if __name__ == "__main__":
    main()
