"""Reading a trace incrementally: its text line by line (gzip and zstd too), and its rows one by one.

A reader that can iterate its rows (``WorkloadReader.iter_rows``) yields ``TraceRow``s in file
order, each validated as it is read, with the same one-line errors as the whole-file ``read``. A
streamed replay (``workloads.streamed``) reads a trace that way each time it needs it, so no
process ever holds the whole file: memory stays that of one buffer of text.
"""

from __future__ import annotations

import codecs
import gzip
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NamedTuple

from workloads.compressed import compression
from workloads.errors import WorkloadError

# Text is decoded in blocks of this size: the memory of a streamed read, whatever the file's size.
READ_BLOCK_BYTES = 1 << 16  # small: each block is decoded and split on the event loop of a worker


class TraceRow(NamedTuple):
    """One request of a trace: its line, its arrival on the trace's clock and its session record.

    ``time_s`` is seconds on the trace's own clock (for ISO datetimes, from the first row's), or
    None for a trace without times; ``record`` is the normalised session record
    (``workloads.dataset``: ``id``, ``tenant``, ``turns``).
    """

    lineno: int
    time_s: float | None
    record: dict[str, Any]


def _open_binary(path: Path, what: str) -> IO[bytes]:
    kind = compression(path)
    try:
        if kind == "gzip":
            return gzip.open(path, "rb")
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller's iteration
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read the {what} ({e.strerror or e}); give a readable file") from None
    if kind != "zstd":
        return raw
    try:
        import zstandard
    except ImportError:
        raw.close()
        raise WorkloadError(f"{path} is zstd-compressed; pip install zstandard, or decompress it") from None
    dctx = zstandard.ZstdDecompressor()
    try:
        return dctx.stream_reader(raw, read_across_frames=True, closefd=True)  # zstd -c a b > f: two frames
    except TypeError:  # zstandard before 0.16 reads one frame
        return dctx.stream_reader(raw)


def iter_text_lines(path: str | Path, what: str) -> Iterator[str]:
    """The file's lines (UTF-8, a BOM allowed; ``\\r\\n`` and ``\\r`` read as ``\\n``), decompressed
    as they are read; each line keeps its ``\\n``. One-line ``WorkloadError``s, as ``read_text``'s.
    """
    path = Path(path)
    try:
        import zstandard

        zstd_errors: tuple[type[BaseException], ...] = (zstandard.ZstdError,)
    except ImportError:
        zstd_errors = ()
    binary = _open_binary(path, what)
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    pending = ""
    try:
        with binary:
            while True:
                try:
                    block = binary.read(READ_BLOCK_BYTES)
                except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                    raise WorkloadError(
                        f"{path}: gzip-compressed but cut short or corrupt ({e}); give a whole gzip file"
                    ) from None
                except zstd_errors as e:
                    raise WorkloadError(
                        f"{path}: zstd-compressed but cut short or corrupt ({e}); give a whole zstd file"
                    ) from None
                except OSError as e:
                    raise WorkloadError(
                        f"{path}: cannot read the {what} ({e.strerror or e}); give a readable file"
                    ) from None
                try:
                    text = decoder.decode(block, final=not block)
                except UnicodeDecodeError:
                    raise WorkloadError(f"{path}: not UTF-8 text; a {what} is UTF-8") from None
                if block and text.endswith("\r"):  # a \r\n may straddle two blocks
                    text, carry = text[:-1], "\r"
                else:
                    carry = ""
                text = pending + text
                if "\r" in text:
                    text = text.replace("\r\n", "\n").replace("\r", "\n")
                lines = text.split("\n")
                pending = lines.pop() + carry
                for line in lines:
                    yield line + "\n"
                if not block:
                    break
    finally:
        binary.close()
    if pending:
        yield pending


class CsvTimes:
    """Seconds from a CSV's timestamp cells, one row at a time, as ``arrivals.csv_time_values``:
    all numbers of seconds, or all ISO datetimes counted from the first one; a file that mixes the
    two, or times with and without a zone, is an error naming the line."""

    def __init__(self, path: Path | str) -> None:
        self._path = path
        self._origin: datetime | None = None
        self._numbers = False

    def seconds(self, lineno: int, cell: str) -> float:
        origin = self._origin
        if origin is not None:  # the usual case first: a datetime after the first one
            try:
                return (datetime.fromisoformat(cell) - origin).total_seconds()
            except (ValueError, TypeError):
                pass  # the checks below name what is wrong
        path = self._path
        try:
            value = float(cell)
        except ValueError:
            value = None
        if value is not None and value - value == 0:  # finite
            if self._origin is not None:
                raise WorkloadError(f"{path} line {lineno}: timestamp: {cell!r} mixes numbers with datetimes")
            self._numbers = True
            return value
        try:
            dt = datetime.fromisoformat(cell)
        except ValueError:
            raise WorkloadError(
                f"{path} line {lineno}: timestamp: {cell[:40]!r} is not a time; use an ISO datetime "
                "(2023-11-16 18:15:46.68) or seconds"
            ) from None
        if self._origin is None:
            if self._numbers:
                raise WorkloadError(f"{path} line {lineno}: timestamp: {cell!r} mixes datetimes with numbers")
            self._origin = dt
        try:
            return (dt - self._origin).total_seconds()
        except TypeError:
            raise WorkloadError(
                f"{path} line {lineno}: timestamp: {cell!r} mixes times with and without a time zone"
            ) from None


def first_line(path: Path, what: str) -> str:
    """The first line of the file's text (read incrementally: a large file is not read whole)."""
    lines = iter_text_lines(path, what)
    try:
        return next(lines, "")
    finally:
        lines.close()


__all__ = ["READ_BLOCK_BYTES", "CsvTimes", "TraceRow", "first_line", "iter_text_lines"]
