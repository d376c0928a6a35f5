"""A session's steps as a DAG: validate the shape and group the steps into stages.

The shapes a session may take are chains with fan-outs: a stage is one step, or the concurrent
children of a fan-out, all extending the single step of the stage before; a fan-out's stage is
followed by a ``join`` step whose parents are exactly its children, or ends the session. A child
may be a chain (a *branch*): a ``follow-up`` that names a child, or a later step of a branch, as
its parent extends that branch, and the join then waits for the last step of every branch. Steps
are listed in an order where parents come first.

Every error is a one-line :class:`WorkloadError` naming the session and the step.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from workloads.errors import WorkloadError
from workloads.model import (
    STEP_FAN_OUT_CHILD,
    STEP_FIRST,
    STEP_FOLLOW_UP,
    STEP_JOIN,
    STEP_KINDS,
    Session,
    Turn,
)


@dataclass(frozen=True, slots=True)
class Step:
    """One step with its defaults resolved: position, id, kind, parents and depth (root 0)."""

    index: int
    step_id: str
    kind: str
    parent_ids: tuple[str, ...]
    depth: int


@dataclass(frozen=True, slots=True)
class Stage:
    """Steps that start together: one step, or the children of one fan-out. ``steps`` lists all
    of a fan-out's steps; ``branches`` splits them by child, each child first, then the follow-ups
    of its branch in order (a single-request child is a branch of one)."""

    steps: tuple[Step, ...]
    branches: tuple[tuple[Step, ...], ...] = ()

    @property
    def fan_out(self) -> bool:
        return self.steps[0].kind == STEP_FAN_OUT_CHILD


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """The steps, the stages in order, and which steps answer a tool call each step's reply makes."""

    steps: tuple[Step, ...]
    stages: tuple[Stage, ...]
    calls_by_parent: dict[str, tuple[int, ...]]

    def is_dag(self) -> bool:
        """True when the session is more than a chain of plain turns."""
        return any(s.kind in (STEP_FAN_OUT_CHILD, STEP_JOIN) for s in self.steps)


def plan_session(session: Session) -> SessionPlan:
    """The validated plan of ``session`` (raises ``WorkloadError`` for a bad shape)."""
    return plan_turns(session.turns, where=f"session {session.session_id}")


def plan_turns(turns: Sequence[Turn], *, where: str) -> SessionPlan:
    """Resolve defaults, then check ids, references, acyclicity and the chain-with-fan-outs shape."""
    if not turns:
        raise WorkloadError(f"{where}: no turns; a session needs at least one step")
    if all(not t.step_id and not t.kind and t.parent_ids is None and t.tool_call is None for t in turns):
        # A plain chain, as every synthetic session is: its plan depends on its length alone, and
        # a worker starting hundreds of sessions a second need not build it each time.
        return _chain_plan(len(turns))
    return _plan_checked(turns, where=where)


@functools.lru_cache(maxsize=256)
def _chain_plan(n_turns: int) -> SessionPlan:
    """The plan of ``n_turns`` plain turns (no ids, kinds, parents or tool calls given): shared
    by every such session, so nothing may change it (``SessionPlan`` is frozen; its
    ``calls_by_parent`` is read only)."""
    return _plan_checked([Turn(content="", max_tokens=1) for _ in range(n_turns)], where="a plain chain")


def _plan_checked(turns: Sequence[Turn], *, where: str) -> SessionPlan:
    ids, kinds = _ids_and_kinds(turns, where=where)
    parents = _parents(turns, ids, kinds, where=where)
    _check_order(ids, parents, where=where)
    named = [t.parent_ids is not None for t in turns]
    stages = _stages(ids, kinds, parents, named, where=where)
    depth: dict[str, int] = {}
    steps = []
    for i, sid in enumerate(ids):
        depth[sid] = max((depth[p] + 1 for p in parents[i]), default=0)
        steps.append(Step(i, sid, kinds[i], parents[i], depth[sid]))
    calls: dict[str, list[int]] = {}
    for i, t in enumerate(turns):
        if t.tool_call is not None:
            if kinds[i] not in (STEP_FOLLOW_UP, STEP_FAN_OUT_CHILD):
                raise WorkloadError(
                    f"{where}: {_at(i, ids[i])}.tool_call: a {kinds[i]} step cannot answer a tool call; "
                    "use it on a follow-up or a fan-out child"
                )
            calls.setdefault(parents[i][0], []).append(i)
    staged = tuple(
        Stage(tuple(steps[i] for i in sorted(i for b in branches for i in b)),
              tuple(tuple(steps[i] for i in b) for b in branches) if kinds[branches[0][0]] == STEP_FAN_OUT_CHILD else ())
        for branches in stages
    )  # fmt: skip
    return SessionPlan(tuple(steps), staged, {k: tuple(v) for k, v in calls.items()})


def _at(i: int, sid: str) -> str:
    return f"turns[{i}] ({sid})"


def _ids_and_kinds(turns: Sequence[Turn], *, where: str) -> tuple[list[str], list[str]]:
    ids: list[str] = []
    kinds: list[str] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(turns):
        sid = t.step_id or f"t{i}"
        if sid in seen:
            raise WorkloadError(
                f"{where}: turns[{i}].id: {sid!r} is already used by turns[{seen[sid]}]; give every step a unique id"
            )
        seen[sid] = i
        kind = t.kind or (STEP_FIRST if i == 0 else STEP_FOLLOW_UP)
        if kind not in STEP_KINDS:
            raise WorkloadError(
                f"{where}: {_at(i, sid)}.kind: {kind!r} is not a step kind; use one of {', '.join(STEP_KINDS)}"
            )
        ids.append(sid)
        kinds.append(kind)
    return ids, kinds


def _parents(turns: Sequence[Turn], ids: list[str], kinds: list[str], *, where: str) -> list[tuple[str, ...]]:
    """Each step's parents: as given, else the default for its kind (see ``Turn``)."""
    out: list[tuple[str, ...]] = []
    known = set(ids)
    fan = _OpenFanOut()
    for i, t in enumerate(turns):
        if i:
            fan.add(ids[i - 1], kinds[i - 1], out[i - 1], turns[i - 1].parent_ids is not None)
        if t.parent_ids is not None:
            for p in t.parent_ids:
                if p not in known:
                    raise WorkloadError(
                        f"{where}: {_at(i, ids[i])}.parents: {p!r} is not a step of this session; "
                        "name steps by their id"
                    )
            out.append(tuple(t.parent_ids))
            continue
        kind = kinds[i]
        if kind == STEP_FAN_OUT_CHILD and ids[i - 1] in fan.branch_of:  # a sibling of the open fan-out
            out.append(fan.parent)
            continue
        if kind == STEP_JOIN and ids[i - 1] in fan.branch_of:  # the last step of every branch
            out.append(tuple(fan.tails))
            continue
        if kind == STEP_FIRST or i == 0:
            out.append(())
        elif kind == STEP_FOLLOW_UP:
            out.append((ids[i - 1],))
        elif kind == STEP_FAN_OUT_CHILD:
            j = i - 1
            while j > 0 and kinds[j] == STEP_FAN_OUT_CHILD:
                j -= 1
            out.append((ids[j],))
        else:  # join: the run of children right before it
            j = i
            while j > 0 and kinds[j - 1] == STEP_FAN_OUT_CHILD:
                j -= 1
            out.append(tuple(ids[j:i]))
    return out


class _OpenFanOut:
    """The branches of the fan-out open at a point of the list, for the default parents: a child
    opens a branch (of a new fan-out unless it shares the open one's parent), a follow-up that
    names a branch step extends that branch, and any other step closes the fan-out."""

    def __init__(self) -> None:
        self.parent: tuple[str, ...] = ()
        self.branch_of: dict[str, int] = {}  # step id -> its branch
        self.tails: list[str] = []  # the last step of each branch

    def add(self, sid: str, kind: str, ps: tuple[str, ...], named: bool) -> None:
        if kind == STEP_FAN_OUT_CHILD:
            if ps != self.parent or not self.tails:
                self.parent, self.branch_of, self.tails = ps, {}, []
            self.branch_of[sid] = len(self.tails)
            self.tails.append(sid)
        elif kind == STEP_FOLLOW_UP and named and len(ps) == 1 and ps[0] in self.branch_of:
            b = self.branch_of[sid] = self.branch_of[ps[0]]
            self.tails[b] = sid
        else:
            self.parent, self.branch_of, self.tails = (), {}, []


def _check_order(ids: list[str], parents: list[tuple[str, ...]], *, where: str) -> None:
    """Every parent listed before its child; a reference forward is a cycle or a misordering."""
    pos = {sid: i for i, sid in enumerate(ids)}
    for i, ps in enumerate(parents):
        for p in ps:
            if pos[p] < i:
                continue
            cycle = _find_cycle(ids, parents, pos)
            if cycle:
                raise WorkloadError(
                    f"{where}: steps form a cycle ({' -> '.join(cycle)}); a session's steps must be acyclic"
                )
            raise WorkloadError(
                f"{where}: {_at(i, ids[i])}.parents: {p!r} comes later in the list; list every step after its parents"
            )


def _find_cycle(ids: list[str], parents: list[tuple[str, ...]], pos: dict[str, int]) -> list[str] | None:
    state = [0] * len(ids)  # 0 new, 1 on the path, 2 done
    path: list[int] = []

    def visit(i: int) -> list[str] | None:
        state[i] = 1
        path.append(i)
        for p in parents[i]:
            j = pos[p]
            if state[j] == 1:
                loop = path[path.index(j) :]
                return [ids[k] for k in reversed(loop)] + [ids[loop[-1]]]
            if state[j] == 0:
                found = visit(j)
                if found:
                    return found
        path.pop()
        state[i] = 2
        return None

    for i in range(len(ids)):
        if state[i] == 0:
            found = visit(i)
            if found:
                return found
    return None


def _stages(
    ids: list[str], kinds: list[str], parents: list[tuple[str, ...]], named: list[bool], *, where: str
) -> list[list[list[int]]]:
    """Group steps into stages, each a list of branches (a plain step's stage is one branch of
    one step), and check the shape (see the module docstring). A follow-up belongs to a branch
    only when it names its parent: a plain one right after a fan-out is a missing join."""
    stages: list[list[list[int]]] = []
    i = 0
    n = len(ids)
    while i < n:
        kind, ps, at = kinds[i], parents[i], _at(i, ids[i])
        prev = stages[-1] if stages else None
        prev_group = prev is not None and kinds[prev[0][0]] == STEP_FAN_OUT_CHILD
        if i == 0:
            if kind != STEP_FIRST or ps:
                raise WorkloadError(f"{where}: {at}: the first step must be of kind first, with no parents")
            stages.append([[0]])
            i += 1
            continue
        if kind == STEP_FIRST:
            raise WorkloadError(f"{where}: {at}.kind: only the first step is of kind first; use follow-up")
        assert prev is not None
        if kind == STEP_JOIN:
            if not prev_group or set(ps) != {ids[b[-1]] for b in prev}:
                raise WorkloadError(
                    f"{where}: {at}: a join must come right after a fan-out and wait for all of its children"
                    + (" (the last step of each branch)" if prev_group and any(len(b) > 1 for b in prev) else "")
                )
            stages.append([[i]])
            i += 1
            continue
        if prev_group:
            raise WorkloadError(
                f"{where}: {at}: a fan-out's children must be followed by a join (or end the session)"
            )
        last = ids[prev[-1][-1]]
        if ps != (last,):
            raise WorkloadError(
                f"{where}: {at}.parents: {list(ps)} is not allowed; a {kind} step extends the step right "
                f"before it ({last!r})"
            )
        if kind == STEP_FOLLOW_UP:
            stages.append([[i]])
            i += 1
            continue
        branches = [[i]]
        branch_of = {ids[i]: 0}
        i += 1
        while i < n:
            if kinds[i] == STEP_FAN_OUT_CHILD and parents[i] == ps:
                branch_of[ids[i]] = len(branches)
                branches.append([i])
            elif kinds[i] == STEP_FOLLOW_UP and named[i] and len(parents[i]) == 1 and parents[i][0] in branch_of:
                p = parents[i][0]
                branch = branches[branch_of[p]]
                if ids[branch[-1]] != p:
                    taken = ids[branch[[ids[k] for k in branch].index(p) + 1]]
                    raise WorkloadError(
                        f"{where}: {_at(i, ids[i])}.parents: {p!r} is already extended by {taken!r}; "
                        f"a branch is a chain: extend its last step ({ids[branch[-1]]!r})"
                    )
                branch_of[ids[i]] = branch_of[p]
                branch.append(i)
            else:
                break
            i += 1
        stages.append(branches)
    return stages
