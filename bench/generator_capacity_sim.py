"""How much streaming one loadgen worker process handles against the simulated engine.

(bench/generator_capacity.py measures against an independent ground-truth server instead.)

For 10, 100 and 1,000 concurrent streams (closed loop, one turn of 256 tokens per session),
one `loadgen run` worker against a simulated engine:

* capacity: the sim at time-scale 0 (as fast as it can): streamed chunks per worker CPU-second
  and the worker's share of a core;
* fidelity: the sim paced (the H200 profile slowed so that all streams together produce about
  2,000 chunks/s, well under 40% of the worker's core), sessions arriving open loop at the rate
  that keeps that many streams in flight: ITL error p50/p99 against the sim's own write times.
  (Closed-loop agents that all start in the same instant make the worker spend the first
  ~0.3 ms per request sending; chunks that pile up meanwhile arrive coalesced, which measures
  the start burst rather than steady-state fidelity.)

Prints a table; not a test. Usage: python bench/generator_capacity_sim.py [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from targets.sim.process import SimProcess  # noqa: E402

SPEC = """\
name: bench-stream
description: one turn, short prompt, long reply - chunk-dominated traffic for the benchmark
system_prompt_tokens: 0
turns: 1
user_tokens: 32
output_tokens: 256
think_time: 0
"""


FIDELITY_TOKENS = 64


def run_point(tmp: Path, name: str, load: list[str], sim_args: list[str]) -> dict:
    truth_log = tmp / f"truth-{name}.jsonl"
    results = tmp / f"results-{name}"
    sim = SimProcess.start([*sim_args, "--truth-log", str(truth_log)])
    try:
        cmd = [
            sys.executable, "-m", "loadgen", "run", "--target", sim.url, "--workload", str(tmp / "bench.yaml"),
            *load, "--results", str(results), "--max-schedule-lag", "10s", "--request-timeout", "600s",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    finally:
        sim.stop()
    run_dir = next(results.iterdir())
    info = orjson.loads((run_dir / "run.json").read_bytes())
    workers = info["generator"]["workers"]
    cpu_s = sum(w["cpu_s"] for w in workers.values())
    share = max(w["cpu_share"] for w in workers.values())
    truth = {}
    for line in truth_log.read_bytes().splitlines():
        t = orjson.loads(line)
        truth[t["request_id"]] = t
    chunks = 0
    errs = []
    for line in (run_dir / "requests.jsonl").read_bytes().splitlines():
        rec = orjson.loads(line)
        chunks += rec["chunks"]
        t = truth.get(rec["request_id"])
        if t and rec["status"] == "ok":
            sim_gaps = np.diff(np.asarray(t["t_chunks_ns"], dtype=np.int64)) / 1000.0
            errs.append(np.abs(np.asarray(rec["itl_us"], dtype=float) - sim_gaps))
    err = np.concatenate(errs) / 1000.0 if errs else np.array([np.nan])
    return {
        "chunks": chunks,
        "chunks_per_cpu_s": chunks / cpu_s if cpu_s else float("nan"),
        "cpu_share": share,
        "itl_err_p50_ms": float(np.percentile(err, 50)),
        "itl_err_p99_ms": float(np.percentile(err, 99)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sessions per point")
    args = ap.parse_args()
    levels = [10, 100, 1000]
    with tempfile.TemporaryDirectory(prefix="loadgen-bench-") as d:
        tmp = Path(d)
        (tmp / "bench.yaml").write_text(SPEC)
        (tmp / "fid.yaml").write_text(SPEC.replace("output_tokens: 256", f"output_tokens: {FIDELITY_TOKENS}"))
        print("streams | capacity (sim time-scale 0): chunks/CPU-s, worker CPU share | "
              "fidelity (paced sim): worker CPU share, ITL error p50 / p99")  # fmt: skip
        for c in levels:
            sessions = c * (1 if args.quick else 2)
            cap = run_point(
                tmp, f"cap-{c}", ["--concurrency", str(c), "--num-sessions", str(sessions)],
                ["--profile", "h200-llama3-8b-fp8", "--time-scale", "0"],
            )  # fmt: skip
            # ~2.3 ms per decode step at time-scale 1; pace to c / step = 2,000 chunks/s in total.
            step_s = c / 2000.0
            scale = max(1.0, step_s / 0.0023)
            session_s = FIDELITY_TOKENS * step_s
            rate = c / session_s
            fid = run_point(
                tmp, f"fid-{c}", ["--rate", f"{rate:.3f}", "--num-sessions", str(sessions), "--workload", str(tmp / "fid.yaml")],
                ["--profile", "h200-llama3-8b-fp8", "--time-scale", f"{scale:g}"],
            )  # fmt: skip
            print(
                f"{c:7d} | {cap['chunks_per_cpu_s']:10,.0f} chunks/CPU-s, {cap['cpu_share']:5.0%} of a core | "
                f"{fid['cpu_share']:5.0%} of a core, ITL error {fid['itl_err_p50_ms']:.3f} / "
                f"{fid['itl_err_p99_ms']:.3f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
