"""The quality gate: a small exact-match evaluation, greedy, through the run's own adapter.

``evaluate`` sends each item of an eval set (``loadgen.commands.evalset``) to the target one at a time,
with temperature 0 and the item's small ``max_tokens``, under a fixed system instruction
(``SYSTEM_PROMPT``), and judges each reply. A request that fails is a wrong answer with its error
kept: the gate asks whether the target answers correctly, and a target that does not answer does
not. ``loadgen quality`` prints the result; ``loadgen run --quality-gate MIN`` runs it before any
load and refuses to load a target that scores below ``MIN`` (``check_gate``).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.commands.evalset import EvalItem, default_eval_path, is_correct, load_eval_set
from loadgen.errors import UserError

if TYPE_CHECKING:
    from loadgen.commands.run import RunOptions

__all__ = [
    "SYSTEM_PROMPT",
    "QualityResult",
    "check_gate",
    "evaluate",
    "format_quality",
    "gate_before_load",
    "run_quality_command",
    "validate_gate",
]

SYSTEM_PROMPT = "Answer the question with only the answer: a word, a number or a short phrase. No explanation."
REQUEST_TIMEOUT_S = 60.0


@dataclass
class ItemResult:
    """One item's verdict: ``answer`` is the reply's text (None when the request failed)."""

    id: str
    prompt: str
    expected: str
    answer: str | None
    correct: bool
    error: str | None = None


@dataclass
class QualityResult:
    """A whole evaluation; ``as_dict()`` is what ``run.json`` keeps under the target's ``quality``."""

    eval: str  # "default" or the file given
    adapter: str
    model: str | None
    temperature: float | None
    items: list[ItemResult] = field(default_factory=list)
    min_score: float | None = None

    @property
    def correct(self) -> int:
        return sum(1 for i in self.items if i.correct)

    @property
    def total(self) -> int:
        return len(self.items)

    @property
    def score(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def passed(self) -> bool | None:
        return None if self.min_score is None else self.score >= self.min_score

    def failed_ids(self) -> list[str]:
        return [i.id for i in self.items if not i.correct]

    def as_dict(self) -> dict[str, Any]:
        return {
            "eval": self.eval,
            "adapter": self.adapter,
            "model": self.model,
            "temperature": self.temperature,
            "score": round(self.score, 4),
            "correct": self.correct,
            "total": self.total,
            "min_score": self.min_score,
            "passed": self.passed,
            "items": [{k: v for k, v in asdict(i).items() if v is not None or k == "answer"} for i in self.items],
        }


def _greedy_adapter(name: str) -> tuple[Any, float | None]:
    """The adapter ``name`` set to sample greedily, if it takes a temperature (built-ins do)."""
    from targets.errors import TargetError
    from targets.registry import get_adapter

    try:
        return get_adapter(name, temperature=0.0), 0.0
    except TargetError as e:
        if "does not take option" not in str(e):
            raise
    return get_adapter(name), None


def evaluate(
    url: str,
    items: list[EvalItem],
    *,
    adapter: str = "openai-chat",
    model: str | None = None,
    api_key: str | None = None,
    eval_name: str = "default",
    min_score: float | None = None,
    session_header: str = "X-Session-ID",
    ssl_context: Any = None,
) -> QualityResult:
    """Ask ``url`` every item, one at a time; never raises for a server failure (it is data)."""
    from targets.adapters.base import ChatRequest
    from targets.oneshot import send_one

    ad, temperature = _greedy_adapter(adapter)
    result = QualityResult(eval=eval_name, adapter=adapter, model=model, temperature=temperature, min_score=min_score)
    for item in items:
        req = ChatRequest(
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": item.prompt}],
            max_tokens=item.max_tokens,
            session_id=f"loadgen-quality-{item.id}",
            request_id=f"loadgen-quality-{uuid.uuid4().hex[:12]}",
            model=model,
            session_header=session_header,
            ignore_eos=False,  # stop where the model stops: the answer, not max_tokens of filler
        )
        shot = send_one(url, ad, req, api_key=api_key, timeout_s=REQUEST_TIMEOUT_S, ssl_context=ssl_context)
        answer = None if shot.error and not shot.text else shot.text.strip()
        ok = shot.error is None and answer is not None and is_correct(item, answer)
        result.items.append(ItemResult(item.id, item.prompt, item.answer, answer, ok, shot.error))
    return result


def eval_label(path: str | None) -> str:
    return "default" if path is None else str(path)


def _one_line(text: str | None, width: int) -> str:
    if text is None:
        return "(no answer)"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def format_quality(result: QualityResult, url: str) -> str:
    """Score and one line per item (verdict, id, question, expected, answer) for a terminal."""
    rows = [("verdict", "id", "question", "expected", "answer")]
    for i in result.items:
        verdict = "ok" if i.correct else ("ERROR" if i.error else "WRONG")
        answer = _one_line(i.answer, 50) + (f" [{i.error}]" if i.error else "")
        rows.append((verdict, i.id, _one_line(i.prompt, 50), i.expected, answer))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [
        f"quality {result.correct}/{result.total} correct, score {result.score:.3f}  |  eval {result.eval}  |  "
        f"{url} ({result.adapter}{', model ' + result.model if result.model else ''}, temperature "
        f"{'n/a' if result.temperature is None else f'{result.temperature:g}'})"
    ]
    lines += ["  ".join([*(r[c].ljust(widths[c]) for c in range(4)), r[4]]).rstrip() for r in rows]
    if result.min_score is not None:
        lines.append(f"gate: score {result.score:.3f} {'>=' if result.passed else '<'} {result.min_score:g}: "
                     f"{'pass' if result.passed else 'FAIL'}")  # fmt: skip
    return "\n".join(lines)


def gate_message(result: QualityResult, url: str) -> str:
    """The one-line refusal when ``result`` is below its ``min_score``."""
    failed = ", ".join(result.failed_ids()[:10]) + (", ..." if len(result.failed_ids()) > 10 else "")
    return (
        f"quality gate: target {url} scored {result.score:.3f} ({result.correct}/{result.total}) on eval "
        f"{result.eval}, below --quality-gate {result.min_score:g}; wrong: {failed}"
    )


def check_min_score(value: float | None, flag: str) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise UserError(f"{flag} {value:g}: a score from 0 to 1, e.g. 0.8")


def check_gate(
    url: str,
    *,
    min_score: float | None,
    eval_file: str | None,
    adapter: str,
    model: str | None,
    api_key_env: str | None,
    session_header: str | None = None,
    ssl_context: Any = None,
) -> QualityResult:
    """Evaluate ``url`` before load (``loadgen run``); the caller refuses the run unless ``passed``."""
    items = load_eval_set(eval_file)
    api_key = os.environ.get(api_key_env) if api_key_env else None
    return evaluate(
        url, items, adapter=adapter, model=model, api_key=api_key, eval_name=eval_label(eval_file),
        min_score=min_score, session_header=session_header or "X-Session-ID", ssl_context=ssl_context,
    )  # fmt: skip


def run_quality_command(
    target: str,
    *,
    model: str | None,
    eval_file: str | None,
    adapter: str,
    api_key_env: str | None,
    min_score: float | None,
    ca_cert: str | None = None,
    insecure: bool = False,
) -> int:
    """``loadgen quality``: preflight, evaluate, print; 2 when below ``--min-score``."""
    from loadgen.engine.preflight import preflight

    check_min_score(min_score, "--min-score")
    if not target.startswith(("http://", "https://")):
        raise UserError(f"--target {target!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    if api_key_env and api_key_env not in os.environ:
        raise UserError(f"--api-key-env {api_key_env}: that environment variable is not set")
    items = load_eval_set(eval_file)
    ad, _ = _greedy_adapter(adapter)
    api_key = os.environ.get(api_key_env) if api_key_env else None
    url = target.rstrip("/")
    tls = _tls(ca_cert, insecure) if url.startswith("https:") else None
    preflight(url, ad, model=model, api_key=api_key, timeout_s=10.0, ssl_context=tls)
    result = evaluate(
        url, items, adapter=adapter, model=model, api_key=api_key, eval_name=eval_label(eval_file),
        min_score=min_score, ssl_context=tls,
    )  # fmt: skip
    print(format_quality(result, url))
    if result.passed is False:
        print(f"Error: {gate_message(result, url).replace('--quality-gate', '--min-score')}", file=sys.stderr)
        return 2
    return 0


def _tls(ca_cert: str | None, insecure: bool) -> Any:
    """The https trust of ``--ca-cert``/``--insecure``, as the run's preflight and client use it."""
    from targets.tls import tls_context

    return tls_context(ca_cert, insecure)


def validate_gate(min_score: float | None, eval_file: str | None) -> None:
    """``--quality-gate`` and ``--quality-eval``, checked before anything starts."""
    check_min_score(min_score, "--quality-gate")
    load_eval_set(eval_file)


def gate_before_load(opts: RunOptions, url: str, info: dict[str, Any]) -> None:
    """Evaluate the run's target; keep the result in ``info`` (run.json's target) and refuse a
    run below ``--quality-gate``: its ``run.json`` says why, and the error names the wrong items."""
    tls = _tls(opts.ca_cert, opts.insecure) if url.startswith("https:") else None
    result = check_gate(
        url, min_score=opts.quality_gate, eval_file=opts.quality_eval, adapter=opts.adapter, model=opts.model,
        api_key_env=opts.api_key_env, session_header=opts.session_header, ssl_context=tls,
    )  # fmt: skip
    info["quality"] = result.as_dict()
    if result.passed is False:
        if not opts.quiet:
            print(format_quality(result, url), file=sys.stderr, flush=True)
        message = gate_message(result, url)
        write_refused_run(opts, url, info, message)
        raise UserError(message)
    if not opts.quiet:
        gate = f", gate {result.min_score:g}: pass" if result.min_score is not None else ""
        print(f"quality: {result.correct}/{result.total} correct (score {result.score:.3f}{gate})", file=sys.stderr)


def write_refused_run(opts: RunOptions, url: str, info: dict[str, Any], reason: str) -> Path:
    """``results/<run-id>/run.json`` for a run refused before load: status ``aborted``, no requests."""
    from analysis.records import RUN_FILE, SCHEMA_VERSION
    from loadgen.runtime.results_writer import versions, write_json_atomic
    from workloads import load_workload

    wl = load_workload(opts.workload)
    now = time.time()
    at = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    target = {
        "label": opts.target_label or url.split("://", 1)[-1],
        "url": url,
        "adapter": opts.adapter,
        "kind": opts.target_kind or info.get("kind") or "openai",
        **info,
    }
    run = {
        "schema_version": SCHEMA_VERSION,
        "run_id": opts.run_id,
        "status": "aborted",
        "abort_reason": reason,
        "started_at": at,
        "ended_at": at,
        "t0_unix_s": now,
        "seed": opts.seed,
        "mode": "closed-loop" if opts.concurrency else "open-loop",
        "arrival": {"kind": "closed-loop" if opts.concurrency else opts.arrival},
        "workload": {"name": wl.name, "source": opts.workload, "fingerprint": wl.fingerprint()},
        "targets": [target],
        "slos": [],
        "exit_code": 2,
        "versions": versions(),
    }
    run_dir = Path(opts.results) / str(opts.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / RUN_FILE, run)
    return run_dir


def sim_answers_file(eval_file: str | None) -> str:
    """The file an embedded sim learns its answers from: the eval set itself."""
    return str(Path(eval_file) if eval_file else default_eval_path())
