"""Streamed traces and schedules: rows read one by one give what the whole-file readers give.

The fixtures are small; ``StreamedTraceWorkload`` is built on them directly (a run streams only
files of STREAM_MIN_BYTES or more, tests/integration/test_trace_scale.py).
"""

from __future__ import annotations

import functools
import gzip
import operator
from pathlib import Path

import numpy as np
import pytest

from loadgen.config import RunConfig
from loadgen.engine.driver import global_schedule, share_indices
from loadgen.engine.plan_stream import StreamedSchedule, count_in_background, in_share
from loadgen.errors import UserError
from loadgen.runtime.accounting import Accounting, Share
from workloads import load_workload
from workloads.compressed import read_text
from workloads.errors import WorkloadError
from workloads.readers import get_reader
from workloads.readers import stream as stream_mod
from workloads.readers.base import iter_json_array
from workloads.readers.stream import iter_json_array_blocks, iter_text_lines
from workloads.streamed import StreamedTraceWorkload

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
# (mooncake_aiperf.jsonl is out of time order: a streamed read refuses it, the whole-file one sorts it)
TRACES = [
    ("azure", "azure.csv"), ("burstgpt", "burstgpt.csv"), ("mooncake", "mooncake.jsonl"),
    ("sharegpt", "openai_chat.jsonl"), ("sharegpt", "sharegpt.json"), ("sharegpt", "fastchat.json"),
    ("sharegpt", "llamafactory.json"),
]  # fmt: skip


def streamed(fmt: str, path: Path, options: dict[str, str] | None = None) -> StreamedTraceWorkload:
    return StreamedTraceWorkload(get_reader(fmt), path, options or {})


@pytest.mark.parametrize(("fmt", "name"), TRACES)
def test_streamed_rows_are_the_whole_file_readers_sessions_and_offsets(fmt, name):
    path = FIX / name
    whole = load_workload(path, fmt=fmt)
    wl = streamed(fmt, path)
    rows = list(wl.rows())
    assert len(rows) == whole.num_sessions == wl.num_sessions
    for k, row in enumerate(rows):
        assert wl.record_session(7, k, row.record) == whole.session(7, k)
    offsets = whole.arrival_offsets()
    if offsets is None:
        assert not wl.has_arrival_times() and all(r.time_s is None for r in rows)
    else:
        times = np.array([r.time_s for r in rows])
        assert wl.has_arrival_times() and np.array_equal(times - times[0], offsets)


@pytest.mark.parametrize("options", [{"min_turns": "2", "think_time": "2s"}, {"max_prompt_tokens": "60", "tenant": "t"}])
def test_streamed_conversations_keep_the_readers_filters_and_options(options):
    path = FIX / "openai_chat.jsonl"
    whole = load_workload(path, options=options)
    wl = streamed("sharegpt", path, options)
    rows = list(wl.rows())
    assert 0 < len(rows) == whole.num_sessions
    assert [wl.record_session(1, k, r.record) for k, r in enumerate(rows)] == list(whole.sessions(1, len(rows)))


def test_gzip_crlf_and_bom_stream_as_the_plain_file(tmp_path):
    text = (FIX / "azure.csv").read_text()
    packed = tmp_path / "azure.csv.gz"
    packed.write_bytes(gzip.compress(("\ufeff" + text.replace("\n", "\r\n")).encode()))
    plain = [r.record for r in streamed("azure", FIX / "azure.csv").rows()]
    assert [r.record | {"id": r.record["id"].replace("azure.csv-", "azure-")} for r in streamed("azure", packed).rows()] == plain


def test_zstd_streams_as_the_plain_file(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    text = (FIX / "mooncake.jsonl").read_bytes()
    packed = tmp_path / "mooncake.jsonl.zst"
    # Two frames, as `zstd -c a b > f` writes.
    packed.write_bytes(zstandard.compress(text[:5000]) + zstandard.compress(text[5000:]))
    assert "".join(iter_text_lines(packed, "trace")) == text.decode()


def test_text_lines_across_small_blocks_match_the_whole_text(tmp_path, monkeypatch):
    # \r\n and a multi-byte character straddling block edges; a last line without its newline.
    text = "a,b\r\nçé,x\r\n\r\nend\rlast"
    path = tmp_path / "t.csv"
    path.write_bytes(("\ufeff" + text).encode())
    for block in (1, 2, 3, 5):
        monkeypatch.setattr(stream_mod, "READ_BLOCK_BYTES", block)
        assert "".join(iter_text_lines(path, "trace")) == read_text(path, "trace")


def test_broken_gzip_and_non_utf8_are_one_line_errors(tmp_path):
    cut = tmp_path / "cut.csv"
    cut.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n" * 50)[:-20])
    with pytest.raises(WorkloadError, match="gzip-compressed but cut short or corrupt"):
        list(iter_text_lines(cut, "Azure trace"))
    latin = tmp_path / "latin.csv"
    latin.write_bytes("TIMESTAMP\n\xe9\n".encode("latin-1"))
    with pytest.raises(WorkloadError, match="not UTF-8 text; a Azure trace is UTF-8"):
        list(iter_text_lines(latin, "Azure trace"))


def test_a_row_out_of_time_order_is_a_one_line_error_naming_it(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,5\n3.0,5,5\n2.5,5,5\n")
    wl = streamed("azure", path)
    with pytest.raises(WorkloadError, match=r"t\.csv line 4: timestamp is 0\.5 s before line 3's; .* sort its rows by time"):
        list(wl.rows())
    # The whole-file reader sorts instead.
    assert load_workload(path).session(0, 1).session_id == "t-L4"


def cfg_for(path: Path, **kw) -> RunConfig:
    return RunConfig(run_id="r", workload=str(path), arrival="trace", **kw)


def whole_and_streamed(fmt: str, name: str, **kw):
    path = FIX / name
    cfg = cfg_for(path, **kw)
    return cfg, global_schedule(cfg, load_workload(path, fmt=fmt)), global_schedule(cfg, streamed(fmt, path))


@pytest.mark.parametrize(
    "kw",
    [{}, {"num_sessions": 50}, {"duration_s": 20.0}, {"num_sessions": 50, "duration_s": 5.0}, {"trace_time_scale": 0.1, "duration_s": 3.0},
     {"trace_rate_per_s": 4.0}, {"num_sessions": 200}],
)  # fmt: skip
def test_streamed_schedule_plans_and_cuts_as_the_whole_file_schedule(kw):
    _cfg, whole, sched = whole_and_streamed("azure", "azure.csv", **kw)
    assert isinstance(sched, StreamedSchedule)
    if sched.planned is None:  # a run of the whole file: counted during the run
        sched.count_planned()
    assert sched.planned == whole.planned and sched.cut_by == whole.cut_by
    assert sched.available in (None, whole.available)
    got = [(k, off) for k, off, _ in sched.arrivals()]
    assert [k for k, _ in got] == list(range(whole.planned))
    assert np.allclose([off for _, off in got], whole.offsets, rtol=1e-12, atol=1e-9)


def test_shares_nest_and_cover_the_schedule_once_with_one_worker_or_two():
    _, whole, sched = whole_and_streamed("mooncake", "mooncake.jsonl", trace_time_scale=0.01)
    one = [(k, off) for k, off, _ in sched.share_arrivals(1, 0)]
    two = sorted((k, off) for slot in (0, 1) for k, off, _ in sched.share_arrivals(2, slot))
    assert one == two and len(one) == 240
    for slot in (0, 1):
        # A lost slot's arrivals re-planned onto 3 survivors, one of those onto 2 more.
        share = [k for k, _, _ in sched.share_arrivals(2, slot)]
        parts = [[k for k, _, _ in sched.share_arrivals(2, slot, [[3, j]])] for j in range(3)]
        parts[0:1] = [[k for k, _, _ in sched.share_arrivals(2, slot, [[3, 0], [2, i]])] for i in range(2)]
        assert sorted(functools.reduce(operator.iadd, parts, [])) == share == list(share_indices(240, 2, slot))
        assert all(in_share(k, 2, slot, [[3, 1]]) for k in parts[2])
    later = [k for k, off, _ in sched.share_arrivals(2, 1, None, from_s=1.0)]
    assert later == [int(k) for k in share_indices(240, 2, 1) if whole.offsets[k] >= 1.0]


def test_streamed_due_counts_and_accounting_match_the_whole_file():
    cfg, whole, sched = whole_and_streamed("mooncake", "mooncake.jsonl", trace_time_scale=0.01, num_sessions=200)
    shares = [Share(1, [], 0.0, 1.2), Share(0, [[2, 1]], 0.5, 2.0)]
    assert sched.due(2, shares) == whole.due(2, shares) > 0
    acc_whole, acc = Accounting.plan(cfg, whole, None), Accounting.plan(cfg, sched, None)
    acc_whole.n_slots = acc.n_slots = 2
    for a in (acc_whole, acc):
        a.close(started_by_worker={"w0": 100, "w1": 60}, lost_shares={"w1": shares}, aborted=False)
    assert acc.as_dict()["sessions_not_started"] == acc_whole.as_dict()["sessions_not_started"] != {}
    assert acc.arrivals_planned == 200 and acc.as_dict()["schedule_cut_by"] == ["--num-sessions"]


def test_generated_arrivals_over_a_streamed_trace_take_its_sessions_in_order():
    path = FIX / "azure.csv"
    cfg = RunConfig(run_id="r", workload=str(path), arrival="poisson", rate_per_s=50.0, num_sessions=30, seed=3)
    whole, sched = global_schedule(cfg, load_workload(path)), global_schedule(cfg, streamed("azure", path))
    assert sched.planned == 30 and sched.cut_by == whole.cut_by == ["--num-sessions"]
    assert [(k, off) for k, off, _ in sched.arrivals()] == [(k, float(o)) for k, o in enumerate(whole.offsets)]


def test_a_rate_over_a_trace_at_one_instant_is_a_usage_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,5\n1.0,5,5\n")
    with pytest.raises(UserError, match="all its arrivals are at one instant"):
        global_schedule(cfg_for(path, trace_rate_per_s=2.0), streamed("azure", path))


def test_a_whole_file_replay_is_counted_in_a_thread_and_a_bad_row_found_there_is_reported(tmp_path):
    cfg, whole, sched = whole_and_streamed("azure", "azure.csv")
    acc = Accounting.plan(cfg, sched, None)
    assert acc.arrivals_planned is None  # planned once counted, during the run
    errors: list[str] = []
    count_in_background(sched, acc, errors.append).join(timeout=30)
    assert (acc.arrivals_planned, acc.sessions_available, errors) == (whole.planned, 200, [])
    # Nothing to count when the run is cut (counted before the start) or the schedule is an array.
    assert count_in_background(whole_and_streamed("azure", "azure.csv", num_sessions=5)[2], acc, errors.append) is None
    assert count_in_background(whole, acc, errors.append) is None

    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,5\n3.0,5,5\n2.5,5,5\n")
    bad = global_schedule(cfg_for(path), streamed("azure", path))
    count_in_background(bad, Accounting.plan(cfg, bad, None), errors.append).join(timeout=30)
    assert len(errors) == 1 and "t.csv line 4: timestamp is 0.5 s before line 3's" in errors[0]


def test_sessions_by_index_read_on_and_stop_past_the_last_row(monkeypatch):
    import workloads.streamed as streamed_mod

    monkeypatch.setattr(streamed_mod, "RECENT_ROWS", 8)
    path = FIX / "azure.csv"
    whole, wl = load_workload(path), streamed("azure", path)
    # Nearly increasing, as closed-loop agents ask; then back before the kept rows; then past the end.
    for index in (0, 2, 1, 5, 3, 40, 36, 199, 7):
        assert wl.session(3, index) == whole.session(3, index)
    with pytest.raises(WorkloadError, match=r"session index 200 is out of range; the file holds 200 sessions"):
        wl.session(3, 200)


def test_a_lagging_agent_and_indexes_past_the_end_do_not_send_the_reader_back_to_the_start(monkeypatch):
    """A closed loop's agents: one far behind the kept rows is read by a second reader (the
    leading one goes on), and once the end is known an index past it is refused without a read."""
    import workloads.streamed as streamed_mod

    monkeypatch.setattr(streamed_mod, "RECENT_ROWS", 8)
    path = FIX / "azure.csv"
    whole, wl = load_workload(path), streamed("azure", path)
    reads = []
    rows = wl.rows
    monkeypatch.setattr(wl, "rows", lambda: reads.append(1) or rows())
    for index in (0, 50, 3, 4, 51, 60, 5, 199):
        assert wl.session(3, index) == whole.session(3, index)
    assert len(reads) == 2  # the leading reader once, the second reader once (3, 4, 5 in order)
    with pytest.raises(WorkloadError, match="out of range"):
        wl.session(3, 199 + 1)
    for _ in range(3):
        with pytest.raises(WorkloadError, match="out of range"):
            wl.session(3, 250)
    assert len(reads) == 2


def _chunks(text: str, size: int):
    return iter([text[i : i + size] for i in range(0, len(text), size)])


@pytest.mark.parametrize("name", ["sharegpt.json", "fastchat.json", "llamafactory.json"])
def test_json_arrays_read_in_blocks_give_the_whole_text_elements_and_lines(name):
    path = FIX / name
    text = read_text(path, "dataset")
    whole = list(iter_json_array(path, text))
    for size in (1, 7, 64, 4096, len(text)):
        assert list(iter_json_array_blocks(path, _chunks(text, size))) == whole


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '[\n  {"a": 1},\n  {"a": 2,,}\n]',
        '[\n  {"a": 1}\n  {"a": 2}\n]',
        '[\n  {"a": 1},\n  {"a": "cut',
        '[\n  {"a": 1},\n',
        "[\n 12,\n 345\n",
        "  \n",
    ],
)
def test_json_array_errors_read_in_blocks_are_the_whole_text_errors(tmp_path, text):
    path = tmp_path / "d.json"
    with pytest.raises(WorkloadError) as want:
        list(iter_json_array(path, text))
    for size in (1, 3, 1000):
        with pytest.raises(WorkloadError) as got:
            list(iter_json_array_blocks(path, _chunks(text, size)))
        assert str(got.value) == str(want.value)
