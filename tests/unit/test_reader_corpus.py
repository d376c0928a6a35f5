"""The fuzzer's corpus (tests/fuzz/corpus/: seeds for each framing and line end, every error path
of the compiled reader, and each difference the fuzzer found) replayed through both body readers:
each reply in one read, cut in two at every byte, and one byte a read, with a small line cap and a
large one; tests/fuzz/reader_oracle.py says what must be equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.engine import http_reply
from tests.fuzz.fuzz_reader import check
from tests.fuzz.reader_oracle import cuts_of, difference

pytestmark = pytest.mark.skipif(
    http_reply._reader is None, reason="the compiled reader is not built (make setup builds it)"
)

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
FILES = sorted(CORPUS.glob("*.http"))
EVERY_CUT_MAX = 512  # bytes: files up to this size are cut at every boundary
MAX_LINES = (16, 1 << 16)


def test_the_corpus_is_there() -> None:
    assert len(FILES) >= 60, f"{CORPUS} lost its seeds; python tests/fuzz/make_corpus.py writes them"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_both_readers_agree_on_every_cut(path: Path) -> None:
    reply = path.read_bytes()
    check(reply)  # the schedules the fuzzer ran it with
    cuttings: list[list[int]] = [[], list(range(1, len(reply)))]
    if len(reply) <= EVERY_CUT_MAX:
        cuttings += [[cut] for cut in range(1, len(reply))]
    for max_line in MAX_LINES:
        for ends in cuttings:
            d = difference(cuts_of(reply, ends), max_line)
            assert d is None, f"{path.name}, cut at {ends}, max_line {max_line}: {d}"
