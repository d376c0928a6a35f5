"""The GGUF metadata reader finds the attention shape behind the KV cache's bytes per token."""

from __future__ import annotations

import struct

import pytest

from targets.llamacpp.gguf import GGUFError, kv_bytes_per_token, read_metadata


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + payload


def gguf(tmp_path, *, cut: int = 0):
    kvs = [
        _kv("general.architecture", 8, _string("llama")),
        # arrays before the keys we need, as in real files: scalars (skipped by size) and strings
        _kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0.1, 0.2, 0.3)),
        _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + _string("a") + _string("bc")),
        _kv("llama.block_count", 4, struct.pack("<I", 30)),
        _kv("llama.embedding_length", 4, struct.pack("<I", 576)),
        _kv("llama.attention.head_count", 4, struct.pack("<I", 9)),
        _kv("llama.attention.head_count_kv", 4, struct.pack("<I", 3)),
        _kv("llama.rope.freq_base", 6, struct.pack("<f", 1e5)),
    ]
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    path = tmp_path / "m.gguf"
    path.write_bytes(body[: len(body) - cut])
    return path


def test_reads_scalars_and_skips_arrays(tmp_path) -> None:
    meta = read_metadata(gguf(tmp_path))
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30 and meta["tokenizer.ggml.tokens"] is None
    assert meta["llama.rope.freq_base"] == pytest.approx(1e5)
    # SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) dims x 2 bytes (f16)
    assert kv_bytes_per_token(meta) == 30 * 3 * 128 * 2 == 23_040


def test_bad_files_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(GGUFError, match="ends inside its metadata"):
        read_metadata(gguf(tmp_path, cut=3))
    (tmp_path / "x.gguf").write_bytes(b"NOPE")
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        read_metadata(tmp_path / "x.gguf")
    with pytest.raises(GGUFError, match="lacks"):
        kv_bytes_per_token({"general.architecture": "llama"})
