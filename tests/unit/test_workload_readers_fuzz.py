"""Property tests of the file readers a user points loadgen at: session files and arrival traces.

Whatever a file holds (any bytes, JSON of any shape under the right keys, numbers that are not
finite), reading it gives a valid workload or schedule, or a one-line ``WorkloadError`` (the CLI
shows it and exits 2); never another exception, which would be a traceback. Examples are
derandomized and few, so the run is bounded and reproducible.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.arrivals import trace
from workloads.errors import WorkloadError
from workloads.sessions_jsonl import SESSION_KEYS, TURN_KEYS, load_sessions_jsonl

BOUNDED = settings(
    max_examples=60, derandomize=True, deadline=1000, suppress_health_check=[HealthCheck.too_slow]
)

scalars = (
    st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats(allow_nan=True) | st.text(max_size=6)
    | st.sampled_from(["1.5s", "200ms", "user", "tool", "first", "join", "fast"])
)  # fmt: skip
turns = st.dictionaries(
    st.sampled_from((*TURN_KEYS, "bogus")), scalars | st.lists(st.text(max_size=3), max_size=2), max_size=5
)
sessions = st.dictionaries(
    st.sampled_from((*SESSION_KEYS, "bogus")),
    scalars | st.lists(turns | scalars, max_size=3),
    max_size=5,
)

# Close to valid: the required keys present, each value sometimes wrong.
counts = st.integers(-1, 3000) | scalars
near_valid_turns = st.fixed_dictionaries(
    {"max_tokens": counts},
    optional={"content": st.text(max_size=20) | scalars, "tokens": counts, "think_time": counts,
              "role": st.sampled_from(["user", "tool", "system"]), "cold": st.booleans() | scalars},
)  # fmt: skip
near_valid_sessions = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=6), "turns": st.lists(near_valid_turns, min_size=1, max_size=3)},
    optional={"tenant": st.text(max_size=4) | scalars, "system_prompt_tokens": counts,
              "arrival_s": st.floats(allow_nan=True, allow_infinity=True)},
)  # fmt: skip


def _file(data: bytes, suffix: str) -> Path:
    f = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)  # noqa: SIM115
    with f:
        f.write(data)
    return Path(f.name)


def _message_is_one_line(e: WorkloadError) -> None:
    assert str(e) and "\n" not in str(e) and "Traceback" not in str(e)


@BOUNDED
@given(st.lists(sessions | near_valid_sessions, min_size=1, max_size=3))
def test_session_files_of_any_shape_load_or_say_why(records):
    path = _file(b"\n".join(json.dumps(r).encode() for r in records), ".jsonl")
    try:
        wl = load_sessions_jsonl(path)
    except WorkloadError as e:
        _message_is_one_line(e)
        return
    finally:
        path.unlink()
    for k in range(wl.num_sessions):
        s = wl.session(0, k)
        assert s.turns and all(t.max_tokens >= 1 and t.think_time_s >= 0 for t in s.turns)


@BOUNDED
@given(st.binary(max_size=200))
def test_session_files_of_any_bytes_load_or_say_why(data):
    path = _file(data, ".jsonl")
    try:
        load_sessions_jsonl(path)
    except WorkloadError as e:
        _message_is_one_line(e)
    finally:
        path.unlink()


number_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["", "# comment", "  ", "1e400", "-0", "nan", "abc", "1,2", "2023-11-16 18:15:46.6805900"]),
)


@BOUNDED
@given(
    st.lists(number_text, max_size=8),
    st.sampled_from([".txt", ".csv", ".jsonl"]),
    st.sampled_from(["\n", "\r\n"]),
)
def test_trace_files_of_any_content_read_or_say_why(cells, suffix, eol):
    if suffix == ".csv":
        text = eol.join(["timestamp", *cells])
    elif suffix == ".jsonl":
        text = eol.join(json.dumps({"timestamp": c}) if i % 2 else f'{{"timestamp": {c or 0}}}' for i, c in enumerate(cells))
    else:
        text = eol.join(cells)
    path = _file(text.encode(), suffix)
    try:
        times = trace(path)
    except WorkloadError as e:
        _message_is_one_line(e)
        return
    finally:
        path.unlink()
    assert len(times) >= 1 and times[0] == 0.0
    assert all(math.isfinite(t) for t in times) and bool(np.all(np.diff(times) >= 0))


@BOUNDED
@given(st.binary(max_size=120), st.sampled_from([".txt", ".csv", ".jsonl"]))
def test_trace_files_of_any_bytes_read_or_say_why(data, suffix):
    path = _file(data, suffix)
    try:
        trace(path)
    except WorkloadError as e:
        _message_is_one_line(e)
    finally:
        path.unlink()
