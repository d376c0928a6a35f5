"""Sessions as DAGs: the `steps` spec key, generation, the shape check, and session files."""

from __future__ import annotations

import json

import pytest

from workloads.dag import plan_session, plan_turns
from workloads.errors import WorkloadError
from workloads.model import Turn
from workloads.sessions_jsonl import load_sessions_jsonl, session_record, write_sessions_jsonl
from workloads.spec import parse_spec
from workloads.synthetic import SyntheticWorkload

BASE = {"name": "dag", "user_tokens": 10, "output_tokens": 4, "tool_output_tokens": 8, "think_time": "10ms"}
STEPS = [
    {"id": "plan", "kind": "request"},
    {"id": "read", "kind": "fan_out", "k": {"dist": "uniform", "low": 2, "high": 8}, "tool": "read_file"},
    {"id": "decide", "kind": "request", "think_time": "0ms"},
    {"id": "edit", "kind": "tool", "tool": "apply_patch", "repeat": {"dist": "uniform", "low": 1, "high": 3}},
]


def _workload(steps=STEPS, **extra) -> SyntheticWorkload:
    return SyntheticWorkload(parse_spec({**BASE, **extra, "steps": steps}, where="w.yaml"), source="w.yaml")


def _error(data, where="w.yaml") -> str:
    with pytest.raises(WorkloadError) as err:
        parse_spec(data, where=where)
    return str(err.value)


def test_a_generated_session_is_plan_fan_out_join_then_a_tool_loop():
    w = _workload()
    ks = set()
    for index in range(20):
        s = w.session(5, index)
        plan = plan_session(s)
        kinds = [st.kind for st in plan.steps]
        k = kinds.count("fan-out child")
        ks.add(k)
        assert 2 <= k <= 8
        assert kinds[: k + 2] == ["first", *["fan-out child"] * k, "join"]
        assert set(kinds[k + 2 :]) == {"follow-up"} and 1 <= len(kinds) - k - 2 <= 3
        assert [len(stage.steps) for stage in plan.stages] == [1, k, *[1] * (len(kinds) - k - 1)]
        join = plan.steps[k + 1]
        assert join.parent_ids == tuple(f"read.{i}" for i in range(k)) and join.depth == 2
        # The plan's reply calls read_file once per child; each edit answers the reply before it.
        assert plan.calls_by_parent["plan"] == tuple(range(1, k + 1))
        assert all(s.turns[i].role == "tool" and s.turns[i].tool_call == "apply_patch" for i in range(k + 2, len(kinds)))
        assert s.turns[k + 1].think_time_s == 0.0
    assert len(ks) > 3  # k is drawn per session
    # Same seed, same DAGs; another seed, other DAGs.
    assert [w.session(5, i) for i in range(5)] == [_workload().session(5, i) for i in range(5)]
    assert [w.session(5, i) for i in range(5)] != [w.session(6, i) for i in range(5)]


def test_specs_without_steps_keep_their_fingerprint_and_sessions():
    chain = {**BASE, "turns": 3}
    spec = parse_spec(chain, where="w.yaml")
    # Nothing new enters what the fingerprint hashes, so existing specs keep theirs.
    assert "steps" not in spec.tenants[0].knobs.to_dict() and "steps" not in spec.to_dict()
    session = SyntheticWorkload(spec, source="w.yaml").session(1, 0)
    assert all(t.step_id == "" and t.kind == "" and t.parent_ids is None for t in session.turns)
    assert "id" not in json.dumps(session_record(session)["turns"])
    assert parse_spec({**BASE, "steps": STEPS}).fingerprint() != spec.fingerprint()


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [{"id": "plan", "kind": "request", "after": "edit"}, {"id": "edit", "kind": "request"}],
            "w.yaml: steps: steps form a cycle (edit -> plan -> edit); a session's steps must be acyclic",
        ),
        (
            [{"id": "plan", "kind": "request", "after": "plan"}],
            "w.yaml: steps: steps form a cycle (plan -> plan); a session's steps must be acyclic",
        ),
        (
            [{"id": "plan", "kind": "request"}, {"id": "read", "kind": "fan_out", "k": 0}],
            "w.yaml: steps[1].k: 0 is below 1; use a value >= 1",
        ),
        (
            [{"id": "plan", "kind": "request"}, {"id": "read", "kind": "fan_out", "k": {"dist": "uniform", "low": 0, "high": 3}}],
            "w.yaml: steps[1].k: {'dist': 'uniform', 'low': 0, 'high': 3} allows values below 1; use values >= 1",
        ),
        (
            [{"id": "plan", "kind": "request"}, {"id": "read", "kind": "fanout", "k": 2}],
            "w.yaml: steps[1].kind: 'fanout' is not a step kind; use one of request, tool, fan_out",
        ),
        (
            [{"id": "plan", "kind": "request"}, {"id": "read", "kind": "fan_out"}],
            "w.yaml: steps[1].k: missing; a fan_out needs k, the number of children (>= 1)",
        ),
        (
            [{"id": "read", "kind": "fan_out", "k": 2}],
            "w.yaml: steps: the first step ('read') must be a request; a fan_out needs a reply before it",
        ),
        (
            [{"id": "a", "kind": "request"}, {"id": "b", "kind": "request", "after": "a"}, {"id": "c", "kind": "request", "after": "a"}],
            "w.yaml: steps: 'b' and 'c' both follow 'a'; steps form one chain (use a fan_out for concurrent work)",
        ),
    ],
)
def test_bad_step_specs_are_one_line_errors(steps, message):
    assert _error({**BASE, "steps": steps}) == message


def test_steps_and_turns_together_are_refused():
    assert _error({**BASE, "turns": 3, "steps": STEPS}) == (
        "w.yaml: turns: given with steps; a session is either turns in a chain or steps"
    )


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (
            [Turn("a", 1, step_id="a", parent_ids=("b",)), Turn("b", 1, step_id="b", parent_ids=("a",))],
            "s: steps form a cycle (b -> a -> b); a session's steps must be acyclic",
        ),
        (
            [Turn("a", 1), Turn("b", 1, kind="sidecar")],
            "s: turns[1] (t1).kind: 'sidecar' is not a step kind; use one of first, follow-up, fan-out child, join",
        ),
        (
            [Turn("a", 1), Turn("b", 1, kind="fan-out child"), Turn("c", 1)],
            "s: turns[2] (t2): a fan-out's children must be followed by a join (or end the session)",
        ),
        (
            [Turn("a", 1), Turn("b", 1, kind="fan-out child"), Turn("c", 1, kind="fan-out child"),
             Turn("d", 1, kind="join", parent_ids=("t1",))],
            "s: turns[3] (t3): a join must come right after a fan-out and wait for all of its children",
        ),
        (
            [Turn("a", 1), Turn("b", 1, parent_ids=("nope",))],
            "s: turns[1] (t1).parents: 'nope' is not a step of this session; name steps by their id",
        ),
    ],
)
def test_bad_dags_are_one_line_errors(turns, message):
    with pytest.raises(WorkloadError) as err:
        plan_turns(turns, where="s")
    assert str(err.value) == message


def test_session_files_keep_the_dag_and_old_files_replay_unchanged(tmp_path):
    w = _workload()
    path = write_sessions_jsonl(w, 3, 4, tmp_path / "dag.jsonl", include_text=False)
    replay = load_sessions_jsonl(path)
    assert [replay.session(3, i) for i in range(4)] == [w.session(3, i) for i in range(4)]
    first = json.loads(path.read_text().splitlines()[0])["turns"]
    assert first[1]["kind"] == "fan-out child" and first[1]["parents"] == ["plan"]
    assert first[1]["tool_call"] == "read_file"

    old = tmp_path / "old.jsonl"
    old.write_text('{"id": "a", "turns": [{"content": "hi", "max_tokens": 4}, {"content": "go", "max_tokens": 4}]}\n')
    session = load_sessions_jsonl(old).session(0, 0)
    assert [st.kind for st in plan_session(session).steps] == ["first", "follow-up"]
    assert session.turns[1] == Turn("go", 4)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "turns": [{"content": "x", "max_tokens": 4, "id": "p", "parents": ["q"]},'
        ' {"content": "y", "max_tokens": 4, "id": "q", "parents": ["p"]}]}\n'
    )
    with pytest.raises(WorkloadError) as err:
        load_sessions_jsonl(bad)
    assert str(err.value) == f"{bad} line 1: session a: steps form a cycle (q -> p -> q); a session's steps must be acyclic"


C = "fan-out child"
BRANCHES = [
    Turn("a", 1),
    Turn("b", 1, step_id="b", kind=C),
    Turn("b2", 1, step_id="b2", parent_ids=("b",)),
    Turn("c", 1, step_id="c", kind=C),
    Turn("c2", 1, step_id="c2", parent_ids=("c",)),
    Turn("c3", 1, step_id="c3", parent_ids=("c2",)),
    Turn("d", 1, step_id="d", kind=C),
    Turn("j", 1, step_id="j", kind="join"),
]


def test_fan_out_children_may_be_chains_and_the_join_waits_for_each_branchs_last_step():
    plan = plan_turns(BRANCHES, where="s")
    fan = plan.stages[1]
    assert fan.fan_out and len(plan.stages) == 3
    assert [[st.step_id for st in b] for b in fan.branches] == [["b", "b2"], ["c", "c2", "c3"], ["d"]]
    assert [st.step_id for st in fan.steps] == ["b", "b2", "c", "c2", "c3", "d"]
    by_id = {st.step_id: st for st in plan.steps}
    # A branch's later steps are follow-ups of the step before them in the branch, one deeper each.
    assert (by_id["c3"].kind, by_id["c3"].parent_ids, by_id["c3"].depth) == ("follow-up", ("c2",), 3)
    assert by_id["d"].parent_ids == ("t0",)  # a later child still defaults to the fan-out's parent
    assert (by_id["j"].parent_ids, by_id["j"].depth) == (("b2", "c3", "d"), 4)
    # A fan-out of single requests is a branch of one each, as before.
    single = plan_turns([Turn("a", 1), Turn("b", 1, kind=C), Turn("c", 1, kind=C), Turn("j", 1, kind="join")], where="s")
    assert [[st.step_id for st in b] for b in single.stages[1].branches] == [["t1"], ["t2"]]
    assert plan.stages[0].branches == plan.stages[2].branches == ()


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (
            [*BRANCHES[:6], Turn("x", 1, step_id="x", parent_ids=("c2",))],
            "s: turns[6] (x).parents: 'c2' is already extended by 'c3'; a branch is a chain: extend its last step ('c3')",
        ),
        (
            [*BRANCHES[:6], Turn("j", 1, step_id="j", kind="join", parent_ids=("b2", "c2"))],
            "s: turns[6] (j): a join must come right after a fan-out and wait for all of its children "
            "(the last step of each branch)",
        ),
        (  # a plain follow-up right after a branch is a missing join, not a step of the branch
            [*BRANCHES[:3], Turn("x", 1, step_id="x")],
            "s: turns[3] (x): a fan-out's children must be followed by a join (or end the session)",
        ),
        (  # no fan-out inside a branch
            [*BRANCHES[:3], Turn("x", 1, step_id="x", kind=C, parent_ids=("b2",))],
            "s: turns[3] (x): a fan-out's children must be followed by a join (or end the session)",
        ),
    ],
)
def test_bad_branches_are_one_line_errors(turns, message):
    with pytest.raises(WorkloadError) as err:
        plan_turns(turns, where="s")
    assert str(err.value) == message


def test_a_joins_context_parent_is_the_fan_outs_parent_also_when_its_parents_end_branches():
    """inspect/analyze count a join's prompt from the step the fan-out extended, not from inside
    a branch (its first parent, b2, is a branch's last step)."""
    from workloads.model import Session
    from workloads.shapes import context_parent, shape_of_session
    from workloads.text import BUILTIN

    shape = shape_of_session(Session("s", "default", "sys", tuple(BRANCHES)), BUILTIN)
    index = {t.content: i for i, t in enumerate(BRANCHES)}
    assert context_parent(shape, index["j"]) == index["a"]
    assert context_parent(shape, index["c3"]) == index["c2"]  # a branch step extends the one before it
    assert context_parent(shape, index["d"]) == index["a"]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 40])
def test_a_plain_chains_shared_plan_is_the_one_the_checks_build(n):
    from workloads.dag import _plan_checked

    turns = [Turn(content=f"m{i}", max_tokens=8, think_time_s=0.5 * i) for i in range(n)]
    shared = plan_turns(turns, where="session s")
    assert shared == _plan_checked(turns, where="session s")
    assert shared is plan_turns(turns, where="session other")  # built once per length
    assert [s.step_id for s in shared.steps] == [f"t{i}" for i in range(n)]
    assert [s.depth for s in shared.steps] == list(range(n))
    assert shared.calls_by_parent == {} and not shared.is_dag()


def test_a_chain_with_any_dag_field_given_is_checked_not_shared():
    named = [Turn(content="a", max_tokens=8, step_id="root"), Turn(content="b", max_tokens=8)]
    assert plan_turns(named, where="s").steps[0].step_id == "root"
    with pytest.raises(WorkloadError, match="tool_call"):
        plan_turns([Turn(content="a", max_tokens=8, tool_call="grep")], where="s")
