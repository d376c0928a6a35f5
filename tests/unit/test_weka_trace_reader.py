"""The WekaTrace reader: traces as sessions, sub-agents as fan-out branches, hash ids as shared
prefixes, detection among every format's fixtures, compressed and malformed files.

Expectations are computed from the fixture's own fields (docs/workloads.md, "WekaTrace agentic
traces", gives the rules), so the fixture can change without the tests going stale.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from loadgen.engine.conversation import Conversation
from workloads import load_workload, write_sessions_jsonl
from workloads.dag import plan_session
from workloads.errors import WorkloadError
from workloads.readers import detect_format

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
WEKA = FIX / "weka_traces.jsonl"
TRACES = [json.loads(line) for line in WEKA.read_text().splitlines()]
# cc-a: global scope, two overlapping sub-agents (of three requests and one); cc-b: global, two
# sub-agents one after the other
# sharing their tool definitions; cc-c: local scope, cc-b's shape and ids, ending with the fan-out.
A, B, C = TRACES


@functools.cache
def _weka():
    return load_workload(WEKA)


def _session(trace_id: str, seed: int = 0):
    index = [t["id"] for t in TRACES].index(trace_id)
    return _weka().session(seed, index)


def _words(text: str) -> list[str]:
    return text.split()


def test_detection_tells_every_formats_fixture_apart(tmp_path):
    sessions = tmp_path / "sessions.jsonl"
    sessions.write_text(json.dumps({"id": "s", "turns": [{"tokens": 5, "max_tokens": 2}]}) + "\n")
    single = tmp_path / "trace_0001.json"
    single.write_text(json.dumps(A, indent=2))  # kv-cache-tester's one trace per (pretty) file
    want = {
        WEKA: "weka-trace",
        single: "weka-trace",
        FIX / "mooncake.jsonl": "mooncake",
        FIX / "mooncake_aiperf.jsonl": "mooncake",
        FIX / "bailian.jsonl": "bailian",
        FIX / "sharegpt.json": "sharegpt",
        FIX / "openai_chat.jsonl": "sharegpt",
        FIX / "azure.csv": "azure",
        FIX / "burstgpt.csv": "burstgpt",
        sessions: "sessions",
    }
    assert {p: detect_format(p) for p in want} == want


def test_main_requests_are_a_chain_that_grows_by_what_the_context_grew():
    s = _session("cc-a")
    reqs = A["requests"]
    first, follow, *_, join, last = s.turns
    assert (first.step_id, first.kind, first.parent_ids) == ("r0", "first", ())
    assert len(_words(first.content)) == reqs[0]["in"] and first.max_tokens == reqs[0]["out"]
    # A follow-up: the trace's input less the previous prompt and reply.
    assert (follow.kind, follow.parent_ids) == ("follow-up", ("r0",))
    assert len(_words(follow.content)) == reqs[1]["in"] - (reqs[0]["in"] + reqs[0]["out"])
    assert (last.kind, last.parent_ids) == ("follow-up", (join.step_id,))
    assert len(_words(last.content)) == reqs[5]["in"] - (reqs[4]["in"] + reqs[4]["out"])
    assert follow.think_time_s == pytest.approx(reqs[1]["think_time"])
    assert last.role == "user" and follow.role == join.role == "tool"  # input_types text / tool_result


def test_sub_agents_are_fan_out_branches_of_the_request_before_them_and_the_next_request_joins():
    s = _session("cc-a")
    reqs = A["requests"]
    by_id = {t.step_id: t for t in s.turns}
    stages = [[[st.step_id for st in b] for b in stage.branches or [stage.steps]] for stage in plan_session(s).stages]
    # the overlapping sub-agents run together, each as a branch of all its requests
    assert stages == [[["r0"]], [["r1"]], [["r2", "r2.1", "r2.2"], ["r3"]], [["r4"]], [["r5"]]]
    sub1, sub2 = reqs[2], reqs[3]
    assert len(sub1["requests"]) == 3 and len(sub2["requests"]) == 1
    for sid, group in (("r2", sub1), ("r3", sub2)):
        child = by_id[sid]
        first = group["requests"][0]  # the sub-agent's first request: its blocks on the parent's context
        assert (child.kind, child.parent_ids, child.tool_call) == ("fan-out child", ("r1",), "subagent")
        assert len(_words(child.content)) == first["in"] and child.max_tokens == first["out"]
    # Each later request of a sub-agent extends its branch by what the sub-agent's context grew
    # by, after its own think time.
    inner = sub1["requests"]
    for k, sid in ((1, "r2.1"), (2, "r2.2")):
        step, parent = by_id[sid], ("r2", "r2.1")[k - 1]
        assert (step.kind, step.parent_ids, step.tool_call) == ("follow-up", (parent,), None)
        assert len(_words(step.content)) == inner[k]["in"] - (inner[k - 1]["in"] + inner[k - 1]["out"])
        assert step.max_tokens == inner[k]["out"] and step.think_time_s == pytest.approx(inner[k]["think_time"])
        assert step.role == "tool"  # input_types tool_result (sent as a user message)
    # The first child waits its own think time; the second starts as much later as in the trace.
    assert by_id["r2"].think_time_s == pytest.approx(sub1["think_time"])
    assert by_id["r3"].think_time_s == pytest.approx(sub1["think_time"] + sub2["t"] - sub1["t"])
    join = by_id["r4"]
    assert (join.kind, join.parent_ids) == ("join", ("r2.2", "r3"))
    # Each branch's last output joins the history as a tool result; the join's own message is the rest.
    outs = sub1["requests"][-1]["out"] + sub2["requests"][-1]["out"]
    assert len(_words(join.content)) == reqs[4]["in"] - (reqs[1]["in"] + reqs[1]["out"] + outs)
    assert join.think_time_s == pytest.approx(reqs[4]["think_time"])
    # Every request of the trace is a step of its session.
    for trace in TRACES:
        want = sum(len(e["requests"]) if e.get("type") == "subagent" else 1 for e in trace["requests"])
        assert len(_session(trace["id"]).turns) == want


def test_a_fan_out_may_end_the_session_and_sequential_sub_agents_are_counted():
    s = _session("cc-c")
    assert [t.kind for t in s.turns][-2:] == ["fan-out child", "fan-out child"]
    assert plan_session(s).stages[-1].fan_out
    stats = _weka().stats
    groups = [e for t in TRACES for e in t["requests"] if e.get("type") == "subagent"]
    assert stats["subagents"] == len(groups) and stats["fan_outs"] == 3
    assert stats["subagent_requests"] == sum(len(g["requests"]) for g in groups)
    assert stats["main_requests"] == sum(1 for t in TRACES for e in t["requests"] if e.get("type") != "subagent")
    assert stats["sequential_subagents"] == 2  # cc-b's and cc-c's second sub-agents start after the first ended
    assert stats["block_size"] == A["block_size"] == 64


def test_hash_ids_are_blocks_of_their_trace_shared_by_its_sub_agents_in_global_scope_only():
    a, b, c = (_session(t, seed=7) for t in ("cc-a", "cc-b", "cc-c"))
    bs = A["block_size"]
    words = {(s.session_id, t.step_id): _words(t.content) for s in (a, b, c) for t in s.turns}
    lead = 2
    # Global scope: cc-a's sub-agents open with the main agent's first blocks (the same ids).
    assert A["requests"][2]["requests"][-1]["hash_ids"][:lead] == A["requests"][0]["hash_ids"][:lead]
    main_a = words[(a.session_id, "r0")]
    assert words[(a.session_id, "r2")][: lead * bs] == words[(a.session_id, "r3")][: lead * bs] == main_a[: lead * bs]
    # ...and cc-b's two sub-agents share their tool definitions: their first three blocks.
    sub_b1, sub_b2 = words[(b.session_id, "r1")], words[(b.session_id, "r2")]
    assert sub_b1[: 3 * bs] == sub_b2[: 3 * bs] and sub_b1[3 * bs : 4 * bs] != sub_b2[3 * bs : 4 * bs]
    # Local scope: cc-c's sub-agents write cc-b's ids, but each one's ids are its own.
    assert [g["requests"][0]["hash_ids"] for g in C["requests"][2:]] == [g["requests"][0]["hash_ids"] for g in B["requests"][1:3]]
    assert words[(c.session_id, "r2")][:bs] != words[(c.session_id, "r3")][:bs]
    # Traces never share blocks: cc-b and cc-c open with cc-a's ids, not with its blocks.
    assert B["requests"][0]["hash_ids"][:4] == C["requests"][0]["hash_ids"][:4] == A["requests"][0]["hash_ids"][:4]
    assert len({tuple(words[(s.session_id, "r0")][:bs]) for s in (a, b, c)}) == 3
    # A prompt built from blocks has the trace's size; same seed, same texts; another seed, others.
    assert len(main_a) == A["requests"][0]["in"]
    assert _session("cc-a", seed=7).turns[0].content == a.turns[0].content != _session("cc-a", seed=8).turns[0].content
    assert _weka().stats["unique_blocks"] == len({b for i in range(3) for t in _weka().turn_hash_ids(i) if t for b in t["hash_ids"]})


def test_gzip_compressed_and_single_trace_json_files_read_as_the_plain_file(tmp_path):
    gz = tmp_path / "weka_traces.jsonl.gz"
    gz.write_bytes(gzip.compress(WEKA.read_bytes()))
    compact = tmp_path / "trace.json"
    compact.write_text(json.dumps(B))
    listed = tmp_path / "weka_traces.json"
    listed.write_text(json.dumps(TRACES, indent=1))
    plain = load_workload(WEKA)
    assert detect_format(gz) == "weka-trace" and detect_format(listed) == "weka-trace"
    for path in (gz, listed):
        wl = load_workload(path)
        assert [wl.session(3, k) for k in range(3)] == [plain.session(3, k) for k in range(3)]
    # A trace read alone sends the very blocks it sends in its corpus (synthetic texts, drawn from
    # the session's own stream, follow its index in the file).
    alone, there = load_workload(compact).session(3, 0), plain.session(3, 1)
    assert alone.session_id == "trace-cc-b" and there.session_id == "weka_traces-cc-b"
    assert load_workload(compact).turn_hash_ids(0) == plain.turn_hash_ids(1)
    for got, want, hashed in zip(alone.turns, there.turns, plain.turn_hash_ids(1), strict=True):
        assert (got.content == want.content) if hashed else len(got.content.split()) == len(want.content.split())
        assert (got.kind, got.parent_ids, got.max_tokens, got.think_time_s) == (
            want.kind, want.parent_ids, want.max_tokens, want.think_time_s,
        )  # fmt: skip


def test_a_counts_only_export_replays_the_same_dag_sessions(tmp_path):
    wl = load_workload(WEKA)
    out = write_sessions_jsonl(wl, 5, wl.num_sessions, tmp_path / "s.jsonl", include_text=False)
    back = load_workload(out)
    assert [back.session(5, k) for k in range(3)] == [wl.session(5, k) for k in range(3)]


def _bad(tmp_path: Path, mutate) -> Path:
    traces = json.loads(json.dumps(TRACES))
    mutate(traces)
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(json.dumps(t) + "\n" for t in traces))
    return p


def _set(path: list, value):
    def mutate(traces):
        obj = traces
        for key in path[:-1]:
            obj = obj[key]
        if value is KeyError:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set([1, "requests", 0, "out"], KeyError), "line 2: requests[0].out: missing; every request needs t, in, out"),
        (_set([0, "requests", 2, "requests", 1, "in"], "x"),
         'line 1: requests[2].requests[1].in: "x" is not allowed; use an integer >= 1'),
        (_set([0, "requests", 0, "hash_ids"], [1, 2]),
         "line 1: requests[0].hash_ids: 2 blocks but in 300 needs 5 of 64 tokens; check the trace's block_size"),
        (_set([0, "requests", 2, "requests", 0, "hash_ids", 2], -3),
         "line 1: requests[2].requests[0].hash_ids: -3 is not allowed; use an integer >= 0"),
        (_set([2, "requests", 1, "t"], -1), "line 3: requests[1].t: -1 is not allowed; give a number of seconds >= 0"),
        (_set([0, "requests", 3, "requests"], []),
         "line 1: requests[3].requests: [] is not allowed; a sub-agent needs a non-empty list of requests"),
        (_set([2, "id"], "cc-a"), 'line 3: id: "cc-a" already used on line 1; give every trace a unique id'),
        (_set([1, "hash_id_scope"], "session"), 'line 2: hash_id_scope: "session" is not allowed; use local or global'),
        (_set([1, "block_size"], 32), "line 2: block_size: 32 differs from line 1's 64; give traces of one block size per file"),
        (_set([0, "requests"], KeyError), "line 1: requests: missing; a trace needs a list of requests"),
    ],
)  # fmt: skip
def test_a_malformed_trace_is_one_line_naming_file_line_and_field(tmp_path, mutate, message):
    bad = _bad(tmp_path, mutate)
    with pytest.raises(WorkloadError) as e:
        load_workload(bad, fmt="weka-trace")
    assert str(e.value) == f"{bad} {message}"


def test_a_trace_of_sub_agents_alone_is_an_error_and_a_bad_file_exits_2_in_one_line(tmp_path):
    only = {"id": "x", "block_size": 64, "requests": [A["requests"][2]]}
    p = tmp_path / "only.jsonl"
    p.write_text(json.dumps(only) + "\n")
    with pytest.raises(WorkloadError, match=r"only.jsonl line 1: requests: no main-agent request"):
        load_workload(p)
    bad = _bad(tmp_path, _set([1, "requests", 0, "out"], KeyError))
    out = CliRunner().invoke(main, ["workload", "inspect", str(bad)])
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert lines[-1].endswith("bad.jsonl line 2: requests[0].out: missing; every request needs t, in, out")
    assert "Traceback" not in out.output


def test_max_think_time_cuts_longer_waits_and_counts_them():
    cap = 0.015
    wl = load_workload(WEKA, options=f"max_think_time={cap * 1000:g}ms")
    plain = [t.think_time_s for k in range(3) for t in _weka().session(0, k).turns]
    cut = [t.think_time_s for k in range(3) for t in wl.session(0, k).turns]
    assert cut == [min(x, cap) for x in plain] and max(plain) > cap
    assert wl.stats["think_times_cut"] == sum(x > cap for x in plain) and _weka().stats["think_times_cut"] == 0


def test_a_sub_agents_own_sub_agents_are_left_out_and_counted(tmp_path):
    trace = json.loads(json.dumps(A))
    group = trace["requests"][2]
    group["requests"].insert(1, json.loads(json.dumps(trace["requests"][3])))  # a sub-agent inside it
    p = tmp_path / "nested.jsonl"
    p.write_text(json.dumps(trace) + "\n")
    wl = load_workload(p)
    assert wl.stats["nested_subagents_left_out"] == 1 and _weka().stats["nested_subagents_left_out"] == 0
    assert wl.stats["subagent_requests"] == sum(len(g["requests"]) for g in A["requests"] if g.get("type") == "subagent")
    assert [t.kind for t in wl.session(0, 0).turns] == [t.kind for t in _session("cc-a").turns]
    group["requests"] = [group["requests"][1]]
    p.write_text(json.dumps(trace) + "\n")
    with pytest.raises(WorkloadError, match=r"nested.jsonl line 1: requests\[2\].requests: holds only sub-agents"):
        load_workload(p)


def test_a_sub_agent_without_duration_lasts_its_requests_span_on_either_clock(tmp_path):
    trace = json.loads(json.dumps(C))  # two sub-agents, the second started after the first ended
    first, second = trace["requests"][2], trace["requests"][3]
    for group in (first, second):
        del group["duration_ms"]
    p = tmp_path / "span.jsonl"
    p.write_text(json.dumps(trace) + "\n")
    assert load_workload(p).stats["sequential_subagents"] == 1
    # The same sub-agents with their requests' t from their own start (older traces): no change.
    for group in (first, second):
        for r in group["requests"]:
            r["t"] = round(r["t"] - group["t"], 6)
    p.write_text(json.dumps(trace) + "\n")
    wl = load_workload(p)
    assert wl.stats["sequential_subagents"] == 1
    assert [t.think_time_s for t in wl.session(0, 0).turns] == [t.think_time_s for t in _session("cc-c").turns]
    # Stretched so that the first sub-agent runs past the second's start: they overlap.
    first["requests"][0]["api_time"] = second["t"] - first["t"] + 0.01
    p.write_text(json.dumps(trace) + "\n")
    assert load_workload(p).stats["sequential_subagents"] == 0


def test_a_replay_sends_every_request_with_the_traces_prompt_tokens():
    """With replies as long as asked, each main request's prompt has the trace's ``in`` tokens, and
    each sub-agent request's has it on top of its parent's context (the branch's history kept)."""
    for k, trace in enumerate(TRACES):
        s = _weka().session(0, k)
        plan = plan_session(s)
        conv = Conversation(s, plan, lambda text: len(text.split()))
        def reply(index: int, turns=s.turns) -> str:
            return " ".join(["w"] * turns[index].max_tokens)

        got = []
        for stage in plan.stages:
            if not stage.fan_out:
                step = stage.steps[0]
                got.append(conv.prompt_tokens(step.index))
                conv.extend(step.index, reply(step.index))
                continue
            for branch in stage.branches:
                for j, step in enumerate(branch):
                    got.append(conv.prompt_tokens(step.index) - conv.history_tokens)
                    if j + 1 < len(branch):
                        conv.extend_branch(step.index, reply(step.index))
            conv.join([b[0].index for b in stage.branches], [reply(b[-1].index) for b in stage.branches])
        want = [r["in"] for e in trace["requests"] for r in (e["requests"] if e.get("type") == "subagent" else [e])]
        assert got == want, trace["id"]
