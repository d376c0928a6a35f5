"""Datasets as their producers write them: FastChat and LLaMA-Factory ShareGPT, OpenAI chat JSONL,
BOMs, compressed files, the workload commands' flags and exported files' modes."""

from __future__ import annotations

import builtins
import gzip
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from loadgen.errors import UserError
from loadgen.runtime.run_workload import workload_file_text
from workloads import load_workload, write_sessions_jsonl
from workloads.errors import WorkloadError
from workloads.readers import detect_format
from workloads.tokenizer import count_tokens

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
FASTCHAT = FIX / "fastchat.json"
LLAMAFACTORY = FIX / "llamafactory.json"
OPENAI = FIX / "openai_chat.jsonl"
SHAREGPT = FIX / "sharegpt.json"
MOONCAKE = FIX / "mooncake.jsonl"
AZURE = FIX / "azure.csv"


def _sessions(wl, seed=0):
    return [wl.session(seed, k) for k in range(wl.num_sessions)]


def _by_id(wl):
    return {s.session_id: s for s in _sessions(wl)}


# --- ShareGPT as FastChat and LLaMA-Factory write it -----------------------------------------------


def test_fastchat_top_level_system_is_the_system_prompt():
    s = _by_id(load_workload(FASTCHAT))["fc-system"]
    assert s.system_prompt == "You are a terse assistant."
    assert [t.content for t in s.turns] == ["What is a list?"]


def test_top_level_system_comes_before_a_leading_system_message(tmp_path):
    f = tmp_path / "c.json"
    conv = {"system": "Top.", "conversations": [{"from": "system", "value": "Inline."},
                                                 {"from": "human", "value": "q"}, {"from": "gpt", "value": "a b"}]}
    f.write_text(json.dumps([conv]))
    assert load_workload(f).session(0, 0).system_prompt == "Top.\n\nInline."


def test_a_reply_without_text_skips_its_question_and_is_counted():
    wl = load_workload(FASTCHAT)
    s = _by_id(wl)["fc-empty-reply"]
    # The question whose reply has no text has no known output length: it is not replayed.
    assert [t.content for t in s.turns] == ["Second question here"]
    assert s.turns[0].max_tokens == count_tokens("A reply of six words here.")
    assert all(t.max_tokens > 1 for x in _sessions(wl) for t in x.turns)
    assert wl.stats["empty_replies_left_out"] == 1


def test_consecutive_replies_are_merged_into_one_answer():
    s = _by_id(load_workload(FASTCHAT))["fc-two-replies"]
    assert len(s.turns) == 1
    assert s.turns[0].max_tokens == count_tokens("First thing is this.\n\nSecond thing is that one.")


def test_llamafactory_function_call_and_observation_roles():
    wl = load_workload(LLAMAFACTORY)
    s = wl.session(0, 0)
    conv = json.loads(LLAMAFACTORY.read_text())[0]["conversations"]
    assert s.system_prompt == "You can call tools."
    assert [(t.role, t.content) for t in s.turns] == [("user", conv[0]["value"]), ("tool", conv[2]["value"])]
    # The function call is the assistant's answer to the question: its JSON's tokens are its length.
    assert s.turns[0].max_tokens == count_tokens(conv[1]["value"]) > 1
    assert s.turns[1].max_tokens == count_tokens(conv[3]["value"])


def test_tool_role_is_a_tool_result(tmp_path):
    f = tmp_path / "t.json"
    conv = [{"from": "human", "value": "run it"}, {"from": "gpt", "value": "ok running"},
            {"from": "tool", "value": "exit 0"}, {"from": "gpt", "value": "it passed"}]
    f.write_text(json.dumps([{"conversations": conv}]))
    assert [t.role for t in load_workload(f).session(0, 0).turns] == ["user", "tool"]


# --- OpenAI chat JSONL -----------------------------------------------------------------------------


def test_openai_content_parts_and_developer_role():
    wl = load_workload(OPENAI)
    assert detect_format(OPENAI) == "sharegpt"
    s = wl.session(0, 0)
    assert s.system_prompt == "Answer in one sentence."
    assert s.turns[0].content == "Describe this picture.\nBe brief."
    assert s.turns[0].max_tokens == count_tokens("A cat on a mat.")
    assert wl.stats["non_text_parts_skipped"] == 1


def test_openai_tool_calls_tool_messages_and_max_tokens():
    s = load_workload(OPENAI).session(0, 1)
    assert s.system_prompt == "You are a coding agent."
    assert [(t.role, t.content) for t in s.turns] == [
        ("user", "Read main.py"),
        ("tool", "print('hello world')"),
        ("user", "Now add a test"),
    ]
    call = json.dumps({"name": "read_file", "arguments": {"path": "main.py"}}, ensure_ascii=False)
    assert s.turns[0].max_tokens == count_tokens(call) > 1
    assert s.turns[1].max_tokens == count_tokens("The file prints hello world.")
    assert s.turns[2].max_tokens == 300  # the line's max_tokens: the last question has no recorded reply


def test_openai_bad_content_part_is_one_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]},
                                          {"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(WorkloadError, match=r"line 1: messages\[0\]\.content\[0\]\.text") as e:
        load_workload(f)
    assert "\n" not in str(e.value)


def test_openai_bad_max_tokens_is_one_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}) + "\n")
    with pytest.raises(WorkloadError, match=r"line 1: max_tokens: 0 is not allowed"):
        load_workload(f)


# --- BOM -------------------------------------------------------------------------------------------


def test_session_file_with_a_bom_is_read(tmp_path):
    f = tmp_path / "s.jsonl"
    line = json.dumps({"id": "a", "turns": [{"content": "x", "max_tokens": 2}]})
    f.write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\n")
    wl = load_workload(f)
    assert wl.kind == "sessions" and wl.session(0, 0).session_id == "a"


# --- compressed files ------------------------------------------------------------------------------


@pytest.mark.parametrize("src", [SHAREGPT, MOONCAKE, AZURE, OPENAI], ids=lambda p: p.name)
def test_gzip_is_read_transparently_by_every_reader(tmp_path, src):
    plain = load_workload(src)
    gz = tmp_path / (src.name + ".gz")
    gz.write_bytes(gzip.compress(src.read_bytes()))
    wl = load_workload(gz)
    assert wl.kind == plain.kind and wl.num_sessions == plain.num_sessions

    def content(w):  # ids and the workload's name follow the file name
        return [(s.system_prompt, s.turns) for s in _sessions(w, 3)]

    assert content(wl) == content(plain)
    # Detected by content, not by name.
    hidden = tmp_path / src.name
    hidden.write_bytes(gz.read_bytes())
    assert _sessions(load_workload(hidden), 3) == _sessions(plain, 3)


def test_gzip_session_file(tmp_path):
    src = tmp_path / "s.jsonl"
    write_sessions_jsonl(load_workload("tiny"), 1, 5, src)
    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert _sessions(load_workload(gz)) == _sessions(load_workload(src))


def test_gzip_ships_decompressed_text(tmp_path):
    gz = tmp_path / "d.json.gz"
    gz.write_bytes(gzip.compress(SHAREGPT.read_bytes()))
    assert workload_file_text(str(gz)) == SHAREGPT.read_text(encoding="utf-8")


def test_gzip_over_the_ship_limit_is_read_from_the_same_path(tmp_path, monkeypatch):
    import loadgen.runtime.run_workload as rw

    gz = tmp_path / "d.json.gz"
    gz.write_bytes(gzip.compress(SHAREGPT.read_bytes()))
    monkeypatch.setattr(rw, "MAX_SHIPPED_BYTES", gz.stat().st_size + 10)  # compressed fits, text does not
    assert rw.workload_file_text(str(gz)) is None


def test_broken_gzip_is_one_line(tmp_path):
    gz = tmp_path / "d.json"
    gz.write_bytes(gzip.compress(SHAREGPT.read_bytes())[:200])
    with pytest.raises(WorkloadError, match="gzip-compressed but cut short or corrupt") as e:
        load_workload(gz)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="gzip-compressed but cut short or corrupt"):
        workload_file_text(str(gz))


def test_zstd_without_zstandard_is_one_line(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_zstandard(name, *args, **kwargs):
        if name == "zstandard":
            raise ImportError("no zstandard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zstandard)
    f = tmp_path / "d.json.zst"
    f.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)
    msg = f"{f} is zstd-compressed; pip install zstandard, or decompress it"
    with pytest.raises(WorkloadError) as e:
        load_workload(f)
    assert str(e.value) == msg
    with pytest.raises(UserError) as e2:
        workload_file_text(str(f))
    assert msg in str(e2.value)


# --- the workload commands' flags and exported files ----------------------------------------------


@pytest.mark.parametrize("flag", ["--workload-format", "--format"])
def test_workload_commands_take_workload_format(tmp_path, flag):
    runner = CliRunner()
    r = runner.invoke(main, ["workload", "inspect", str(SHAREGPT), flag, "sharegpt", "--json"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "o.jsonl"
    r = runner.invoke(main, ["workload", "export", str(MOONCAKE), flag, "mooncake", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file()


def test_exported_file_respects_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = write_sessions_jsonl(load_workload("tiny"), 0, 2, tmp_path / "o.jsonl")
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        os.umask(0o027)
        out2 = write_sessions_jsonl(load_workload("tiny"), 0, 2, tmp_path / "o2.jsonl")
        assert stat.S_IMODE(out2.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_zstd_is_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    f = tmp_path / "d.jsonl.zst"
    data = MOONCAKE.read_bytes()
    cut = len(data) // 2
    # Two frames, as ``zstd -c a b > f`` writes: both are read.
    f.write_bytes(zstandard.ZstdCompressor().compress(data[:cut]) + zstandard.ZstdCompressor().compress(data[cut:]))
    plain = load_workload(MOONCAKE)
    wl = load_workload(f)
    assert [s.turns for s in _sessions(wl)] == [s.turns for s in _sessions(plain)]
    assert workload_file_text(str(f)) == data.decode()
