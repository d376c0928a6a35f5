"""Coalesced token chunks: two token chunks of one stream out of one ``recv`` share one kernel stamp,
and the gap between them is lost. Counted by the worker as the chunks are parsed, merged over
workers, read back from the records' zero ITL gaps for a run that lacks the count, shown live and
noted in the summary above its bound (loadgen/engine/client.py, loadgen/engine/health.py,
analysis/generator_health.py)."""

from __future__ import annotations

import io

from analysis.generator_health import COALESCED_BOUND, coalescing, coalescing_from_histograms, generator_notes
from analysis.records import RequestRecord, histogram_tag
from loadgen.engine.client import SessionConnection, StreamResult
from loadgen.engine.health import ChunkCounts, GeneratorHealth, RecvDelays, coalescing_counts, summarize
from loadgen.engine.recorder import histogram_of
from loadgen.engine.sse_state import StreamState
from loadgen.live.progress import ProgressLine
from targets.adapters.openai import OpenAIChatAdapter

ROLE = b'data: {"choices":[{"delta":{"role":"assistant"}}]}'
DONE = b"data: [DONE]"


def tok(text: str = "a") -> bytes:
    return b'data: {"choices":[{"delta":{"content":" ' + text.encode() + b'"}}]}'


def _state(counts: ChunkCounts | None) -> tuple[StreamState, StreamResult]:
    res = StreamResult()
    return StreamState(OpenAIChatAdapter().new_stream().parse_line, res, counts), res


def test_a_token_chunk_that_shares_the_previous_ones_stamp_is_counted_coalesced() -> None:
    counts = ChunkCounts()
    st, res = _state(counts)
    st.take([ROLE, b"", tok()], 100)  # the role-only chunk carries no token: the first token is not coalesced
    assert (counts.token_chunks, counts.coalesced) == (1, 0)
    st.take([tok(), b"", tok()], 200)  # two token chunks in one recv: the second shares the stamp
    assert (counts.token_chunks, counts.coalesced) == (3, 1)
    st.take([tok()], 200)  # a later split of the same recv: still the same stamp
    assert (counts.token_chunks, counts.coalesced) == (4, 2)
    assert not st.take([tok()], 300)
    assert st.take([DONE], 300)
    assert (counts.token_chunks, counts.coalesced) == (5, 2)
    assert res.chunk_ns == [100, 200, 200, 200, 300]
    # One counter for every stream of the worker; each stream compares with its own last chunk.
    other, _ = _state(counts)
    other.take([tok()], 300)
    assert (counts.token_chunks, counts.coalesced) == (6, 2)


def test_without_a_counter_nothing_is_counted_and_the_stamps_are_the_same() -> None:
    st, res = _state(None)
    st.take([tok(), tok()], 5)
    assert res.chunk_ns == [5, 5]


class _Lines:
    """What ``_read_stream`` needs of a response on its non-reader path: one list of lines per recv."""

    def __init__(self, reads: list[tuple[int, list[bytes]]]) -> None:
        self.reads = list(reads)
        self.t_recv_ns = 0
        self.ended_mid_line = False

    def read_lines(self) -> list[bytes]:
        if not self.reads:
            return []
        self.t_recv_ns, lines = self.reads.pop(0)
        return lines


def test_the_connection_counts_into_the_list_it_is_given_for_receive_delays() -> None:
    sink = RecvDelays()
    conn = SessionConnection("http://127.0.0.1:9", recv_delays=sink)
    conn._drain = lambda resp: True  # no socket here
    res = StreamResult()
    resp = _Lines([(1_000, [ROLE, tok()]), (2_000, [tok(), tok(), tok()]), (3_000, [tok(), DONE])])
    conn._read_stream(resp, OpenAIChatAdapter(), res)
    assert res.ok and res.chunk_ns == [1_000, 2_000, 2_000, 2_000, 3_000]
    assert (sink.chunks.token_chunks, sink.chunks.coalesced) == (5, 2)
    assert len(sink) == 3  # one receive delay per recv, as before
    # A plain list (a caller that does not count) still works.
    plain: list[int] = []
    conn = SessionConnection("http://127.0.0.1:9", recv_delays=plain)
    conn._drain = lambda resp: True
    conn._read_stream(_Lines([(1, [tok(), tok(), DONE])]), OpenAIChatAdapter(), StreamResult())
    assert len(plain) == 1


def test_workers_counts_are_shipped_and_summed() -> None:
    def worker(chunks: int, coalesced: int) -> dict:
        h = GeneratorHealth()
        h.chunks.token_chunks, h.chunks.coalesced = chunks, coalesced
        return {"health": h.state()}

    out = summarize({"a": worker(900, 90), "b": worker(100, 10)})
    assert out["coalescing"] == {"token_chunks": 1000, "coalesced": 100, "share": 0.1}
    assert summarize({"a": worker(0, 0)})["coalescing"]["share"] is None
    assert "coalescing" not in summarize({"old": {"health": {}}})  # a worker from before the count
    # The live figure the master can hand the progress line, from the same states.
    assert coalescing_counts({"a": worker(900, 90), "b": worker(100, 10), "old": {}}) == (100, 1000)


def _rec(i: int, itl: list[int]) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}", session_id=f"s{i}", session_index=i, turn_index=0, turn_class="first",
        tenant="default", target="t", worker="w", status="ok", t_sched_us=i * 1000, t_send_us=i * 1000,
        chunks=len(itl) + 1, itl_us=itl,
    )  # fmt: skip


def test_the_share_is_the_workers_count_when_run_json_has_it_else_the_records_zero_gaps() -> None:
    records = [_rec(0, [0, 10_000, 10_000]), _rec(1, [0, 0, 10_000])]  # 3 zero gaps over 8 chunks
    got = coalescing(None, records)
    assert (got["coalesced_chunks"], got["token_chunks"], got["coalesced_source"]) == (3, 8, "records")
    assert got["coalesced_share"] == 0.375
    got = coalescing({"token_chunks": 1000, "coalesced": 3, "share": 0.003}, records)
    assert (got["coalesced_share"], got["coalesced_source"]) == (0.003, "workers")
    # Workers that counted nothing (no streams) leave the records' figure.
    assert coalescing({"token_chunks": 0, "coalesced": 0}, records)["coalesced_source"] == "records"
    assert coalescing(None, [])["coalesced_share"] is None


def test_over_its_bound_the_summary_notes_that_the_itl_is_a_lower_bound() -> None:
    assert COALESCED_BOUND == 0.05
    quiet = {"saturated": False, **coalescing({"token_chunks": 1000, "coalesced": 3}, None)}
    assert generator_notes(quiet) == []
    busy = {"saturated": False, **coalescing({"token_chunks": 1000, "coalesced": 190}, None)}
    busy["cpu"] = {"pressure_some_share": 0.4, "pressure_some_avg10_max": 45.0}
    (note,) = generator_notes(busy)
    assert note.startswith(
        "the ITL distribution is a lower bound: 19% of token chunks shared a receive with the previous one "
        "(one kernel stamp for two tokens)"
    )
    assert "the generator likely read late (CPU pressure some 40% of the run (avg10 up to 45%))" in note
    # Measured, and nothing busy: the chunks may have come that way.
    free = {**busy, "cpu": {"pressure_some_share": 0.01, "involuntary_switches_per_s": 1.0}, "own_cpu_share": 0.1}
    assert "the server or a proxy may write several chunks at once" in generator_notes(free)[0]
    old_run = {"saturated": False, **coalescing(None, [_rec(0, [0, 0, 10_000])])}
    assert generator_notes(old_run)[0].endswith(", counted from the records' zero ITL gaps")


def test_histograms_give_the_live_share_zero_gaps_clamped_to_1_us() -> None:
    hists = {
        histogram_tag("itl", "first", "default", "t"): histogram_of([0, 0, 5_000, 7_000]),
        histogram_tag("itl", "follow-up", "default", "t"): histogram_of([0, 9_000]),
        histogram_tag("tokens_per_chunk", "first", "default", "t"): histogram_of([1] * 6),
        histogram_tag("tokens_per_chunk", "follow-up", "default", "t"): histogram_of([1] * 4),
        histogram_tag("ttft", "first", "default", "t"): histogram_of([1, 1]),  # a 1 µs TTFT is not a gap
    }
    assert coalescing_from_histograms(hists) == (3, 10)


class _Aggregate:
    def __init__(self, cumulative: dict) -> None:
        self.cumulative = cumulative
        self.requests = 2
        self.errors: dict[str, int] = {}

    def combined(self, metric: str):
        return histogram_of([])


def test_the_progress_line_shows_the_share_live_and_flags_it_over_the_bound() -> None:
    def line(**kw) -> str:
        return ProgressLine(None, 0.0, kw.pop("agg", _Aggregate({})), lambda: (2, 1, 1), io.StringIO(), **kw).render()

    assert "coalesced" not in line()  # no token chunks yet
    assert line(coalescing=lambda: (3, 1000)).endswith(" | coalesced 0.3%")
    assert line(coalescing=lambda: (190, 1000)).endswith(" | coalesced 19.0% (ITL a lower bound)")
    hists = {
        histogram_tag("itl", "first", "default", "t"): histogram_of([0, 5_000]),
        histogram_tag("tokens_per_chunk", "first", "default", "t"): histogram_of([1] * 3),
    }
    assert line(agg=_Aggregate(hists)).endswith(" | coalesced 33.3% (ITL a lower bound)")
