"""``workload inspect`` counts from the records (no prompt text built) and scopes every figure to -n."""

from __future__ import annotations

import json
import random
from pathlib import Path

from click.testing import CliRunner

from loadgen.cli import main
from workloads import load_workload
from workloads.inspect import inspect_workload
from workloads.text import BuiltinTokenizer

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
MOONCAKE = FIX / "mooncake.jsonl"


class CountingTokenizer(BuiltinTokenizer):
    """loadgen's tokenizer, counting what it is asked: texts built, texts counted, word lists taken."""

    def __init__(self) -> None:
        self.built = self.counted = self.words_taken = 0

    def count(self, text: str) -> int:
        self.counted += 1
        return super().count(text)

    def text(self, n_tokens: int, rng: random.Random) -> str:
        self.built += 1
        return super().text(n_tokens, rng)

    @property
    def words(self) -> tuple[str, ...]:
        self.words_taken += 1
        return super().words


def _mooncake_reuse(n: int, block_size: int = 512) -> float:
    """Share of prompt tokens in leading hash_ids an earlier one of the first n requests sent."""
    rows = sorted((json.loads(x) for x in MOONCAKE.read_text().splitlines()), key=lambda r: r["timestamp"])[:n]
    seen: set[int] = set()
    reused = total = 0
    for r in rows:
        total += r["input_length"]
        for i, b in enumerate(r["hash_ids"]):
            if b not in seen:
                break
            reused += min(block_size, r["input_length"] - block_size * i)
        seen.update(r["hash_ids"])
    return reused / total


def test_n_scopes_every_figure_prefix_reuse_included():
    wl = load_workload(MOONCAKE)
    whole, first = inspect_workload(wl), inspect_workload(wl, n=30)
    assert first["sessions"] == 30 and first["first_turn_tokens"]["count"] == 30
    assert first["arrivals"]["count"] == 30 and first["output_tokens"]["count"] == 30
    assert first["prefix_cache"]["reuse"] == _mooncake_reuse(30)
    assert whole["prefix_cache"]["reuse"] == _mooncake_reuse(240)
    assert first["prefix_cache"]["reuse"] != whole["prefix_cache"]["reuse"]
    assert first["prefix_cache"]["prompt_tokens"] == first["first_turn_tokens"]["total"]
    rows = sorted((json.loads(x) for x in MOONCAKE.read_text().splitlines()), key=lambda r: r["timestamp"])
    assert first["prefix_cache"]["unique_shared_blocks"] == len({b for r in rows[:30] for b in r["hash_ids"]})
    assert whole["prefix_cache"]["unique_shared_blocks"] == len({b for r in rows for b in r["hash_ids"]})
    # The reader's whole-file figure is not passed off as the scoped one.
    assert "prefix_reuse" not in first.get("reader", {})


def test_inspect_builds_no_prompt_text_from_counts(tmp_path):
    rng = random.Random(5)
    azure = tmp_path / "azure.csv"
    rows = [f"{i * 0.01:.2f},{rng.randint(1, 3000)},{rng.randint(0, 300)}" for i in range(5000)]
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    counts_only = tmp_path / "counts.jsonl"
    r = CliRunner().invoke(main, ["workload", "export", str(MOONCAKE), "--counts-only", "-o", str(counts_only)])
    assert r.exit_code == 0, r.output
    for path in (azure, MOONCAKE, counts_only, FIX / "bailian.jsonl", FIX / "burstgpt.csv"):
        tok = CountingTokenizer()
        fig = inspect_workload(load_workload(path, tokenizer=tok), tokenizer=tok)
        assert (tok.built, tok.counted, tok.words_taken) == (0, 0, 0), path
        assert fig["sessions"] == fig["sessions_in_source"]
    assert fig["first_turn_tokens"]["count"] > 0


def test_a_text_dataset_is_counted_once_per_text():
    tok = CountingTokenizer()
    wl = load_workload(FIX / "sharegpt.json", tokenizer=tok)
    tok.counted = 0  # the reader counts the recorded answers for max_tokens; that is not inspect's
    fig = inspect_workload(wl, tokenizer=tok)
    texts = sum(len(wl.record(k)["turns"]) + bool(wl.record(k).get("system_prompt")) for k in range(wl.num_sessions))
    assert tok.counted == texts and tok.built == 0
    assert fig["prefix_cache"]["reused_tokens"] > 0  # follow-ups re-send their history


def test_inspect_prints_the_reuse_and_the_kv_that_realises_it():
    r = CliRunner().invoke(main, ["workload", "inspect", str(MOONCAKE), "-n", "30"])
    assert r.exit_code == 0, r.output
    assert "30 sessions of 240" in r.output
    assert f"prefix reuse        {_mooncake_reuse(30):.1%}" in r.output
    assert "KV to realise it    an LRU cache of" in r.output
    assert "hit rate by KV      65,536 tokens " in r.output
    r = CliRunner().invoke(main, ["workload", "inspect", str(FIX / "azure.csv")])
    assert r.exit_code == 0 and "nothing to reuse" in r.output
    # The reader's counts are of the whole file: said so when -n covers less of it.
    cut = CliRunner().invoke(main, ["workload", "inspect", str(FIX / "bailian.jsonl"), "-n", "2"]).output
    whole = CliRunner().invoke(main, ["workload", "inspect", str(FIX / "bailian.jsonl")]).output
    assert "1 chats whose parent is not in the file (started sessions of their own) (whole file)" in cut
    assert "orphan" not in whole and "(whole file)" not in whole and "1 chats whose parent" in whole


def test_a_trace_read_as_a_stream_is_read_once_and_only_as_far_as_n(tmp_path):
    from workloads.readers import get_reader
    from workloads.streamed import StreamedTraceWorkload

    azure = tmp_path / "azure.csv"
    rows = [f"{i * 0.5:.1f},{100 + i},{1 + i % 7}" for i in range(300)]
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    tok = CountingTokenizer()
    wl = StreamedTraceWorkload(get_reader("azure"), azure, {}, tokenizer=tok)
    first = inspect_workload(wl, n=40, tokenizer=tok)
    assert first["sessions"] == 40 and first["sessions_in_source"] is None and first["streamed"]
    assert first["first_turn_tokens"]["max"] == 139 and first["arrivals"]["span_s"] == 19.5
    whole = inspect_workload(wl, tokenizer=tok)
    assert whole["sessions"] == whole["sessions_in_source"] == 300
    assert whole["first_turn_tokens"]["total"] == sum(100 + i for i in range(300))
    assert tok.built == tok.counted == 0


def test_the_progress_line_reports_sessions_read_to_a_log(tmp_path):
    import io

    from workloads.progress import ReadProgress

    log = io.StringIO()
    progress = ReadProgress(log, "inspect big.csv", every_s=0.0)
    inspect_workload(load_workload(MOONCAKE), progress=progress)
    lines = log.getvalue().splitlines()
    assert lines and lines[-1].startswith("inspect big.csv: 240 sessions read, ")
