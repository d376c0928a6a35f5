"""Reading results directories: one-line errors for what a user can fix, notes for what a crash leaves."""

from __future__ import annotations

import orjson
import pytest

from analysis.errors import ResultsError
from analysis.records import METRICS_FILE, REQUESTS_FILE, RUN_FILE
from analysis.results import histograms_from_records, load_results, read_requests
from analysis.summary import summarize
from tests.fixtures.results.synth import write_run
from tests.fixtures.results.tiny import tiny_records


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "r1", tiny_records())


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_directory_and_run_json(tmp_path, run_dir):
    with pytest.raises(ResultsError, match="no such results directory") as e:
        load_results(tmp_path / "nope")
    _one_line(e)
    (run_dir / RUN_FILE).unlink()
    with pytest.raises(ResultsError, match=r"r1/run.json: no such file; is .* a loadgen results directory\?"):
        load_results(run_dir)


def test_unreadable_run_json(run_dir):
    (run_dir / RUN_FILE).write_text('{"schema_version": 1, "run_id": ')
    with pytest.raises(ResultsError, match=r"run.json: not valid JSON .*damaged") as e:
        load_results(run_dir)
    _one_line(e)
    (run_dir / RUN_FILE).write_text('{"run_id": "x"}')
    with pytest.raises(ResultsError, match="no integer schema_version"):
        load_results(run_dir)


def test_newer_schema_version(run_dir):
    info = orjson.loads((run_dir / RUN_FILE).read_bytes())
    info["schema_version"] = 3
    (run_dir / RUN_FILE).write_bytes(orjson.dumps(info))
    with pytest.raises(ResultsError) as e:
        summarize(run_dir)
    assert (
        _one_line(e)
        == f"{run_dir}/run.json: schema_version 3 is newer than this loadgen understands (1); upgrade loadgen"
    )


def test_complete_run_missing_files(run_dir):
    (run_dir / METRICS_FILE).unlink()
    with pytest.raises(
        ResultsError, match=r"metrics.hlog: no such file, but run.json says the run completed"
    ):
        load_results(run_dir)
    (run_dir / REQUESTS_FILE).unlink()
    with pytest.raises(
        ResultsError, match=r"requests.jsonl: no such file, but run.json says the run completed"
    ):
        load_results(run_dir)


def test_partial_run_missing_files_is_noted(tmp_path):
    d = write_run(tmp_path, tiny_records(), status="running", with_hlog=False)
    res = load_results(d)
    assert res.partial and res.hlog is None
    assert any("histograms rebuilt" in n for n in res.notes)
    (d / REQUESTS_FILE).unlink()
    s = summarize(d)
    assert s["requests"]["measured"] == 0 and s["throughput"]["requests_per_s"] is None  # nothing recorded
    assert any("requests.jsonl is missing" in n for n in s["notes"])


def test_truncated_last_record_is_tolerated(run_dir):
    path = run_dir / REQUESTS_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-30])
    notes: list[str] = []
    recs = read_requests(path, notes=notes)
    assert len(recs) == len(tiny_records()) - 1
    assert notes == [notes[0]] and "last line" in notes[0] and "truncated" in notes[0]


def test_corrupt_middle_record_names_the_line(run_dir):
    path = run_dir / REQUESTS_FILE
    lines = path.read_bytes().split(b"\n")
    lines[2] = b'{"request_id": "x"}'
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(
        ResultsError,
        match=r"requests.jsonl line 3: record lacks session_id, turn_index, status, t_sched_us, t_send_us; the file is corrupt",
    ):
        load_results(run_dir)
    lines[2] = b"garbage"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ResultsError, match=r"line 3: not a JSON record"):
        load_results(run_dir)


def test_unknown_record_fields_are_ignored(run_dir):
    path = run_dir / REQUESTS_FILE
    lines = path.read_bytes().splitlines()
    d = orjson.loads(lines[0])
    d["added_in_a_later_minor_version"] = 1
    lines[0] = orjson.dumps(d)
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert len(read_requests(path)) == len(lines)


def test_rebuilt_histograms_equal_the_hlog(run_dir):
    """The recording rule in records.metric_values gives what the runtime wrote, bit for bit."""
    res = load_results(run_dir)
    from_hlog = res.hlog.histograms()
    rebuilt = histograms_from_records(res.records)
    assert set(from_hlog) == set(rebuilt)
    for tag, h in rebuilt.items():
        assert h.encode() == from_hlog[tag].encode(), tag


def test_bulk_rebuild_follows_metric_values_exactly():
    """histograms_from_records spells the recording rule out in bulk; it must equal metric_values."""
    from dataclasses import replace

    from analysis import hlog
    from analysis.records import histogram_tag, metric_values

    recs = tiny_records()
    recs.append(replace(recs[2], request_id="multi", chunk_tokens=[2, 1, 1], output_tokens=4))
    recs.append(replace(recs[3], request_id="cut", status="error", error_category="stream_cut"))
    recs.append(
        replace(recs[1], request_id="huge", t_end_us=recs[1].t_send_us + 5 * 3_600_000_000)
    )  # clamped
    recs.append(replace(recs[1], request_id="empty", t_first_us=None, t_last_us=None, itl_us=[], chunks=0))
    expected: dict[str, object] = {}
    for r in recs:
        for metric, v in metric_values(r):
            tag = histogram_tag(metric, r.turn_class, r.tenant, r.target)
            expected.setdefault(tag, hlog.new_histogram()).record_value(hlog.clamp_us(v))
    rebuilt = histograms_from_records(recs)
    assert set(rebuilt) == set(expected)
    for tag, h in expected.items():
        assert rebuilt[tag].encode() == h.encode(), tag
