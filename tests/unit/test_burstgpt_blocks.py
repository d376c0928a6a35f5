"""BurstGPT traces parsed a block at a time give exactly what the row-by-row checks give: the
same rows kept, the same rows left out by reason, the same errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from workloads.errors import WorkloadError
from workloads.readers.burstgpt import COLUMNS, BurstGPTReader, _careful_rows, _choices, _Layout
from workloads.readers.stream import READ_BLOCK_BYTES

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
MODELS = ("ChatGPT", "GPT-4", " gpt-4 ")
LOGS = ("Conversation log", "API log")


def lines(n: int) -> list[str]:
    return [
        f"{i * 0.25},{MODELS[i % 3]},{i * 7 % 900},{(0, 3, 40, 250)[i % 4]},0,{LOGS[i // 3 % 2]}\n" for i in range(n)
    ]


def write(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "burst.csv"
    path.write_text(HEADER + "".join(rows))
    assert path.stat().st_size > 3 * READ_BLOCK_BYTES
    return path


def reference(path: Path, options: dict[str, str]) -> tuple[list, dict[str, int]]:
    dropped = {"model": 0, "log_type": 0, "zero_response_tokens": 0}
    cols = {"timestamp": 0, "model": 1, "request tokens": 2, "response tokens": 3, "log type": 5}
    assert set(cols) == set(COLUMNS)
    lay = _Layout(
        str(path), path.stem, "default", 6, cols, _choices(options.get("model")), _choices(options.get("log_type")), dropped
    )
    return list(_careful_rows(path.read_text().split("\n", 1)[1], 2, lay)), dropped


@pytest.mark.parametrize("options", [{}, {"model": "gpt-4"}, {"model": "chatgpt|gpt-4", "log_type": "api log"}])
def test_plain_and_careful_blocks_keep_and_leave_out_the_reference_rows(tmp_path, options):
    rows = lines(12000)
    rows[50] = '"{}",{},{},{},{},{}'.format(*rows[50].split(","))  # a quoted cell
    rows[3000] = "\n"  # a blank line
    rows[7000] = rows[7000].replace(",0,", ",0,x,", 1)  # a row wider than the header
    path = write(tmp_path, rows)
    dropped: dict[str, int] = {}
    got = list(BurstGPTReader().iter_rows(path, options, dropped=dropped))
    want, want_dropped = reference(path, options)
    assert got == want and dropped == want_dropped and got
    blocks = [len(t) for t, _, _ in BurstGPTReader().iter_row_blocks(path, options)]
    assert sum(n > 1 for n in blocks) >= 2 and sum(n == 1 for n in blocks) >= 100  # both paths taken


@pytest.mark.parametrize(
    ("field", "cell", "error"),
    [
        (2, "many", r"line 5000: Request tokens: \"many\" is not allowed"),
        (3, "-1", r"line 5000: Response tokens: -1 is not allowed"),
        (0, "inf", r"line 5000: Timestamp: \"inf\" is not allowed"),
    ],
)
def test_a_bad_cell_deep_in_a_plain_block_names_its_line_after_the_rows_before_it(tmp_path, field, cell, error):
    rows = lines(12000)
    cells = rows[4998].split(",")
    cells[field] = cell
    rows[4998] = ",".join(cells)
    path = write(tmp_path, rows)
    it = BurstGPTReader().iter_rows(path, {})
    kept_before = sum(1 for i in range(4998) if i % 4)  # lines 2..4999; a 0-token response is left out
    assert list(itertools.islice(it, kept_before))[-1].lineno == 4999
    with pytest.raises(WorkloadError, match=error):
        next(it)
