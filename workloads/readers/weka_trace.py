"""WekaTrace agentic traces: Claude Code conversations whose sub-agents replay as fan-out branches.

The format of kv-cache-tester's ``trace_replay_tester`` (``docs/trace_replay_tester.md``) and of the
SemiAnalysis ``cc-traces-weka-with-subagents`` corpora, made by a capture proxy that cut every
prompt into 64-token blocks, hashed them and kept no text. One trace (one conversation) is one JSON
object: a line of a ``.jsonl`` file (the corpora's ``traces.jsonl``), or a whole ``.json`` file
(kv-cache-tester's ``traces/trace_0001.json``; a list of traces too)::

    {"id": "f64a8d4c-12d", "models": ["claude-opus-4-7"], "block_size": 64, "hash_id_scope": "local",
     "requests": [
       {"t": 0.0, "type": "s", "in": 418, "out": 20, "hash_ids": [0, 1, 2, 3, 4, 5, 6],
        "api_time": 2.3, "think_time": 0.0, "input_types": ["text"], "stop": "tool_use"},
       {"type": "subagent", "t": 3.1, "think_time": 0.4, "requests": [{"t": 3.1, "in": 300, ...}, ...]},
       {"t": 9.8, "in": 760, "out": 41, "hash_ids": [0, 1, ...], "input_types": ["tool_result"]}]}

How a trace becomes a session (docs/workloads.md, "WekaTrace agentic traces"):

* The main agent's requests are the session's chain. The first is built from its ``hash_ids``
  blocks (``in`` tokens); each later one sends the history (with the replies the server streams)
  plus a message of what the context grew by, ``in - (previous in + previous out)`` tokens (at
  least 1: a context that did not grow is counted as ``context_not_grown``).
* A ``type: subagent`` entry is one sub-agent. A run of them right after a main request are the
  concurrent branches of one fan-out of that request: each sub-agent's first request is a child
  that sends the parent's context plus the request's blocks, and each later one a follow-up of
  the branch that adds what the sub-agent's context grew by (as the main chain does), with its
  ``out`` as ``max_tokens``. The branch's last output (the answer the parent gets back) joins the
  parent's history as the result of a ``subagent`` tool call, and the next main request is the
  join, whose own message is what the context grew by beyond the parent's and the branches' last
  outputs. Every request of a sub-agent is sent.
* Think time is the request's ``think_time`` (client delay after the previous reply); without it,
  the gap from the previous request's end (``t`` + ``api_time``), or from its start.
* Block ids belong to their trace (every trace numbers its blocks from 0, and the corpora share
  nothing across conversations). With ``hash_id_scope: global`` the main agent and its
  sub-agents number their blocks alike (a sub-agent sharing the main agent's tool definitions has
  its ids); with ``local``, the corpora's, each sub-agent has an id space of its own.

The corpus has no times across conversations: arrivals come from ``--arrival`` (Poisson by default).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workloads.blocks import blocks_needed, split_blocks
from workloads.compressed import COMPRESSED_SUFFIXES, data_suffix
from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.model import STEP_FAN_OUT_CHILD, STEP_FIRST, STEP_FOLLOW_UP, STEP_JOIN, Session, Turn
from workloads.readers.base import (
    WorkloadReader,
    iter_json_array,
    iter_json_lines,
    open_text,
    option_duration,
    option_int,
    short,
    whole_number,
)
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import check_seed_index, session_rng

DEFAULT_BLOCK_SIZE = 64  # the capture proxy's block
SUBAGENT = "subagent"
SCOPES = ("local", "global")
REQUEST_FIELDS = "t, in, out"


class WekaTraceReader(WorkloadReader):
    name = "weka-trace"
    description = "WekaTrace agentic traces (Claude Code; requests with in, out, hash_ids, t; sub-agent groups)"
    suffixes = (".jsonl", ".json")
    options = {
        "block_size": f"prompt tokens per hash id for traces without block_size (default {DEFAULT_BLOCK_SIZE})",
        "tenant": "tenant name of every session (default 'default')",
        "max_think_time": "cut longer waits between requests to this (e.g. 60s; default: as in the trace)",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, dict) and isinstance(first.get("requests"), list) and "turns" not in first

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        where = str(path)
        self.check_options(options, where)
        default_block = option_int(options, "block_size", DEFAULT_BLOCK_SIZE, where=where, at_least=1)
        assert default_block is not None
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        max_think = option_duration(options, "max_think_time", math.inf, where=where)
        builder = _Builder(_stem(path), tenant, None if math.isinf(max_think) else max_think)
        block_size: tuple[int, int] | None = None  # (size, line of the first trace)
        for lineno, obj in _traces(path, open_text(path, "WekaTrace file")):
            at = f"{where} line {lineno}"
            if not isinstance(obj, dict):
                raise WorkloadError(f"{at}: {short(obj)} is not a JSON object; give {{id, block_size, requests}}")
            size = default_block
            if obj.get("block_size") is not None:
                size = whole_number(obj["block_size"], where=f"{at}: block_size", at_least=1)
            if block_size is None:
                block_size = (size, lineno)
            elif size != block_size[0]:
                raise WorkloadError(
                    f"{at}: block_size: {size} differs from line {block_size[1]}'s {block_size[0]}; "
                    "give traces of one block size per file"
                )
            builder.add(obj, at, lineno, size)
        if block_size is None:
            raise WorkloadError(f"{where}: holds no traces; give one JSON object per line")
        return AgentTraceWorkload(
            builder.records,
            kind=self.name,
            name=_stem(path),
            source=where,
            options=dict(options),
            block_size=block_size[0],
            stats=builder.stats(block_size[0]),
            tokenizer=tokenizer,
        )


class AgentTraceWorkload(DatasetWorkload):
    """A dataset workload whose turns carry step fields (ids, kinds, parents, tool calls)."""

    def session(self, seed: int, index: int) -> Session:
        check_seed_index(seed, index, self.num_sessions, where=self.source)
        rec = self.record(index)
        r_text = session_rng(seed, index, "text")
        turns = tuple(
            Turn(
                content=self._text(seed, t, r_text),
                max_tokens=t["max_tokens"],
                think_time_s=t.get("think_time", 0.0),
                role=t.get("role", "user"),
                step_id=t["id"],
                kind=t["kind"],
                parent_ids=tuple(t["parents"]),
                tool_call=t.get("tool_call"),
            )
            for t in rec["turns"]
        )
        return Session(rec["id"], rec["tenant"], "", turns, index=index, meta={"workload": self.name})


def _stem(path: Path) -> str:
    """The file's name less its compression and format extensions (``weka.jsonl.gz``: ``weka``)."""
    name = path.name
    for suffix in COMPRESSED_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return Path(name).stem


def _traces(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line, trace) for each trace: JSON lines, or a ``.json`` file holding one trace or a list."""
    if data_suffix(path) != ".json":
        yield from iter_json_lines(path, text)
        return
    if text.lstrip().startswith("["):
        yield from iter_json_array(path, text)
        return
    try:
        trace = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    yield text.count("\n", 0, len(text) - len(text.lstrip())) + 1, trace


def block_id(context: str, hash_id: int) -> int:
    """The block id of ``hash_id`` in a trace's id space ``context``: the same whatever file the
    trace is read from, and apart from every other trace's and context's (60 bits: no collision in
    practice)."""
    digest = hashlib.blake2b(f"{context}\0{hash_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 4


class _Builder:
    """Turns traces into session records (block ids in their trace's id spaces) and counts what it did."""

    def __init__(self, stem: str, tenant: str, max_think_s: float | None) -> None:
        self.stem = stem
        self.tenant = tenant
        self.max_think_s = max_think_s
        self.records: list[dict[str, Any]] = []
        self._blocks: set[int] = set()
        self._lines: dict[str, int] = {}
        self.counts = dict.fromkeys(
            ("main_requests", "subagents", "subagent_requests", "fan_outs",
             "sequential_subagents", "subagents_without_parent", "context_not_grown",
             "nested_subagents_left_out", "think_times_cut"),
            0,
        )  # fmt: skip

    def add(self, obj: dict[str, Any], at: str, lineno: int, block_size: int) -> None:
        trace_id = obj.get("id")
        if not isinstance(trace_id, str | int) or isinstance(trace_id, bool) or trace_id == "":
            raise WorkloadError(f"{at}: id: {short(trace_id)} is not allowed; give every trace a non-empty id")
        trace_id = str(trace_id)
        if trace_id in self._lines:
            raise WorkloadError(
                f"{at}: id: {short(obj['id'])} already used on line {self._lines[trace_id]}; give every trace a unique id"
            )
        self._lines[trace_id] = lineno
        scope = obj.get("hash_id_scope", "local")
        if scope not in SCOPES:
            raise WorkloadError(f"{at}: hash_id_scope: {short(scope)} is not allowed; use local or global")
        # global: the main agent and its sub-agents number their blocks alike; local: each
        # sub-agent has ids of its own (its 0 is not the main agent's 0).
        per_context = scope == "local"
        if "requests" not in obj:
            raise WorkloadError(f"{at}: requests: missing; a trace needs a list of requests")
        entries = obj["requests"]
        if not isinstance(entries, list) or not entries:
            raise WorkloadError(f"{at}: requests: {short(entries)} is not allowed; give a non-empty list of requests")
        turns = self._turns(entries, at, block_size, trace_id, per_context)
        if not turns:
            raise WorkloadError(f"{at}: requests: no main-agent request; a trace needs at least one")
        self.records.append({"id": f"{self.stem}-{trace_id}", "tenant": self.tenant, "turns": turns})

    def _turns(
        self, entries: list[Any], at: str, block_size: int, trace_id: str, per_context: bool
    ) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = []
        prev: dict[str, Any] | None = None  # the last main request
        children: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (branch's last turn, group) of the open fan-out
        first_think = first_start = 0.0
        for i, entry in enumerate(entries):
            where = f"{at}: requests[{i}]"
            if isinstance(entry, dict) and entry.get("type") == SUBAGENT:
                group = _group(entry, where, block_size)
                self.counts["subagent_requests"] += len(group["inner"])
                self.counts["nested_subagents_left_out"] += group["nested"]
                if prev is None:
                    self.counts["subagents_without_parent"] += 1
                    continue
                if children and group["start"] >= max(g["end"] for _, g in children):
                    self.counts["sequential_subagents"] += 1
                if not children:
                    # The first sub-agent's own think time when the trace gives it; the others start
                    # as much later than it as they do in the trace.
                    first_think = group["think_time"]
                    first_start = group["start"]
                    if first_think is None:
                        first_think = group["start"] - prev["end"]
                first = group["inner"][0]
                turn = {
                    "max_tokens": max(1, first["out"]),
                    "think_time": self._think(first_think + group["start"] - first_start),
                    "role": "user",
                    "id": f"r{i}",
                    "kind": STEP_FAN_OUT_CHILD,
                    "parents": [prev["id"]],
                    "tool_call": SUBAGENT,
                    **self._prompt(first, f"{trace_id}/requests[{i}]" if per_context else trace_id, block_size),
                }
                turns.append(turn)
                turn = self._branch(turns, turn, group["inner"])
                children.append((turn, group))
                self.counts["subagents"] += 1
                continue
            req = _request(entry, where, block_size, sent=prev is None)
            req["id"] = f"r{i}"
            self.counts["main_requests"] += 1
            turn = {"max_tokens": max(1, req["out"]), "id": req["id"], "role": req["role"]}
            if prev is None:
                turns.append({**turn, "kind": STEP_FIRST, "parents": [], **self._prompt(req, trace_id, block_size)})
                prev = req
                continue
            grown = req["in"] - (prev["in"] + prev["out"])
            if children:
                self.counts["fan_outs"] += 1
                grown -= sum(t["max_tokens"] for t, _ in children)
                since = max(g["end"] for _, g in children)
                turn.update(kind=STEP_JOIN, parents=[t["id"] for t, _ in children])
                children = []
            else:
                since = prev["end"]
                turn.update(kind=STEP_FOLLOW_UP, parents=[prev["id"]])
            self.counts["context_not_grown"] += grown < 1
            think = req["think_time"] if req["think_time"] is not None else req["t"] - since
            turns.append({**turn, "tokens": max(1, grown), "think_time": self._think(think)})
            prev = req
        if children:
            self.counts["fan_outs"] += 1
        return turns

    def _branch(self, turns: list[dict[str, Any]], head: dict[str, Any], inner: list[dict[str, Any]]) -> dict[str, Any]:
        """A sub-agent's later requests as follow-ups of its branch after ``head`` (each adds what
        the sub-agent's context grew by since its previous request and reply, after its think
        time), appended to ``turns``; the branch's last step."""
        last = head
        for k in range(1, len(inner)):
            req, before = inner[k], inner[k - 1]
            grown = req["in"] - (before["in"] + before["out"])
            self.counts["context_not_grown"] += grown < 1
            think = req["think_time"] if req["think_time"] is not None else req["t"] - before["end"]
            last = {
                "max_tokens": max(1, req["out"]),
                "think_time": self._think(think),
                "role": req["role"],
                "id": f"{head['id']}.{k}",
                "kind": STEP_FOLLOW_UP,
                "parents": [last["id"]],
                "tokens": max(1, grown),
            }
            turns.append(last)
        return last

    def _think(self, seconds: float) -> float:
        """A wait of at least 0 s and at most the ``max_think_time`` option (cut waits are counted)."""
        if self.max_think_s is not None and seconds > self.max_think_s:
            self.counts["think_times_cut"] += 1
            return self.max_think_s
        return max(0.0, seconds)

    def _prompt(self, req: dict[str, Any], context: str, block_size: int) -> dict[str, Any]:
        """A request's whole prompt: its blocks in id space ``context``, or (without hash_ids) ``in``
        synthetic tokens."""
        if req["hash_ids"] is None:
            return {"tokens": req["in"]}
        ids = [block_id(context, h) for h in req["hash_ids"]]
        self._blocks.update(ids)
        return {"blocks": split_blocks(ids, req["in"], block_size)}

    def stats(self, block_size: int) -> dict[str, Any]:
        return {"block_size": block_size, "unique_blocks": len(self._blocks), **self.counts}


def _seconds(entry: dict[str, Any], field: str, where: str, *, required: bool) -> float | None:
    value = entry.get(field)
    if value is None:
        if required:
            raise WorkloadError(f"{where}.{field}: missing; every request needs {REQUEST_FIELDS}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{where}.{field}: {short(value)} is not allowed; give a number of seconds >= 0")
    return float(value)


def _request(entry: Any, where: str, block_size: int, *, sent: bool) -> dict[str, Any]:
    """A validated model request (main agent's or a sub-agent's). Only a request whose blocks are
    ``sent`` has every hash id checked (a trace's later requests carry up to thousands each, and
    only their count matters)."""
    if not isinstance(entry, dict):
        raise WorkloadError(f"{where}: {short(entry)} is not a JSON object; give {{{REQUEST_FIELDS}, hash_ids}}")
    for field in ("in", "out"):
        if field not in entry:
            raise WorkloadError(f"{where}.{field}: missing; every request needs {REQUEST_FIELDS}")
    t = _seconds(entry, "t", where, required=True)
    assert t is not None
    n_in = whole_number(entry["in"], where=f"{where}.in", at_least=1)
    n_out = whole_number(entry["out"], where=f"{where}.out", at_least=0)
    api_time = _seconds(entry, "api_time", where, required=False)
    ids = None
    if entry.get("hash_ids") is not None:
        raw = entry["hash_ids"]
        if not isinstance(raw, list) or not raw:
            raise WorkloadError(f"{where}.hash_ids: {short(raw)} is not allowed; give a non-empty list of integers")
        want = blocks_needed(n_in, block_size)
        if len(raw) != want:
            raise WorkloadError(
                f"{where}.hash_ids: {len(raw)} blocks but in {n_in} needs {want} of {block_size} tokens; "
                "check the trace's block_size"
            )
        ids = [whole_number(h, where=f"{where}.hash_ids", at_least=0) for h in raw] if sent else raw
    types = entry.get("input_types")
    role = "tool" if isinstance(types, list) and types and all(x == "tool_result" for x in types) else "user"
    return {
        "t": t,
        "in": n_in,
        "out": n_out,
        "hash_ids": ids,
        "end": t + (api_time or 0.0),
        "think_time": _seconds(entry, "think_time", where, required=False),
        "role": role,
    }


def _group(entry: dict[str, Any], where: str, block_size: int) -> dict[str, Any]:
    """A validated sub-agent: its requests, and when it started and ended on the trace's clock."""
    inner_raw = entry.get("requests")
    if not isinstance(inner_raw, list) or not inner_raw:
        raise WorkloadError(
            f"{where}.requests: {short(inner_raw)} is not allowed; a sub-agent needs a non-empty list of requests"
        )
    # A sub-agent's own sub-agents are left out (counted): a branch has no fan-out of its own.
    nested = sum(isinstance(r, dict) and r.get("type") == SUBAGENT for r in inner_raw)
    own = [(j, r) for j, r in enumerate(inner_raw) if not (isinstance(r, dict) and r.get("type") == SUBAGENT)]
    inner = [
        _request(r, f"{where}.requests[{j}]", block_size, sent=k == 0)  # its first one's blocks are sent
        for k, (j, r) in enumerate(own)
    ]
    if not inner:
        raise WorkloadError(f"{where}.requests: holds only sub-agents; a sub-agent needs a request of its own")
    start = _seconds(entry, "t", where, required=False)
    start = inner[0]["t"] if start is None else start
    duration_ms = entry.get("duration_ms")
    if isinstance(duration_ms, int | float) and not isinstance(duration_ms, bool) and math.isfinite(duration_ms):
        end = start + max(0.0, float(duration_ms)) / 1000.0
    else:  # its requests' own span: their clock starts at the sub-agent's start in older traces
        end = start + max(r["end"] for r in inner) - inner[0]["t"]
    think = _seconds(entry, "think_time", where, required=False)
    return {"inner": inner, "start": start, "end": max(start, end), "think_time": think, "nested": nested}
