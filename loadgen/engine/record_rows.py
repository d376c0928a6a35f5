"""A worker's request records on the wire: one msgpack array per record, packed as it is recorded.

A worker reports to its master every 0.5 s, in one greenlet that holds the event loop while it
builds the report. At 500 requests a second the records were a report's largest part: 250 dicts
of ~40 named fields (~220 KB), packed by Locust's ``msgpack.packb`` in that one go: 1.5-2 ms of
the 3-5 ms of CPU in which a report held the loop. A stall near a stream's token interval reads
two of its chunks with one kernel stamp, and their gap is lost (docs/performance.md, "The
report's stall").

So each record is packed when its request is recorded (a few µs, spread over the requests), as a
row: its values in field order, the names sent once per report beside the rows. The report carries
one ``bytes`` (a memcpy for Locust's ``packb``), about half the size of the dicts. The master reads
the rows back into ``RequestRecord``s without a dict per record; rows whose names are not this
version's go through ``RequestRecord.from_dict`` (unknown names dropped, as from a file).
"""

from __future__ import annotations

import operator
from typing import Any

import msgpack

from analysis.records import RECORD_FIELDS, RequestRecord

__all__ = ["RowPacker", "unpack_rows"]


class _BadRow(Exception):
    pass


_END = object()


def _plain(obj: Any) -> Any:
    # numpy scalars (a record's values are plain Python everywhere today; this keeps a report
    # packable if one slips in) as their Python value.
    item = getattr(obj, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"a request record holds a {type(obj).__name__}, which cannot go on the wire")


class RowPacker:
    """Rows packed so far, handed over (and cleared) by ``take``."""

    def __init__(self) -> None:
        self._pack = msgpack.Packer(default=_plain).pack
        self._row = operator.attrgetter(*RECORD_FIELDS)
        self._rows: list[bytes] = []

    def add(self, rec: RequestRecord) -> None:
        self._rows.append(self._pack(self._row(rec)))

    def take(self) -> tuple[bytes, int]:
        """The rows packed since the last call, end to end, and how many."""
        rows, self._rows = self._rows, []
        return b"".join(rows), len(rows)


def unpack_rows(names: Any, packed: Any, count: Any) -> list[RequestRecord]:
    """The records of a report's ``packed`` rows, each of the fields ``names``; ValueError, with
    what is wrong, for anything that is not ``count`` such rows."""
    if not isinstance(packed, bytes | bytearray):
        raise ValueError(f"records: packed rows must be bytes, not {type(packed).__name__}")
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError("records: the rows' field names must be a list of strings")
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"records: the row count must be a whole number, not {count!r}")
    width = len(names)
    same = tuple(names) == RECORD_FIELDS
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(packed)
    out: list[RequestRecord] = []
    rows = iter(unpacker)
    while True:
        try:
            row = next(rows, _END)
            if row is _END:
                break
            if not isinstance(row, list) or len(row) != width:
                raise _BadRow(f"records: row {len(out)} is not a list of {width} values")
            out.append(RequestRecord(*row) if same else RequestRecord.from_dict(dict(zip(names, row, strict=True))))
        except _BadRow as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # msgpack's own errors, or values a record cannot take
            raise ValueError(f"records: row {len(out)} cannot be read ({type(e).__name__}: {e})") from None
    if len(out) != count:
        raise ValueError(f"records: {len(out)} rows read where the report says {count}")
    return out
