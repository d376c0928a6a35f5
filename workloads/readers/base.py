"""The interface every dataset/trace reader implements, and the helpers they share.

A reader turns one file format into a :class:`~workloads.workload.Workload`. It names its options
(``--workload-options key=value,...``) and can say from a file's first record whether the file is
likely in its format (``sniff``), so ``--workload FILE`` works without naming the format.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from analysis.units import parse_duration_s
from workloads.compressed import read_text
from workloads.errors import WorkloadError
from workloads.readers.stream import TraceRow
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload


class WorkloadReader(ABC):
    """One file format. Subclasses set ``name``, ``description``, ``suffixes`` and ``options``."""

    name: ClassVar[str]
    description: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    # option name -> one-line help; values arrive as text and each reader parses its own
    options: ClassVar[dict[str, str]] = {}

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        """Whether a file whose first record (a dict, or a CSV header list) is ``first`` is this format."""
        return False

    @abstractmethod
    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> Workload:
        """Read and validate ``path``; every error is a one-line ``WorkloadError`` naming file, line, field."""

    def iter_rows(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[TraceRow]:
        """The file's sessions one at a time, in file order, each validated as it is read
        (``workloads.readers.stream.TraceRow``; the same errors as ``read``). ``tokenizer``
        counts tokens where the format needs it (a recorded answer's length).

        Formats whose sessions are their rows and whose files are in time order implement it
        (``streams_rows``): a large such file is then replayed as it is read
        (``workloads.streamed``), never held whole.
        """
        raise NotImplementedError(f"the {self.name} reader reads whole files only")

    @property
    def streams_rows(self) -> bool:
        """Whether ``iter_rows`` is implemented."""
        return type(self).iter_rows is not WorkloadReader.iter_rows

    def check_options(self, options: Mapping[str, str], where: str) -> None:
        for key in options:
            if key not in self.options:
                accepted = ", ".join(self.options) or "none"
                raise WorkloadError(
                    f"{where}: workload option {key!r} is not known to the {self.name} reader; "
                    f"it takes: {accepted}"
                )


def parse_workload_options(text: str | Mapping[str, Any] | None) -> dict[str, str]:
    """``"a=1,b=2"`` (or a mapping) as ``{"a": "1", "b": "2"}``; a one-line error otherwise."""
    if text is None or text == "":
        return {}
    if isinstance(text, Mapping):
        return {str(k): str(v) for k, v in text.items()}
    out: dict[str, str] = {}
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise WorkloadError(
                f"--workload-options: {item!r} is not key=value; use e.g. min_turns=2,max_prompt_tokens=4096"
            )
        out[key.strip()] = value.strip()
    return out


def option_int(options: Mapping[str, str], key: str, default: int | None, *, where: str, at_least: int = 0) -> int | None:
    if key not in options:
        return default
    text = options[key]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < at_least:
        raise WorkloadError(f"{where}: workload option {key}={text!r} is not allowed; use an integer >= {at_least}")
    return value


def option_duration(options: Mapping[str, str], key: str, default: float, *, where: str) -> float:
    if key not in options:
        return default
    try:
        return parse_duration_s(options[key])
    except ValueError:
        raise WorkloadError(
            f"{where}: workload option {key}={options[key]!r} is not a duration; use seconds or e.g. 500ms"
        ) from None


def open_text(path: Path, what: str) -> str:
    """The file's text (UTF-8, BOM allowed; gzip or zstd decompressed, told by content); a one-line
    error for a missing, broken or non-UTF-8 file."""
    return read_text(path, what)


def iter_json_lines(path: Path | str, text: str | Iterable[str]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line of a JSON-lines text (a whole text,
    or its lines as a stream gives them); a line that is not JSON is a one-line error naming it."""
    lines = text.splitlines() if isinstance(text, str) else text
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(
                f"{path} line {lineno}: not valid JSON ({e.msg} at column {e.colno}); give one JSON object per line"
            ) from None


def iter_json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line number, element) for each element of a top-level JSON array, parsed one at a time.

    Parsing element by element (not ``json.loads`` of the whole file) gives each element's line, so
    an error in conversation 40,000 of a large file names its line.
    """
    decoder = json.JSONDecoder()
    n = len(text)
    pos = _skip_ws(text, 0)
    if pos >= n or text[pos] != "[":
        raise WorkloadError(f"{path} line {text.count(chr(10), 0, pos) + 1}: not a JSON array; give a list of conversations")
    pos = _skip_ws(text, pos + 1)
    line, line_pos = 1, 0
    if pos < n and text[pos] == "]":
        return
    while True:
        line += text.count("\n", line_pos, pos)
        line_pos = pos
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        yield line, obj
        pos = _skip_ws(text, end)
        if pos < n and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
            continue
        if pos < n and text[pos] == "]":
            return
        at = text.count("\n", 0, pos) + 1
        raise WorkloadError(f"{path} line {at}: expected ',' or ']' after an element; the JSON array is cut or malformed")


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def short(value: Any) -> str:
    """A value as it appears in the file, cut to keep a message on one line."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole_number(value: Any, *, where: str, at_least: int = 0) -> int:
    """An integer field (a float with no fraction counts, as some traces write 512.0)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
        raise WorkloadError(f"{where}: {short(value)} is not allowed; use an integer >= {at_least}")
    return value
