"""Prefix-cache hits on the sim: an anonymised file replays its original's, and the LRU model
of inspect/analyze predicts them when the sim's KV evicts.

**Anonymised.** The original is a session file with texts (shared, partly overlapping system
prompts of two tenants; multi-turn conversations), as a capture writes one. Both sets of sessions
are replayed in one run against the embedded sim, their lines interleaved (one run, not two: a
run's start costs more than its load). Their texts share no block (the anonymised ones are words
drawn per block id), the sim's default profile holds 1.75M tokens of KV, far more than the working
set, so nothing is evicted and neither set changes the other's hits. The hit rate is the sim's own
count (``usage.prompt_tokens_details.cached_tokens`` over ``prompt_tokens``), per set of sessions.
Margin: within 2% (relative) of the original's. The anonymised file keeps every size and every
shared prefix to the 16-token block (the sim's block size is 16), and sends the system prompt in
the first user message: one template token fewer per request, which shifts block boundaries by
one token in both sessions of a shared prefix alike. The same anonymised sessions written as
Mooncake rows (``--anonymize-format mooncake``) replay in a run of their own to the same margin.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from tests.integration.runs import loadgen, records, run_dir
from workloads import load_workload, write_sessions_jsonl

SPEC = """\
name: anonymize-check
system_prompt_tokens: {dist: uniform, low: 150, high: 400}
turns: {dist: uniform, low: 2, high: 4}
first_user_tokens: {dist: uniform, low: 40, high: 200}
user_tokens: {dist: uniform, low: 20, high: 120}
output_tokens: {dist: uniform, low: 16, high: 48}
think_time: 20ms
tenants:
  - {name: team-a, weight: 1}
  - {name: team-b, weight: 1}
"""


def _hit_rate(recs) -> float:
    assert recs and all(r.ok for r in recs)
    return sum(r.cached_tokens or 0 for r in recs) / sum(r.prompt_tokens for r in recs)


@pytest.mark.slow
def test_an_anonymised_file_replays_the_originals_cache_hits_on_the_sim(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    original = write_sessions_jsonl(load_workload(str(spec)), 3, 16, tmp_path / "original.jsonl")
    anonymised = tmp_path / "anonymised.jsonl"
    out = CliRunner().invoke(main, ["workload", "anonymize", str(original), "--block-size", "16", "-o", str(anonymised)])
    assert out.exit_code == 0, out.output
    assert "wrote 16 anonymised sessions" in out.output
    both = tmp_path / "both.jsonl"
    pairs = zip(original.read_text().splitlines(), anonymised.read_text().splitlines(), strict=True)
    both.write_text("".join(f"{a}\n{b}\n" for a, b in pairs))
    r = loadgen(
        "run", "--workload", str(both), "--rate", "20", "--seed", "3", "--time-scale", "0",
        "--results", str(tmp_path / "res"), "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    recs = records(run_dir(tmp_path / "res"))
    anon = [x for x in recs if x.session_id.startswith("anon-")]
    orig = [x for x in recs if not x.session_id.startswith("anon-")]
    assert len(orig) == len(anon) > 16
    assert sorted(x.prompt_tokens for x in anon) != sorted(x.prompt_tokens for x in orig)  # one marker fewer
    orig_rate, anon_rate = _hit_rate(orig), _hit_rate(anon)
    assert orig_rate > 0.3  # the sessions do reuse: histories and the tenants' prompts
    assert abs(anon_rate - orig_rate) <= 0.02 * orig_rate, (orig_rate, anon_rate)
    # The same sessions as Mooncake rows (AIPerf's multi-turn mooncake_trace), read by the Mooncake
    # reader: their own run, as a file holds one format; the same margin against the original.
    rows = tmp_path / "anonymised-mooncake.jsonl"
    out = CliRunner().invoke(main, ["workload", "anonymize", str(original), "--block-size", "16",
                                    "--anonymize-format", "mooncake", "-o", str(rows)])  # fmt: skip
    assert out.exit_code == 0, out.output
    r = loadgen(
        "run", "--workload", str(rows), "--workload-options", "block_size=16", "--rate", "20", "--seed", "3",
        "--time-scale", "0", "--results", str(tmp_path / "res-mooncake"), "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    mooncake = records(run_dir(tmp_path / "res-mooncake"))
    assert len(mooncake) == len(orig) and {x.session_id for x in mooncake} == {x.session_id for x in anon}
    mooncake_rate = _hit_rate(mooncake)
    assert abs(mooncake_rate - orig_rate) <= 0.02 * orig_rate, (orig_rate, mooncake_rate)


@pytest.mark.slow
def test_the_sims_hit_rate_with_a_small_kv_cache_is_the_lru_prediction_at_that_capacity(tmp_path):
    """The LRU over block hashes that inspect and analyze run predicts the sim's hit rate when the
    sim's KV (8,192 tokens: a quarter of the trace's working set) evicts. Margin 2 points: the
    sim also pins the blocks of requests in flight, which the model leaves out (requests here
    rarely overlap: the trace's gaps are ~24 ms at this scale, a request takes ~1 ms)."""
    import json
    from importlib import resources

    from workloads.analyze import analyze_workload

    mooncake = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "mooncake.jsonl"
    profile = json.loads((resources.files("targets.sim") / "profiles" / "h200-llama3-8b-fp8.json").read_text())
    kv_tokens = 8192
    profile.update(name="h200-small-kv", kv_capacity_tokens=kv_tokens, max_model_len=kv_tokens)
    profile_file = tmp_path / "small-kv.json"
    profile_file.write_text(json.dumps(profile))
    n = 120
    r = loadgen(
        "run", "--workload", str(mooncake), "--num-sessions", str(n), "--trace-time-scale", "0.02",
        "--time-scale", "0", "--profile", str(profile_file), "--results", str(tmp_path / "res"),
        "--seed", "4", "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    sim_rate = _hit_rate(records(run_dir(tmp_path / "res")))
    pc = analyze_workload(load_workload(mooncake), n=n, block_size=profile["block_size_tokens"],
                          capacities_tokens=[kv_tokens])["prefix_cache"]  # fmt: skip
    predicted = pc["hit_rate_at"][0]["hit_rate"]
    assert pc["working_set_tokens"] > 2 * kv_tokens and sim_rate < pc["reuse"] - 0.2  # it does evict
    assert abs(sim_rate - predicted) <= 0.02, (sim_rate, predicted, pc["reuse"])
