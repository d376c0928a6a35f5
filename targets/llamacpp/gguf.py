"""Read a GGUF file's metadata (the key-value header) without loading any tensor.

Only what calibration needs: the architecture's layer count and attention shape, from which the
KV cache's bytes per token follow. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(little-endian: magic ``GGUF``, version, tensor count, key-value count, then the key-values).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

# value type -> struct format of one scalar; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
F16_BYTES = 2  # llama.cpp's default KV cache type (-ctk/-ctv f16)


class GGUFError(ValueError):
    """Not a GGUF file, or one cut short; ``str()`` is one line."""


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("file ends inside its metadata")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("file ends inside its metadata")
    return data.decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALARS:  # skipped: arrays (vocabularies) are not needed here
            f.seek(count * struct.calcsize(_SCALARS[etype]), 1)
        else:
            for _ in range(count):
                _value(f, etype)
        return None
    raise GGUFError(f"unknown metadata value type {vtype}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every scalar and string key of the header (arrays map to None)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise GGUFError(f"{path} is not a GGUF file")
            _read(f, "<I")  # version
            _read(f, "<Q")  # tensor count
            n_kv = _read(f, "<Q")
            out: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(f)
                out[key] = _value(f, _read(f, "<I"))
            return out
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror or e}") from None


def kv_bytes_per_token(meta: dict[str, Any], cache_bytes: int = F16_BYTES) -> float:
    """K and V bytes one token takes in the KV cache: layers x KV heads x (key + value dims)."""
    arch = meta.get("general.architecture")
    try:
        layers = int(meta[f"{arch}.block_count"])
        heads = int(meta[f"{arch}.attention.head_count"])
        embd = int(meta[f"{arch}.embedding_length"])
    except (KeyError, TypeError) as e:
        raise GGUFError(f"GGUF metadata lacks {e} for architecture {arch!r}") from None
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    key_dim = int(meta.get(f"{arch}.attention.key_length") or embd // heads)
    value_dim = int(meta.get(f"{arch}.attention.value_length") or embd // heads)
    return float(layers * kv_heads * (key_dim + value_dim) * cache_bytes)
