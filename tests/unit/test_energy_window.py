"""Energy over a run's window from power samples (analysis/energy.py): the counter interpolated at
the window's ends, the trapezoid without a counter, and no figure rather than a false one."""

from __future__ import annotations

import orjson
import pytest

from analysis.energy import (
    COUNTER,
    TRAPEZOID,
    SourceSeries,
    energy_between,
    read_power_file,
    run_energy,
    trapezoid,
)


def _series(times, power, energy=None) -> SourceSeries:
    s = SourceSeries("gpu-0", "http://h/metrics")
    for i, t in enumerate(times):
        s.add(t, power[i], None if energy is None else energy[i])
    return s


def test_counter_is_interpolated_at_both_ends() -> None:
    # 100 W then 300 W: the counter rises 100 J, then 300 J a second
    s = _series([0, 1, 2, 3], [100, 100, 300, 300], [0, 100, 400, 700])
    w = energy_between(s, 0.5, 2.5)
    assert w.method == COUNTER
    assert w.energy_j == pytest.approx(550 - 50)


def test_without_a_counter_the_power_is_integrated_by_the_trapezoid_rule() -> None:
    s = _series([0, 1, 2, 3], [100, 100, 300, 300])
    w = energy_between(s, 0.5, 2.5)
    assert w.method == TRAPEZOID
    # 0.5..1 at 100 W (50 J), 1..2 ramping 100 -> 300 (200 J), 2..2.5 at 300 W (150 J)
    assert w.energy_j == pytest.approx(400.0)


def test_a_counter_missing_from_one_scrape_in_reach_falls_back_to_the_power() -> None:
    s = _series([0, 1, 2, 3], [200, 200, 200, 200], [0, 200, None, 600])
    w = energy_between(s, 0.0, 3.0)
    assert (w.method, w.energy_j) == (TRAPEZOID, pytest.approx(600.0))


def test_constant_power_gives_power_times_time_either_way() -> None:
    times = [0.0, 0.9, 2.1, 3.0, 4.2]
    s = _series(times, [250.0] * 5, [250.0 * t for t in times])
    assert energy_between(s, 0.3, 3.7).energy_j == pytest.approx(250.0 * 3.4)
    assert trapezoid(times, [250.0] * 5, 0.3, 3.7) == pytest.approx(250.0 * 3.4)


def test_scrapes_that_do_not_reach_the_windows_end_give_no_figure() -> None:
    s = _series([0, 1, 2], [100, 100, 100], [0, 100, 200])
    w = energy_between(s, 0.5, 2.5)
    assert w.energy_j is None and w.why == "no scrape after the window's end (the last was 0.5 s before it)"
    w = energy_between(s, -0.5, 1.5)
    assert w.energy_j is None and w.why == "no scrape before the window's start (the first was 0.5 s after it)"


def _write(path, rows) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def test_run_energy_totals_and_ties_endpoints_to_targets(tmp_path) -> None:
    t0 = 1_000.0
    rows = []
    for i in range(6):  # a at 100 W with a counter, b at 300 W without one; scrapes t0-0.5 .. t0+4.5
        t = t0 - 0.5 + i
        rows.append({"source": "gpu-0", "url": "http://a/metrics", "target": "a", "t_unix_s": t, "power_w": 100.0, "energy_j": 100.0 * i})
        rows.append({"source": "gpu-1", "url": "http://b/metrics", "target": None, "t_unix_s": t, "power_w": 300.0, "energy_j": None})
    rows.append({"source": "gpu-1", "url": "http://b/metrics", "target": None, "t_unix_s": t0 + 2, "error": "HTTP 503"})
    _write(tmp_path / "power.jsonl", rows)
    (tmp_path / "power.jsonl").open("ab").write(b'{"source": "gpu-0", "t_un')  # a torn last line
    e = run_energy(tmp_path, t0, (1.0, 3.0), 800, {"a": 200})
    assert e.total["energy_j"] == pytest.approx(800.0)  # (100 + 300) W x 2 s
    assert e.total["average_power_w"] == pytest.approx(400.0)
    assert e.total["output_tokens_per_joule"] == pytest.approx(1.0)
    assert e.total["joules_per_1m_output_tokens"] == pytest.approx(1e6)
    assert e.total["method"] == "mixed"
    a = e.by_target["a"]
    assert (a["energy_j"], a["output_tokens_per_joule"], a["method"]) == (pytest.approx(200.0), pytest.approx(1.0), COUNTER)
    assert e.notes == ["energy: --power-metrics http://b/metrics: 1 of 7 scrapes failed (last: HTTP 503)"]


def test_a_host_whose_scrapes_all_failed_leaves_the_total_without_a_figure(tmp_path) -> None:
    rows = [{"source": "gpu-0", "url": "http://a/metrics", "target": None, "t_unix_s": 1000.0 + i, "power_w": 100.0, "energy_j": 100.0 * i} for i in range(5)]
    rows += [{"source": "gpu-1", "url": "http://dead:1/metrics", "target": None, "t_unix_s": 1000.0 + i, "error": "Connection refused"} for i in range(5)]
    _write(tmp_path / "power.jsonl", rows)
    e = run_energy(tmp_path, 1000.0, (1.0, 3.0), 100, {})
    assert e.total["energy_j"] is None and e.total["output_tokens_per_joule"] is None
    assert e.total["sources"][0]["energy_j"] == pytest.approx(200.0)
    assert e.notes == ["energy: --power-metrics http://dead:1/metrics: no energy figure: every scrape failed (Connection refused)"]


def test_no_power_file_is_no_energy_section(tmp_path) -> None:
    assert run_energy(tmp_path, 1.0, (0.0, 1.0), 10, {}) is None
    assert read_power_file(tmp_path / "power.jsonl") == {}
