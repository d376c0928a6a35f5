"""--tokenizer: exact prompt lengths with a Hugging Face tokenizer made here (no download)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

from workloads import load_workload  # noqa: E402
from workloads.errors import WorkloadError  # noqa: E402
from workloads.hf_tokenizer import load_hf_tokenizer, resolve_tokenizer_file  # noqa: E402
from workloads.tokenizer import VOCABULARY  # noqa: E402

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"


def train_bpe(path: Path, vocab_size: int = 700) -> Path:
    """A small byte-level BPE tokenizer trained on loadgen's words and some punctuation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(1)
    corpus = [" ".join(rng.choices(VOCABULARY[:160], k=60)) for _ in range(400)]
    corpus += ["Hello, world! Why does this test fail? Because the value is wrong."] * 30
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_texts_have_exactly_the_asked_token_count(tokenizer_json):
    tok = load_hf_tokenizer(str(tokenizer_json))
    assert len(tok.words) >= 10
    rng = random.Random(3)
    for n in (1, 2, 7, 64, 513, 4096):
        assert tok.count(tok.text(n, rng)) == n
    info = tok.describe()
    assert info["kind"] == "huggingface" and len(info["sha256"]) == 64 and info["vocab_size"] <= 700


def test_a_directory_or_a_cached_model_name_resolves_to_its_tokenizer_json(tokenizer_json, tmp_path, monkeypatch):
    assert resolve_tokenizer_file(str(tokenizer_json.parent)) == tokenizer_json
    snap = tmp_path / "hub" / "models--acme--tiny-lm" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").write_text(tokenizer_json.read_text())
    (tmp_path / "hub" / "models--acme--tiny-lm" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-lm" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_tokenizer_file("acme/tiny-lm") == snap / "tokenizer.json"
    with pytest.raises(WorkloadError, match="no model of that name in the local Hugging Face cache"):
        resolve_tokenizer_file("acme/missing")
    with pytest.raises(WorkloadError, match=r"the directory holds no tokenizer\.json"):
        resolve_tokenizer_file(str(tmp_path))


def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(WorkloadError) as e:
        load_hf_tokenizer(str(bad))
    assert "not a tokenizers tokenizer.json" in str(e.value) and "\n" not in str(e.value)


def test_dataset_prompts_and_reply_lengths_follow_the_tokenizer(tokenizer_json):
    tok = load_hf_tokenizer(str(tokenizer_json))
    mc = load_workload(FIX / "mooncake.jsonl", tokenizer=tok)
    rows = [json.loads(line) for line in (FIX / "mooncake.jsonl").read_text().splitlines()]
    by_line = {f"mooncake-L{i + 1}": r for i, r in enumerate(rows)}
    for k in (0, 7, 100):
        s = mc.session(1, k)
        assert tok.count(s.turns[0].content) == by_line[s.session_id]["input_length"]
    az = load_workload(FIX / "azure.csv", tokenizer=tok)
    first = (FIX / "azure.csv").read_text().splitlines()[1].split(",")
    assert tok.count(az.session(0, 0).turns[0].content) == int(first[1])
    sg = load_workload(FIX / "sharegpt.json", tokenizer=tok)
    conv = json.loads((FIX / "sharegpt.json").read_text())[1]["conversations"]
    replies = [m["value"] for m in conv if m["from"] == "gpt"]
    assert [t.max_tokens for t in sg.session(0, 1).turns] == [tok.count(r) for r in replies]
    assert mc.fingerprint() != load_workload(FIX / "mooncake.jsonl").fingerprint()
