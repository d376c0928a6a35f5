"""Datasets and traces replayed end to end against the embedded sim (real Locust master + worker).

These check what is replayed (sessions, sizes, intended times, cache reuse), not the generator's
timing, so the schedule-lag bound is loose: a busy CI machine must not fail them with exit 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from loadgen.cli import main
from tests.integration.runs import loadgen, records, run_dir
from workloads import load_workload

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
MOONCAKE = FIX / "mooncake.jsonl"
SHAREGPT = FIX / "sharegpt.json"


def trace_prefix_reuse(n: int) -> float:
    """Share of prompt tokens in leading blocks an earlier request of the first ``n`` sent (from hash_ids)."""
    rows = sorted((json.loads(line) for line in MOONCAKE.read_text().splitlines()), key=lambda r: r["timestamp"])
    seen: set[int] = set()
    reused = total = 0
    for row in rows[:n]:
        total += row["input_length"]
        for i, block in enumerate(row["hash_ids"]):
            if block not in seen:
                break
            reused += min(512, row["input_length"] - 512 * i)
        seen.update(row["hash_ids"])
    return reused / total


def test_mooncake_trace_replays_its_arrivals_and_its_prefix_reuse(tmp_path):
    n, scale = 80, 0.03
    r = loadgen(
        "run", "--workload", str(MOONCAKE), "--num-sessions", str(n), "--trace-time-scale", str(scale),
        "--time-scale", "0", "--results", str(tmp_path), "--seed", "4", "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    d = run_dir(tmp_path)
    run = json.loads((d / "run.json").read_text())
    assert run["arrival"]["kind"] == "trace" and run["arrival"]["source"] == "workload"
    assert run["workload"]["kind"] == "mooncake"
    recs = sorted(records(d), key=lambda x: x.session_index)
    assert [x.session_index for x in recs] == list(range(n)) and all(x.ok for x in recs)
    # Intended start times are the trace's timestamps, scaled (to the microsecond).
    want = load_workload(MOONCAKE).arrival_offsets()[:n] * scale
    got = np.array([x.t_sched_us for x in recs]) / 1e6
    assert np.allclose(got - got[0], want, atol=2e-6)
    # The sim's prefix cache sees the trace's block reuse (cache large enough that nothing is evicted).
    hit = sum(x.cached_tokens or 0 for x in recs) / sum(x.prompt_tokens for x in recs)
    expected = trace_prefix_reuse(n)
    assert abs(hit - expected) <= 0.05 * expected, (hit, expected)


def test_a_counts_only_export_of_mooncake_replays_the_trace_prefix_reuse(tmp_path):
    n, scale = 80, 0.03
    export = tmp_path / "counts.jsonl"
    out = CliRunner().invoke(
        main, ["workload", "export", str(MOONCAKE), "-n", str(n), "--seed", "4", "--counts-only", "-o", str(export)]
    )
    assert out.exit_code == 0, out.output
    r = loadgen(
        "run", "--workload", str(export), "--trace-time-scale", str(scale),
        "--time-scale", "0", "--results", str(tmp_path / "res"), "--seed", "4", "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    recs = records(run_dir(tmp_path / "res"))
    assert len(recs) == n and all(x.ok for x in recs)
    # Block ids survive the counts-only export: the sim's prefix cache sees the trace's reuse.
    hit = sum(x.cached_tokens or 0 for x in recs) / sum(x.prompt_tokens for x in recs)
    expected = trace_prefix_reuse(n)
    assert abs(hit - expected) <= 0.05 * expected, (hit, expected)


def test_sharegpt_conversations_replay_turn_by_turn_with_recorded_reply_lengths(tmp_path):
    r = loadgen(
        "run", "--workload", str(SHAREGPT), "--workload-options", "min_turns=3", "--num-sessions", "6",
        "--rate", "50", "--time-scale", "0", "--results", str(tmp_path), "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    d = run_dir(tmp_path)
    run = json.loads((d / "run.json").read_text())
    assert run["arrival"]["kind"] == "poisson" and run["workload"]["options"] == {"min_turns": "3"}
    wl = load_workload(SHAREGPT, options="min_turns=3")
    recs = records(d)
    by_session: dict[int, list] = {}
    for x in recs:
        by_session.setdefault(x.session_index, []).append(x)
    assert sorted(by_session) == list(range(6))
    for k, rs in by_session.items():
        s = wl.session(0, k)
        rs.sort(key=lambda x: x.turn_index)
        assert [x.session_id for x in rs] == [s.session_id] * len(s.turns)
        assert [x.max_tokens for x in rs] == [t.max_tokens for t in s.turns]
        assert [x.output_tokens for x in rs] == [t.max_tokens for t in s.turns]
        prompts = [x.prompt_tokens for x in rs]
        assert prompts == sorted(prompts)  # each turn re-sends the growing conversation


def test_workload_inspect_export_and_bad_files_before_any_load(tmp_path):
    cli = CliRunner()
    out = cli.invoke(main, ["workload", "inspect", str(MOONCAKE)])
    assert out.exit_code == 0, out.output
    assert "240 sessions of 240" in out.output and "prefix reuse" in out.output and "span 282.3 s" in out.output
    out = cli.invoke(main, ["workload", "inspect", str(SHAREGPT), "--workload-options", "max_turns=2", "--json"])
    fig = json.loads(out.output)
    assert fig["turns_per_session"]["max"] <= 2 and fig["workload"]["kind"] == "sharegpt"
    dest = tmp_path / "sessions.jsonl"
    out = cli.invoke(main, ["workload", "export", str(FIX / "azure.csv"), "-n", "20", "-o", str(dest)])
    assert out.exit_code == 0 and len(dest.read_text().splitlines()) == 20
    assert load_workload(dest).arrival_offsets() is not None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(MOONCAKE.read_text().splitlines()[0] + "\n" + '{"timestamp": 5, "input_length": 9}\n')
    r = loadgen("run", "--workload", str(bad), "--workload-format", "mooncake", "--results", str(tmp_path / "res"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith("bad.jsonl line 2: output_length: missing; every request needs output_length (tokens generated)")
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())


def test_a_tokenizer_builds_exact_prompts_and_the_server_count_checks_them(tmp_path):
    from tests.unit.test_hf_tokenizer import train_bpe

    tok = train_bpe(tmp_path / "tokenizer.json")
    azure = FIX / "azure.csv"
    n = 15
    r = loadgen(
        "run", "--workload", str(azure), "--tokenizer", str(tok), "--num-sessions", str(n), "--rate", "40",
        "--time-scale", "0", "--results", str(tmp_path / "res"), "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    d = run_dir(tmp_path / "res")
    run = json.loads((d / "run.json").read_text())
    assert run["tokenizer"]["kind"] == "huggingface" and run["tokenizer"]["path"] == str(tok)
    assert run["arrival"] == {"kind": "trace", "source": "workload", "time_scale": 1.0, "rate_per_s": 40.0}
    sizes = [int(line.split(",")[1]) for line in azure.read_text().splitlines()[1:]]
    wl = load_workload(azure)
    by_id = {wl.session(0, k).session_id: sizes[int(wl.session(0, k).session_id.rsplit("-L", 1)[1]) - 2] for k in range(n)}
    recs = records(d)
    assert len(recs) == n
    for x in recs:
        # The prompt is exactly ContextTokens for the tokenizer; the sim (whose tokenizer counts each of
        # those words as one token too) adds its template: one role marker and the generation prompt.
        assert x.client_prompt_tokens == by_id[x.session_id]
        assert x.prompt_tokens == x.client_prompt_tokens + 2
    summary = json.loads((d / "summary.json").read_text())
    check = summary["prompt_tokens_check"]
    assert check["requests"] == n and check["per_request"]["min"] == check["per_request"]["max"] == 2
    assert "prompt      server" in r.stdout + r.stderr
