"""Reading a trace incrementally: its text line by line (gzip and zstd too), and its rows one by one.

A reader that can iterate its rows (``WorkloadReader.iter_rows``) yields ``TraceRow``s in file
order, each validated as it is read, with the same one-line errors as the whole-file ``read``. A
streamed replay (``workloads.streamed``) reads a trace that way each time it needs it, so no
process ever holds the whole file: memory stays that of one buffer of text.
"""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

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


def require_columns(
    where: str, header: list[str], columns: Iterable[str], want: str, shown: Mapping[str, str] | None = None
) -> None:
    """A CSV trace's header must name every column of ``columns``; the first one missing is named
    (as ``shown`` spells it, if given), with what the header holds and what to give (``want``)."""
    missing = [c for c in columns if c not in header]
    if missing:
        found = ", ".join(header)[:60] or "nothing"
        name = shown[missing[0]] if shown is not None else missing[0]
        raise WorkloadError(f"{where} line 1: no {name} column (found {found}); give a CSV with {want}")


def csv_header(blocks: Iterator[str]) -> tuple[list[str], str]:
    """A CSV file's header (names stripped and lower-cased), read from the first of its
    ``iter_text_blocks``, and the rest of that block."""
    import csv

    first = next(blocks, "")
    cut = first.find("\n") + 1 or len(first)
    return [h.strip().lower() for h in next(csv.reader([first[:cut]]), None) or []], first[cut:]


def iter_text_blocks(path: str | Path, what: str) -> Iterator[str]:
    """The file's text (UTF-8, a BOM allowed; ``\r\n`` and ``\r`` read as ``\n``), decompressed as
    it is read, in blocks of whole lines (the last may lack its ``\n``). One-line
    ``WorkloadError``s, as ``read_text``'s."""
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
                if not block:
                    if text:
                        yield text
                    break
                cut = text.rfind("\n") + 1
                pending = text[cut:] + carry
                if cut:
                    yield text[:cut]
    finally:
        binary.close()


def lines_of(blocks: Iterable[str]) -> Iterator[str]:
    """The lines of ``iter_text_blocks``' blocks, each with its ``\n`` (the file's last may lack it)."""
    for block in blocks:
        lines = block.split("\n")
        last = lines.pop()
        for line in lines:
            yield line + "\n"
        if last:
            yield last


def iter_text_lines(path: str | Path, what: str) -> Iterator[str]:
    """The file's lines, read incrementally (``iter_text_blocks``); each keeps its ``\n``."""
    return lines_of(iter_text_blocks(path, what))


# An element of a JSON array larger than this is taken for a malformed one (the error is named
# once this much text past its start has been read, not at the end of a large file).
MAX_ELEMENT_CHARS = 64 << 20


def iter_json_array_blocks(path: Path, blocks: Iterator[str]) -> Iterator[tuple[int, Any]]:
    """(line number, element) of a top-level JSON array read from text blocks, one element at a
    time, as ``base.iter_json_array`` gives them from a whole text (the same lines and errors).

    Only the text from the current element's line on is held.
    """
    decoder = json.JSONDecoder()
    buf = ""
    line0 = 1  # the line buf[0] is on; buf always starts at a line's start
    eof = False

    def more(at_least: int = 1) -> bool:
        """Read on, ``at_least`` characters if the text holds them; whether any were read."""
        nonlocal buf, eof
        had = len(buf)
        while len(buf) < had + at_least and not eof:
            block = next(blocks, None)
            if block is None:
                eof = True
            else:
                buf += block
        return len(buf) > had

    def skip_ws(pos: int) -> int:
        while True:
            n = len(buf)
            while pos < n and buf[pos] in " \t\r\n":
                pos += 1
            if pos < n or not more():
                return pos

    pos = skip_ws(0)
    if pos >= len(buf) or buf[pos] != "[":
        raise WorkloadError(f"{path} line {line0 + buf.count(chr(10), 0, pos)}: not a JSON array; give a list of conversations")
    pos = skip_ws(pos + 1)
    if pos < len(buf) and buf[pos] == "]":
        return
    while True:
        cut = buf.rfind("\n", 0, pos) + 1  # drop what is read, up to the element's line
        if cut:
            line0 += buf.count("\n", 0, cut)
            buf, pos = buf[cut:], pos - cut
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                # Cut short by the block's end, or malformed: read on (twice the text) and retry.
                if len(buf) - pos < MAX_ELEMENT_CHARS and more(max(len(buf), 1)):
                    continue
                raise WorkloadError(
                    f"{path} line {line0 + e.lineno - 1}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None
            if end < len(buf) or not more():  # a number at the very end may go on in the next block
                break
        yield line0 + buf.count("\n", 0, pos), obj
        pos = skip_ws(end)
        if pos < len(buf) and buf[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        at = line0 + buf.count("\n", 0, pos)
        raise WorkloadError(f"{path} line {at}: expected ',' or ']' after an element; the JSON array is cut or malformed")


_EPOCH = datetime(1970, 1, 1)  # numpy's datetime64 counts from it, without a zone
_MICROSECOND = timedelta(microseconds=1)


class CsvTimes:
    """Seconds from a CSV's timestamp cells, one row at a time, as ``arrivals.csv_time_values``:
    all numbers of seconds, or all ISO datetimes counted from the first one; a file that mixes the
    two, or times with and without a zone, is an error naming the line."""

    def __init__(self, path: Path | str) -> None:
        self._path = path
        self._origin: datetime | None = None
        self._numbers = False

    def block_seconds(self, first_lineno: int, cells: list[str]) -> list[float] | None:
        """The seconds of a block's cells (rows ``first_lineno`` on) in one step, or None when any
        is not in the form the trace's times take (the caller then takes them one by one with
        ``seconds``, which names the fault). The first row of the trace fixes the form."""
        if not cells:
            return []
        if self._origin is None and not self._numbers:
            self.seconds(first_lineno, cells[0].strip())
        if self._numbers:
            try:
                values = list(map(float, cells))
            except ValueError:
                return None
            total = sum(values)
            return values if total - total == 0 else None  # an inf or a nan (or a sum past 1e308)
        origin = self._origin
        if origin is None or origin.tzinfo is not None:
            return None
        # numpy parses ISO datetimes in C; only plain "YYYY-MM-DD hh:mm:ss[.f]" cells are given to
        # it (one date/time separator, two dashes, no zone), read as fromisoformat reads them.
        joined = "\n".join(cells)
        n = len(cells)
        if joined.count(" ") + joined.count("T") != n or joined.count("-") != 2 * n or "+" in joined or "Z" in joined:
            return None
        try:
            ns = np.array(cells, dtype="datetime64[ns]").astype(np.int64)
        except (ValueError, OverflowError):
            return None
        origin_us = (origin - _EPOCH) // _MICROSECOND
        return ((ns // 1000 - origin_us) / 1e6).tolist()  # microseconds, as fromisoformat keeps them

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


__all__ = [
    "READ_BLOCK_BYTES",
    "CsvTimes",
    "TraceRow",
    "first_line",
    "iter_json_array_blocks",
    "iter_text_blocks",
    "iter_text_lines",
    "lines_of",
]
