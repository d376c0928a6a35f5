"""Fuzz the compiled body reader (loadgen/engine/_reader.c) against the Python reference.

Each input is one raw HTTP/1.1 reply (status line, headers, body), as the files of
tests/fuzz/corpus/ are. It is read through ``StampedResponse`` on both paths
(tests/fuzz/reader_oracle.py) in several read schedules, chosen from the input's CRC so that a
finding replays exactly: in one read, one byte a read (small inputs), and two random cuttings. A
line cap also follows from the CRC (16 bytes, 64 bytes or 64 KiB), so oversize lines are reached.
Any difference (lines, the read each line came in, the end, its message) raises, and so does any
exception out of the C code; atheris saves the input as a crash file.

Run by ``make fuzz`` (FUZZ_SECONDS, default 300), which builds the reader under ASan and UBSan
(tests/fuzz/build_asan.py) and preloads gcc's libasan. gcc has no libFuzzer, so the C code is not
coverage-instrumented: atheris's mutations are guided by the coverage of the Python side (the
reference reader and the oracle), and the sanitizers check the C code on every input.

    LOADGEN_FUZZ_READER_SO=build/fuzz/_reader....so python tests/fuzz/fuzz_reader.py [libFuzzer flags] DIR...
    python tests/fuzz/fuzz_reader.py --replay FILE...   # one input, what differs, no atheris needed
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import random
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _load_sanitized_reader() -> None:
    """Put the sanitized build in the place of the installed module, before http_reply imports it."""
    path = os.environ.get("LOADGEN_FUZZ_READER_SO")
    if not path:
        return
    name = "loadgen.engine._reader"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        sys.exit(f"Error: LOADGEN_FUZZ_READER_SO={path} is not a loadable module; rebuild it with make fuzz")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module


MAX_LINES = (16, 64, 1 << 16)
BYTEWISE_MAX = 256  # inputs up to this size are also read one byte a read


def schedules(reply: bytes) -> tuple[int, list[list[int]]]:
    """The line cap and the read cuttings one input is checked with (a function of its bytes)."""
    rng = random.Random(zlib.crc32(reply))
    max_line = MAX_LINES[rng.randrange(len(MAX_LINES))]
    cuts: list[list[int]] = [[]]
    if len(reply) <= BYTEWISE_MAX:
        cuts.append(list(range(1, len(reply))))
    for _ in range(2):
        if len(reply) > 1:
            cuts.append(sorted(rng.sample(range(1, len(reply)), min(len(reply) - 1, rng.randint(1, 8)))))
    return max_line, cuts


def check(reply: bytes) -> None:
    """Raise AssertionError when the two readers differ on ``reply`` in any of its schedules."""
    from tests.fuzz.reader_oracle import cuts_of, difference

    max_line, cuttings = schedules(reply)
    for ends in cuttings:
        d = difference(cuts_of(reply, ends), max_line)
        if d is not None:
            raise AssertionError(f"{d}\n  reply {reply!r}\n  cut at {ends}, max_line {max_line}")


def _replay(files: list[str]) -> int:
    bad = 0
    for f in files:
        try:
            check(Path(f).read_bytes())
            print(f"{f}: same")
        except AssertionError as e:
            bad += 1
            print(f"{f}: {e}")
    return 1 if bad else 0


def main() -> int:
    _load_sanitized_reader()
    if sys.argv[1:2] == ["--replay"]:
        return _replay(sys.argv[2:])
    try:
        import atheris
    except ImportError:
        print("Error: atheris is not installed; pip install -e '.[fuzz]' (or run make fuzz)", file=sys.stderr)
        return 2
    with atheris.instrument_imports():
        from loadgen.engine import http_reply
        from tests.fuzz import reader_oracle  # noqa: F401  (instrumented: its branches guide too)
    if http_reply._reader is None:
        print("Error: the compiled reader is not built; run make setup (or set LOADGEN_FUZZ_READER_SO)", file=sys.stderr)
        return 2
    print(f"fuzzing {http_reply._reader.__file__}", file=sys.stderr)
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
