"""Data files compressed with gzip or zstd, told by their content (not their name) and read whole.

gzip (magic ``1f 8b``) is read with the standard library; zstd (magic ``28 b5 2f fd``) needs the
``zstandard`` package, and without it the error says so in one line.
"""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

from workloads.errors import WorkloadError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Names a compressed file often carries; detection goes by the content, these only help find the
# format's own extension (``data.json.gz`` is a ``.json`` file).
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd")


def compression(path: str | Path) -> str | None:
    """``"gzip"``, ``"zstd"`` or None (not compressed, or unreadable: the read then says why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return None


def data_suffix(path: str | Path) -> str:
    """The extension that names the format: ``.json`` for ``data.json.gz``, lower case."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in COMPRESSED_SUFFIXES:
        return Path(p.stem).suffix.lower()
    return suffix


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, decompressed when it is gzip or zstd; a one-line ``WorkloadError`` if broken.

    ``OSError`` from opening the file is left to the caller, which names what the file is.
    """
    kind = compression(path)
    if kind is None:
        return Path(path).read_bytes()
    if kind == "gzip":
        try:
            with gzip.open(path, "rb") as f:
                return f.read()
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise WorkloadError(
                f"{path}: gzip-compressed but cut short or corrupt ({e}); give a whole gzip file"
            ) from None
    try:
        import zstandard
    except ImportError:
        raise WorkloadError(f"{path} is zstd-compressed; pip install zstandard, or decompress it") from None
    try:
        with open(path, "rb") as raw:
            dctx = zstandard.ZstdDecompressor()
            try:
                reader = dctx.stream_reader(raw, read_across_frames=True)  # zstd -c a b > f: two frames
            except TypeError:  # zstandard before 0.16 reads one frame
                reader = dctx.stream_reader(raw)
            out = io.BytesIO()
            while chunk := reader.read(1 << 20):
                out.write(chunk)
            return out.getvalue()
    except zstandard.ZstdError as e:
        raise WorkloadError(f"{path}: zstd-compressed but cut short or corrupt ({e}); give a whole zstd file") from None


def read_text(path: str | Path, what: str) -> str:
    """The file's text (UTF-8, BOM allowed), decompressed first; one-line errors naming ``what``."""
    try:
        data = read_bytes(path)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read the {what} ({e.strerror or e}); give a readable file") from None
    try:
        return universal_newlines(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text; a {what} is UTF-8") from None


def universal_newlines(text: str) -> str:
    """``\r\n`` and ``\r`` as ``\n``, as a file opened in text mode reads them."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")
