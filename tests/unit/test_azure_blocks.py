"""Azure traces parsed a block at a time give exactly what the row-by-row checks give.

The reference is ``_careful_rows`` over the whole text (csv, field by field); the files hold
several 64 KiB blocks, with the cells that make a block take the careful path placed among
plain ones.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from workloads.errors import WorkloadError
from workloads.readers.azure import AzureReader, _careful_rows, _Layout
from workloads.readers.stream import READ_BLOCK_BYTES, CsvTimes
from workloads.streamed import StreamedTraceWorkload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def iso_rows(n: int) -> list[str]:
    # 7 fractional digits as Azure writes them (the 7th is dropped, as fromisoformat drops it)
    return [f"2023-11-16 18:{15 + i // 3600 % 40:02d}:{i // 60 % 60:02d}.{i % 60:02d}{i % 7}0590{i % 10},{i % 500},{i % 31}\n" for i in range(n)]


def reference(path: Path) -> list:
    text = path.read_text()
    body = text.split("\n", 1)[1]
    lay = _Layout(str(path), path.stem, "default", 3, 0, 1, 2, CsvTimes(path))
    return list(_careful_rows(body, 2, lay))


def write(tmp_path: Path, lines: list[str], name: str = "az.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "".join(lines))
    assert path.stat().st_size > 3 * READ_BLOCK_BYTES
    return path


def test_plain_and_careful_blocks_give_the_reference_rows(tmp_path):
    lines = iso_rows(9000)
    lines[100] = '"{}","{}",{}'.format(*lines[100].split(","))  # quoted cells
    lines[2500] = lines[2500].rstrip("\n") + ",extra\n"  # a wider row than the header
    lines[4000] = "\n"  # a blank line
    lines[6000] = lines[6000].replace(",", ", ", 1)  # a space before a count
    path = write(tmp_path, lines)
    rows = list(AzureReader().iter_rows(path, {}))
    assert rows == reference(path)
    assert len(rows) == 8999 and rows[-1].lineno == 9001
    assert rows == list(StreamedTraceWorkload(AzureReader(), path, {}).rows())
    blocks = [len(times) for times, _, _ in AzureReader().iter_row_blocks(path, {})]
    assert sum(n > 1 for n in blocks) >= 2 and sum(n == 1 for n in blocks) >= 1000  # both paths taken


def test_seconds_and_datetimes_with_a_zone_give_the_reference_rows(tmp_path):
    secs = write(tmp_path, [f"{i * 0.37},{i % 90},{i % 7}\n" for i in range(25000)], "secs.csv")
    assert list(AzureReader().iter_rows(secs, {})) == reference(secs)
    zoned = write(tmp_path, [ln.replace(",", "+01:00,", 1) for ln in iso_rows(9000)], "zoned.csv")
    assert list(AzureReader().iter_rows(zoned, {})) == reference(zoned)


@pytest.mark.parametrize(
    ("at", "cell", "error"),
    [
        (2, "n/a", r"line 3000: ContextTokens: \"n/a\" is not allowed"),
        (2, "-4", r"line 3000: ContextTokens: -4 is not allowed"),
        (0, "soon", r"line 3000: timestamp: 'soon' is not a time"),
        (0, "1.5", r"line 3000: timestamp: '1.5' mixes numbers with datetimes"),
        (0, "2023-11-16 18:15:46+00:00", r"line 3000: timestamp: .* mixes times with and without a time zone"),
    ],
)
def test_a_bad_cell_deep_in_a_plain_block_names_its_line_after_the_rows_before_it(tmp_path, at, cell, error):
    lines = iso_rows(9000)
    cells = lines[2998].rstrip("\n").split(",")
    cells[0 if at == 0 else 1] = cell
    lines[2998] = ",".join(cells) + "\n"
    path = write(tmp_path, lines)
    rows = AzureReader().iter_rows(path, {})
    got = list(itertools.islice(rows, 2998))
    assert got[-1].lineno == 2999
    with pytest.raises(WorkloadError, match=error):
        next(rows)


def test_a_row_out_of_order_inside_a_plain_block_is_named_after_the_rows_before_it(tmp_path):
    lines = iso_rows(9000)
    lines[4000] = lines[10]  # line 4002 goes back in time
    path = write(tmp_path, lines)
    rows = StreamedTraceWorkload(AzureReader(), path, {}).rows()
    assert list(itertools.islice(rows, 4000))[-1].lineno == 4001
    with pytest.raises(WorkloadError, match=r"line 4002: timestamp is [\d.]+ s before line 4001's"):
        next(rows)
