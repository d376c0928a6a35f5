"""A routing A/B on real llama-server replicas with the simulator's prediction beside it.

Before the arms, fresh replicas started as the arms' are (same slots, KV size, threads) are
probed for their prefill and decode rates (targets/llamacpp/calibrate.py) and a sim profile is
fitted to them (targets/sim/calibration.py). Then the arms run on real replicas, then the same
arms, seed and workload on two sim replicas with that profile. The report puts follow-up-turn
TTFT (mean, p95) of every arm beside the prompt-cache counters of the replicas that served it,
and the real and predicted factors between the arms.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from analysis.metric_registry import TURN_CLASS_FOLLOW_UP
from analysis.records import REQUESTS_FILE
from analysis.units import format_duration_us
from loadgen.commands.ab import follow_up_ttft_factors, load_summary, run_ab, summary_stat
from loadgen.commands.run import RunOptions
from loadgen.commands.server_scrape import SERVER_METRICS_FILE
from loadgen.errors import UserError
from loadgen.runtime.locust_options import new_run_id

CALIBRATION_DIR = "calibration"
PROFILE_FILE = "profile.json"
FACTOR_STATS = ("mean", "p95")


@dataclass
class ArmCache:
    """What the engines' own counters say about one arm's prompt cache."""

    follow_ups: int  # follow-up requests that completed
    follow_up_cached: int  # prompt tokens of those served from the cache (cache_n / cached_tokens)
    follow_up_prompt: int  # all their prompt tokens
    replica_hits: dict[str, tuple[float, float]]  # replica -> (cached, computed) prompt tokens, /metrics

    @property
    def follow_up_share(self) -> float | None:
        return self.follow_up_cached / self.follow_up_prompt if self.follow_up_prompt else None


def arm_cache(run_dir: Path) -> ArmCache:
    """Cache counters of one arm: per-request (records) and per-replica (/metrics over the run)."""
    n = cached = prompt = 0
    path = run_dir / REQUESTS_FILE
    lines = path.read_bytes().splitlines() if path.exists() else []
    for line in lines:
        if not line.strip():
            continue
        rec = orjson.loads(line)
        if rec.get("turn_class") != TURN_CLASS_FOLLOW_UP or rec.get("status") != "ok" or rec.get("prompt_tokens") is None:
            continue
        n += 1
        cached += rec.get("cached_tokens") or 0
        prompt += rec["prompt_tokens"]
    hits: dict[str, tuple[float, float]] = {}
    metrics_path = run_dir / SERVER_METRICS_FILE
    entries = orjson.loads(metrics_path.read_bytes()) if metrics_path.exists() else {}
    for name, entry in entries.items():
        counters = entry.get("counters")
        if name == "router" or counters is None:
            continue
        got = {k.split("{", 1)[0]: v for k, v in counters.items()}
        if "llamacpp:prompt_tokens_total" in got:
            hits[name] = (got.get("llamacpp:prompt_tokens_cached_total", 0.0), got["llamacpp:prompt_tokens_total"])
        elif "sim:prefix_cache_queries_total" in got:
            queried, hit = got["sim:prefix_cache_queries_total"], got.get("sim:prefix_cache_hits_total", 0.0)
            hits[name] = (hit, queried - hit)
    return ArmCache(follow_ups=n, follow_up_cached=cached, follow_up_prompt=prompt, replica_hits=hits)


def prefill_rate(run_dirs: list[Path]) -> float | None:
    """Prompt tokens/s per request over these runs, from llama-server's own counters (tokens over
    the seconds its slots spent on them, so batched requests share a step); None without them."""
    sums = dict.fromkeys(("llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total"), 0.0)
    for run_dir in run_dirs:
        path = run_dir / SERVER_METRICS_FILE
        for name, entry in (orjson.loads(path.read_bytes()) if path.exists() else {}).items():
            for key, value in (entry.get("counters") or {}).items():
                if name != "router" and key.split("{", 1)[0] in sums:
                    sums[key.split("{", 1)[0]] += value
    tokens, seconds = sums.values()
    return tokens / seconds if seconds else None


def _ms(value: float | None) -> str:
    return format_duration_us(None if value is None else value * 1000.0)


def _replicas_text(hits: dict[str, tuple[float, float]]) -> str:
    parts = []
    for name, (cached, computed) in hits.items():
        total = cached + computed
        share = f"{cached / total:.0%}" if total else "-"
        parts.append(f"{name} {share} ({cached:.0f} cached / {computed:.0f} computed)")
    return ", ".join(parts) or "-"


def follow_up_table(rows: list[tuple[str, str, Path]]) -> str:
    """One line per (engine label, arm, results dir): follow-up TTFT and the prompt-cache counters."""
    header = ["engine", "arm", "follow-ups", "TTFT mean", "TTFT p95", "cached (records)", "replica prompt tokens cached (/metrics)"]
    table = [header]
    for engine, arm, run_dir in rows:
        s, c = load_summary(run_dir), arm_cache(run_dir)
        share = c.follow_up_share
        table.append(
            [
                engine, arm, str(c.follow_ups),
                _ms(summary_stat(s, TURN_CLASS_FOLLOW_UP, "ttft", "mean")), _ms(summary_stat(s, TURN_CLASS_FOLLOW_UP, "ttft", "p95")),
                "-" if share is None else f"{share:.0%}", _replicas_text(c.replica_hits),
            ]
        )  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i in (0, 1, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def ratio_lines(names: list[str], real: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> str:
    """``mean: real 4.1x, predicted 3.6x (predicted/real 0.88)``, per statistic."""
    got = follow_up_ttft_factors(real[0], real[1], FACTOR_STATS)
    want = follow_up_ttft_factors(predicted[0], predicted[1], FACTOR_STATS)
    out = [f"follow-up-turn TTFT, {names[0]} / {names[1]}:"]
    for stat in FACTOR_STATS:
        r, p = got[stat], want[stat]
        closeness = f" (predicted/real {p / r:.2f})" if r and p else ""
        out.append(
            f"  {stat}: real {'-' if r is None else f'{r:.1f}x'}, predicted {'-' if p is None else f'{p:.1f}x'}{closeness}"
        )
    return "\n".join(out)


def calibrate(opts: RunOptions, stem: str) -> tuple[Path, Any]:
    """Fit a sim profile to fresh replicas started like the arms'; returns (profile file, measurement)."""
    from targets.errors import TargetError
    from targets.llamacpp.calibrate import calibrate_fresh_replicas

    out = Path(opts.results) / f"{stem}-{CALIBRATION_DIR}" / PROFILE_FILE
    if not opts.quiet:
        print(f"\n== calibration: probing {opts.replicas} fresh llama-server replicas ==", file=sys.stderr, flush=True)
    try:
        return calibrate_fresh_replicas(
            out, f"fitted-{stem}", replicas=opts.replicas, parallel=opts.llama_parallel, ctx=opts.llama_ctx
        )
    except (TargetError, ValueError) as e:
        raise UserError(f"calibration of the sim against llama-server failed: {e}") from None


@dataclass
class PredictedAB:
    """Where a real-engine A/B and its sim prediction put their results."""

    code: int
    real: list[Path]
    predicted: list[Path]
    profile: Path
    measurement: Any


def run_ab_with_prediction(arms: list[tuple[str, str]], base: RunOptions) -> PredictedAB:
    """Calibrate, run the arms on llama-server, then on sims with the fitted profile."""
    if base.engine != "llama-server":
        raise UserError("the sim's prediction is for --engine llama-server runs")
    if len(arms) != 2:
        raise UserError("the sim's prediction compares exactly two arms; give two in --arms")
    stem = base.run_id or new_run_id(base.workload)
    base = replace(base, run_id=stem)
    profile, measurement = calibrate(base, stem)
    code, real = run_ab(arms, base)
    sim_base = replace(base, engine="sim", profile=str(profile), time_scale=1.0, run_id=f"{stem}-sim")
    sim_code, predicted = run_ab(arms, sim_base)
    return PredictedAB(max(code, sim_code), real, predicted, profile, measurement)


def report_prediction(names: list[str], ab: PredictedAB) -> str:
    m = ab.measurement
    rows = [("llama-server", n, d) for n, d in zip(names, ab.real, strict=True)]
    rows += [("sim (fitted)", n, d) for n, d in zip(names, ab.predicted, strict=True)]
    real = [load_summary(d) for d in ab.real]
    predicted = [load_summary(d) for d in ab.predicted]
    during = prefill_rate(ab.real)
    return "\n".join(
        [
            f"sim profile fitted to the replicas: prefill {m.prefill_tokens_per_s:.0f} tokens/s, decode "
            f"{m.decode_tokens_per_s:.0f} tokens/s, {m.request_overhead_s * 1000:.1f} ms per request ({ab.profile})",
            "prefill during the real arms, from the replicas' own counters (per request, batched with others): "
            + ("-" if during is None else f"{during:.0f} of its tokens/s"),
            "",
            follow_up_table(rows),
            "",
            ratio_lines(names, real, predicted),
            "predicted results: " + ", ".join(str(d) for d in ab.predicted),
        ]
    )
