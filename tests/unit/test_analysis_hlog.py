"""metrics.hlog: written by analysis.hlog, read back by hdrh's own HistogramLogReader and by ours."""

from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from analysis import hdr, hlog
from analysis.errors import ResultsError
from analysis.records import histogram_tag

T0 = 1_700_000_000.0


def _hist(values) -> HdrHistogram:
    h = hlog.new_histogram()
    for v in values:
        h.record_value(hlog.clamp_us(v))
    return h


@pytest.fixture
def log_file(tmp_path):
    """Three intervals of two tags, and the single histograms they must merge into."""
    rng = np.random.default_rng(7)
    tags = [histogram_tag("ttft", "first", "t1", "a"), histogram_tag("itl", "follow-up", "t1", "a")]
    whole = {t: hlog.new_histogram() for t in tags}
    path = tmp_path / "metrics.hlog"
    with hlog.HlogWriter(path, start_time_unix_s=T0) as w:
        for k in range(3):
            for t in tags:
                h = _hist(rng.lognormal(11, 1, 500))
                whole[t].add(h)
                assert w.write_interval(h, tag=t, start_s=k * 2.0, length_s=2.0)
            assert not w.write_interval(hlog.new_histogram(), tag=tags[0], start_s=k * 2.0, length_s=2.0)
    return path, whole


def test_hdrh_reader_reads_our_file(log_file):
    path, whole = log_file
    reader = HistogramLogReader(str(path), hlog.new_histogram())
    seen = {t: hlog.new_histogram() for t in whole}
    starts = []
    while (h := reader.get_next_interval_histogram()) is not None:
        seen[h.get_tag()].add(h)
        starts.append(h.get_start_time_stamp() / 1000.0)
    reader.close()
    assert reader.get_start_time_sec() == pytest.approx(T0)
    assert sorted(set(starts)) == pytest.approx([T0, T0 + 2, T0 + 4])
    for t, h in whole.items():
        assert seen[t].get_total_count() == h.get_total_count() == 1500
        for p in (50, 90, 99, 99.9):
            assert seen[t].get_value_at_percentile(p) == h.get_value_at_percentile(p)


def test_read_histograms_merges_exactly(log_file):
    path, whole = log_file
    merged = hlog.read_histograms(path)
    assert set(merged) == set(whole)
    for t, h in whole.items():
        assert merged[t].get_total_count() == h.get_total_count()
        assert [merged[t].get_value_at_percentile(p) for p in (50, 99)] == [
            h.get_value_at_percentile(p) for p in (50, 99)
        ]
    later = hlog.read_histograms(path, start_s=2.0)
    assert all(later[t].get_total_count() == 1000 for t in whole)


def test_read_intervals_are_relative_to_start(log_file):
    path, _ = log_file
    ivs = hlog.read_intervals(path)
    assert [iv.start_s for iv in ivs] == [0, 0, 2, 2, 4, 4]
    assert all(iv.length_s == 2.0 for iv in ivs)
    h = ivs[-1].histogram()
    assert h.get_total_count() == 500
    assert ivs[-1].max_ms == pytest.approx(h.get_max_value() / 1000, abs=1e-3)


def test_truncated_last_line_is_dropped_with_a_note(log_file):
    path, _ = log_file
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # a writer killed mid-line
    log = hlog.read_hlog(path)
    assert len(log.intervals) == 5
    assert len(log.notes) == 1 and "truncated" in log.notes[0]


def test_corrupt_middle_line_names_the_line(log_file):
    path, _ = log_file
    lines = path.read_text().splitlines(keepends=True)
    lines[5] = "Tag=x,1.0,not-a-number\n"
    path.write_text("".join(lines))
    with pytest.raises(ResultsError, match=r"metrics.hlog line 6: .*corrupt"):
        hlog.read_hlog(path)


def test_bad_tag_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="commas or whitespace"), open(tmp_path / "x", "w") as fp:
        hlog.write_interval(fp, _hist([5]), tag="a,b", start_s=0, length_s=1)
    with pytest.raises(ResultsError, match="no such file"):
        hlog.read_hlog(tmp_path / "metrics.hlog")


def test_reopening_does_not_repeat_the_header(tmp_path):
    path = tmp_path / "metrics.hlog"
    for k in range(2):
        with hlog.HlogWriter(path, start_time_unix_s=T0) as w:
            w.write_interval(_hist([1000]), tag="ttft:first:t:a", start_s=k, length_s=1)
    text = path.read_text()
    assert text.count("#[StartTime") == 1 and text.count('"StartTimestamp"') == 1
    assert len(hlog.read_intervals(path)) == 2


def test_fast_queries_equal_hdrh(log_file):
    path, whole = log_file
    for h in [*whole.values(), *hlog.read_histograms(path).values(), _hist([0, 0, 3, 10**9, 5 * 10**9])]:
        b = hdr.bins(h)
        ps = [0, 1, 50, 90, 95, 99, 99.9, 100]
        assert hdr.value_at_percentiles(b, ps) == [h.get_value_at_percentile(p) for p in ps]
        assert hdr.mean(b) == pytest.approx(h.get_mean_value(), rel=1e-12)
        assert (int(b.lowest[0]), int(b.highest[-1])) == (h.get_min_value(), h.get_max_value())


def test_clamp_keeps_out_of_range_values():
    h = _hist([-5, 0, 5 * 3_600_000_000])
    assert h.get_total_count() == 3


def test_record_many_equals_record_value():
    rng = np.random.default_rng(5)
    values = np.clip(
        np.concatenate([rng.lognormal(8, 3, 20000).astype(np.int64), [0, 1, 2047, 2048, 3_600_000_000]]),
        0,
        3_600_000_000,
    )
    one_by_one, bulk = hlog.new_histogram(), hlog.new_histogram()
    for v in values.tolist():
        one_by_one.record_value(v)
    hdr.record_many(bulk, values)
    assert bulk.encode() == one_by_one.encode()
    assert (bulk.get_total_count(), bulk.get_min_value(), bulk.get_max_value()) == (
        one_by_one.get_total_count(), one_by_one.get_min_value(), one_by_one.get_max_value())  # fmt: skip


@pytest.mark.parametrize("n", [0, 7, 399, 400, 5000])  # both sides of SMALL_BATCH
def test_record_many_each_equals_record_value_into_each_histogram(n):
    from hdrh.histogram import HdrHistogram

    rng = np.random.default_rng(n)
    values = np.clip(rng.lognormal(8, 3, n).astype(np.int64), 1, 3_600_000_000)
    # Two of loadgen's layout, one already holding counts, and one of another layout (2 digits).
    a, b = hlog.new_histogram(), hlog.new_histogram()
    hdr.record_many(b, np.asarray([5, 70_000], dtype=np.int64))
    other = HdrHistogram(1, 3_600_000_000, 2)
    truth = [hlog.new_histogram(), hlog.new_histogram(), HdrHistogram(1, 3_600_000_000, 2)]
    for v in (5, 70_000):
        truth[1].record_value(v)
    for h in truth:
        for v in values.tolist():
            h.record_value(v)
    hlog.record_clamped_each([a, b, other], values)
    for got, want in zip((a, b, other), truth, strict=True):
        assert got.encode() == want.encode()
        assert (got.get_total_count(), got.get_min_value(), got.get_max_value()) == (
            want.get_total_count(), want.get_min_value(), want.get_max_value())  # fmt: skip
