"""Anonymised sessions (workloads.anonymize): no text, prefix-chained salted ids, shape kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from workloads import Session, Turn, load_workload, plan_session
from workloads.anonymize import anonymize_session, anonymized_record, new_salt, write_anonymized
from workloads.tokenizer import count_tokens

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
SALT = bytes(range(16))
# Words the session format itself writes (keys and values), which an original text may also hold.
FORMAT_WORDS = {"tokens", "hash_ids", "block_size", "max_tokens", "think_time", "role", "user", "tool", "tenant",
                "default", "system_prompt_tokens", "turns", "arrival_s", "content", "anon", "cold", "true"}  # fmt: skip


def _session(system: str, *messages: str, index: int = 0) -> Session:
    turns = tuple(Turn(m, 8, think_time_s=0.5 if i else 0.0) for i, m in enumerate(messages))
    return Session(f"s{index}", "default", system, turns, index=index)


def test_no_text_of_the_original_is_in_the_file(tmp_path):
    src = FIX / "sharegpt.json"
    out = tmp_path / "anon.jsonl"
    r = CliRunner().invoke(main, ["workload", "anonymize", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    written = out.read_text()
    wl = load_workload(src)
    words = set()
    for k in range(wl.num_sessions):
        s = wl.session(0, k)
        for text in (s.system_prompt, *(t.content for t in s.turns)):
            words.update(w.lower() for w in re.findall(r"[A-Za-z]{4,}", text))
    leaked = {w for w in words - FORMAT_WORDS if w in written.lower()}
    assert not leaked and words
    for line in written.splitlines():
        rec = json.loads(line)
        assert rec["id"].startswith("anon-") and rec["system_prompt_tokens"] == 0
        assert all(t.get("content", "") == "" for t in rec["turns"])


def test_equal_prefixes_share_ids_and_a_difference_changes_every_later_id():
    a = anonymize_session(_session("You are terse.", "one two three four five six seven eight x y z w"), salt=SALT, block_size=4)
    b = anonymize_session(_session("You are terse.", "one two three four nine six seven eight x y z w"), salt=SALT, block_size=4)
    # The system prompt's 4 tokens (You are terse .) lead the first turn's blocks of 4 tokens.
    assert a.turns[0].tokens == b.turns[0].tokens == 4 + 12
    assert a.turns[0].hash_ids[:2] == b.turns[0].hash_ids[:2]
    # Block 2 holds "nine" in b: it differs, and so does block 3, whose own tokens are the same.
    assert a.turns[0].hash_ids[2] != b.turns[0].hash_ids[2]
    assert a.turns[0].hash_ids[3] != b.turns[0].hash_ids[3]
    # A follow-up's ids chain on from the turn it extends: the same words, other ids after a difference.
    c = anonymize_session(_session("You are terse.", "one two three four", "same words here now"), salt=SALT, block_size=4)
    d = anonymize_session(_session("You are terse.", "one two three FOUR", "same words here now"), salt=SALT, block_size=4)
    assert c.turns[1].hash_ids != d.turns[1].hash_ids
    e = anonymize_session(_session("You are terse.", "one two three four", "same words here now"), salt=SALT, block_size=4)
    assert e == c  # a pure function of the session and the salt


def test_the_salt_differs_per_file_so_ids_do_not_carry_across(tmp_path):
    s = _session("A shared system prompt that many agents send.", "hello there")
    assert anonymize_session(s, salt=new_salt()).turns[0].hash_ids != anonymize_session(s, salt=new_salt()).turns[0].hash_ids
    src = FIX / "sharegpt.json"
    runner = CliRunner()
    for name in ("a.jsonl", "b.jsonl"):
        assert runner.invoke(main, ["workload", "anonymize", str(src), "-o", str(tmp_path / name)]).exit_code == 0
    ids = [{h for line in (tmp_path / n).read_text().splitlines() for t in json.loads(line)["turns"] for h in t.get("hash_ids", ())}
           for n in ("a.jsonl", "b.jsonl")]  # fmt: skip
    assert ids[0] and not ids[0] & ids[1]
    with pytest.raises(ValueError):
        anonymize_session(s, salt=b"short")


def test_sizes_timings_and_structure_are_kept(tmp_path):
    src = FIX / "bailian.jsonl"  # chats: multi-turn sessions with think times and arrivals
    wl = load_workload(src)
    out = tmp_path / "anon.jsonl"
    assert write_anonymized(wl, 0, None, out, block_size=16) == wl.num_sessions
    anon = load_workload(out)
    assert anon.num_sessions == wl.num_sessions
    assert list(anon.arrival_offsets()) == pytest.approx(list(wl.arrival_offsets()), abs=1e-6)
    for k in range(wl.num_sessions):
        s, a = wl.session(0, k), anon.session(0, k)
        assert [t.max_tokens for t in a.turns] == [t.max_tokens for t in s.turns]
        assert [t.think_time_s for t in a.turns] == pytest.approx([t.think_time_s for t in s.turns])
        sizes = [count_tokens(t.content) for t in s.turns]
        sizes[0] += count_tokens(s.system_prompt)
        assert [count_tokens(t.content) for t in a.turns] == sizes
    fan = tmp_path / "fan.jsonl"
    r = CliRunner().invoke(main, ["workload", "anonymize", "agentic-fanout", "-n", "3", "-o", str(fan)])
    assert r.exit_code == 0, r.output
    src_wl, anon_wl = load_workload("agentic-fanout"), load_workload(fan)
    for k in range(3):
        src_s, anon_s = src_wl.session(0, k), anon_wl.session(0, k)
        want, got = plan_session(src_s), plan_session(anon_s)
        assert got.is_dag() and got.steps == want.steps
        assert [t.tool_call for t in anon_s.turns] == [t.tool_call for t in src_s.turns]
    rec = anonymized_record(anonymize_session(_session("", "x", ""), salt=SALT))
    assert rec["turns"][1] == {"content": "", "max_tokens": 8, "think_time": 0.5, "role": "user"}


def test_a_bad_block_size_or_output_is_a_one_line_error(tmp_path):
    r = CliRunner().invoke(main, ["workload", "anonymize", str(FIX / "azure.csv"), "--block-size", "0", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--block-size" in r.output
    r = CliRunner().invoke(main, ["workload", "anonymize", str(FIX / "azure.csv"), "-o", str(tmp_path / "no" / "o.jsonl")])
    assert r.exit_code == 2 and "cannot write the anonymised file" in r.output and "Traceback" not in r.output


def test_an_anonymised_trace_has_the_originals_prefix_reuse(tmp_path):
    from workloads.inspect import inspect_workload

    src = FIX / "mooncake.jsonl"
    out = tmp_path / "anon.jsonl"
    assert write_anonymized(load_workload(src), 0, None, out) == 240
    original, anonymised = inspect_workload(load_workload(src)), inspect_workload(load_workload(out))
    assert anonymised["prefix_cache"]["block_size"] == 512  # the file's own, as the trace's
    for key in ("prompt_tokens", "reused_tokens", "unique_shared_blocks", "working_set_tokens"):
        assert anonymised["prefix_cache"][key] == original["prefix_cache"][key], key
