"""``loadgen capture --anonymize``: the file a real capture writes holds no prompt text, only
token counts and block ids, and reads back as the captured sessions; its flags' misuse is a
one-line error (exit 2)."""

from __future__ import annotations

import http.client
import json

import pytest
from click.testing import CliRunner

from loadgen.capture.process import CaptureProcess
from loadgen.cli import main
from workloads import load_workload

from .runs import sim

MARKER = "Quetzalcoatl"  # in every prompt sent; must appear nowhere in the file


def _chat(port: int, messages: list[dict]) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    body = {"messages": messages, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "X-Session-ID": "private-user-7"})  # fmt: skip
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    assert resp.status == 200
    return "".join(
        json.loads(line[5:])["choices"][0]["delta"].get("content") or ""
        for line in data.splitlines()
        if line.startswith("data: {") and '"choices":[{' in line
    )


@pytest.mark.parametrize("form", ["sessions", "mooncake"])
def test_an_anonymized_capture_holds_no_prompt_text(tmp_path, form) -> None:
    out = tmp_path / "anon.jsonl"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "0") as (proc, _):
        cap = CaptureProcess.start(
            ["--upstream", proc.url, "--out", str(out), "--anonymize", "--block-size", "4", "--anonymize-format", form]
        )
        try:
            h = [{"role": "system", "content": f"You help {MARKER} with code."},
                 {"role": "user", "content": f"{MARKER} asks: why does the parser drop lines?"}]  # fmt: skip
            h.append({"role": "assistant", "content": _chat(cap.port, h)})
            h.append({"role": "user", "content": f"Thanks from {MARKER}, now fix it."})
            _chat(cap.port, h)
        finally:
            assert cap.stop() == 0, cap.stderr()
    text = out.read_text()
    assert MARKER not in text and "parser" not in text and "private-user-7" not in text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    if form == "mooncake":  # a row per request, the session's key on each, its arrival on the first
        first, follow = lines
        assert sorted(first) == ["hash_ids", "input_length", "output_length", "session_id", "timestamp"]
        assert sorted(follow) == ["delay", "hash_ids", "input_length", "output_length", "session_id"]
        assert first["session_id"] == follow["session_id"] and first["session_id"].startswith("anon-") and follow["delay"] >= 0
        assert all(len(r["hash_ids"]) == -(-r["input_length"] // 4) for r in lines)
        wl = load_workload(str(out), options={"block_size": "4"})
    else:
        (rec,) = lines
        assert sorted(rec["turns"][0]) == ["block_size", "hash_ids", "max_tokens", "role", "tokens"]
        assert all(t["block_size"] == 4 and len(t["hash_ids"]) == -(-t["tokens"] // 4) for t in rec["turns"])
        wl = load_workload(str(out))
    (session,) = wl.sessions(0, 1)
    assert [t.max_tokens for t in session.turns] == [5, 5]


def test_block_size_without_anonymize_and_anonymize_with_redact_are_refused(tmp_path) -> None:
    base = ["capture", "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "x.jsonl")]
    for extra, message in (
        (["--block-size", "64"], "--block-size only applies with --anonymize"),
        (["--anonymize", "--redact"], "--anonymize writes no text at all, so --redact adds nothing"),
        (["--anonymize-format", "mooncake"], "--anonymize-format only applies with --anonymize"),
    ):
        r = CliRunner().invoke(main, [*base, *extra])
        assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / "x.jsonl").exists()
