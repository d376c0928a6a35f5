"""Energy figures in every view: the master's /metrics gauges (from the front's power-live.json),
the summary's text lines and CSV rows, the compare overview, and the flag's mistakes as one line."""

from __future__ import annotations

import orjson
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from analysis.compare import _energy_items
from analysis.summary_format import energy_lines
from loadgen.cli import main
from loadgen.config import RunConfig
from loadgen.engine.recorder import MetricsAggregate, Recorder
from loadgen.live.exposition import render
from loadgen.live.prometheus import EXPORTED_NAMES, POWER_LIVE_FILE, collect
from loadgen.live.snapshot import RunSnapshot

from .test_prometheus_exposition import _record


def _snapshot(tmp_path, live: dict | None) -> RunSnapshot:
    cfg = RunConfig(run_id="run-1", workload="tiny", seed=3, rate_per_s=2.0, results_dir=str(tmp_path))
    if live is not None:
        (tmp_path / "run-1").mkdir()
        (tmp_path / "run-1" / POWER_LIVE_FILE).write_bytes(orjson.dumps(live))
    recorder = Recorder()
    for i in range(4):
        recorder.record_request(_record(i, "first"))  # 3 output tokens each
    agg = MetricsAggregate()
    agg.merge(recorder.take_delta())
    return RunSnapshot(config=cfg, aggregate=agg, t0_unix_s=1.0, t_end_unix_s=None)


def test_the_live_gauges_come_from_the_fronts_file(tmp_path) -> None:
    live = {"t0_unix_s": 1.0, "complete": True, "sources": [
        {"source": "gpu-0", "target": "a", "energy_j": 4.0, "average_power_w": 2.0, "power_w": 3.0, "t_unix_s": 3.0},
        {"source": "gpu-1", "target": "", "energy_j": 2.0, "average_power_w": 1.0, "power_w": 1.0, "t_unix_s": 3.0},
    ]}  # fmt: skip
    fams = {f.name: f for f in text_string_to_metric_families(render(collect(_snapshot(tmp_path, live))))}
    energy = {s.labels["source"]: (s.labels["target"], s.value) for s in fams["loadgen_gpu_energy_joules"].samples}
    assert energy == {"gpu-0": ("a", 4.0), "gpu-1": ("", 2.0)}
    assert [s.value for s in fams["loadgen_gpu_power_watts"].samples] == [2.0, 1.0]
    assert fams["loadgen_output_tokens_per_joule"].samples[0].value == 12 / 6.0
    assert fams["loadgen_joules_per_million_output_tokens"].samples[0].value == 6.0 / 12 * 1e6
    assert {"loadgen_gpu_energy_joules", "loadgen_output_tokens_per_joule"} <= set(EXPORTED_NAMES)


def test_no_file_or_an_incomplete_one_gives_no_ratio(tmp_path) -> None:
    names = {f.name for f in text_string_to_metric_families(render(collect(_snapshot(tmp_path, None))))}
    assert not any("joule" in n or "watts" in n for n in names)
    live = {"complete": False, "sources": [{"source": "gpu-0", "target": "", "energy_j": 4.0, "average_power_w": 2.0}]}
    fams = {f.name for f in text_string_to_metric_families(render(collect(_snapshot(tmp_path, live))))}
    assert "loadgen_gpu_energy_joules" in fams and "loadgen_output_tokens_per_joule" not in fams


def _energy(j: float | None) -> dict:
    return {"energy_j": j, "average_power_w": None if j is None else j / 10, "output_tokens_per_joule": None if j is None else 2.0,
            "joules_per_1m_output_tokens": None if j is None else 5e5, "method": "energy counter"}  # fmt: skip


def test_the_text_lines_give_the_run_and_each_tied_target() -> None:
    s = {"energy": _energy(1000.0), "by_target": {"a": {"energy": _energy(None)}, "b": {"energy": None}}}
    assert energy_lines(s) == [
        "energy      all: 100.0 W avg, 1,000 J  |  2.000 output tokens/J  |  500,000 J per 1M output tokens  (energy counter)",
        "energy      a: no figure (see the notes)",
    ]
    assert energy_lines({"energy": None}) == []


def test_compare_shows_energy_only_when_a_run_has_it() -> None:
    assert _energy_items({"energy": None}, {}) == []
    items = dict((name, (a, b)) for name, a, b in _energy_items({"energy": _energy(1000.0)}, {"energy": None}))
    assert items["output tokens/J"] == (2.0, None) and items["GPU energy J"] == (1000.0, None)


def test_a_bad_flag_is_one_line_before_anything_starts(tmp_path) -> None:
    r = CliRunner().invoke(main, ["run", "--power-metrics", "gpu-host:9400", "--results", str(tmp_path / "r")])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and lines == ["Error: --power-metrics 'gpu-host:9400': not an http(s) URL; give e.g. http://gpu-host:9400/metrics"]
    assert not (tmp_path / "r").exists()


def test_embedded_needs_the_embedded_fleet(tmp_path) -> None:
    r = CliRunner().invoke(main, ["run", "--target", "http://127.0.0.1:1", "--power-metrics", "embedded", "--results", str(tmp_path / "r")])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "Error: --power-metrics embedded: the run has a --target, not the embedded fleet; give the exporter's URL (URL or TARGET=URL)"
    ]
