"""What the capture proxy adds: TTFT, token delivery and ITL through ``loadgen capture`` vs direct.

One simulated engine (H200 profile; its 1,024 slots mean no stream waits for one) and a capture
proxy in front of it, recording to a temporary session file. For 1 and 100 concurrent streams (a
keep-alive connection each, the next request as soon as a reply ends) it measures each path with
``router_overhead.measure``:

* TTFT added: the client's TTFT minus the sim's own (handler start to first-token write);
* token delivery: when each token reached the client (its kernel's receive stamp) minus when the
  sim wrote it, so "through the proxy minus direct" is the proxy's added latency per chunk;
* ITL: the client's gaps between tokens, next to the sim's own;
* the proxy's CPU per forwarded chunk, from /proc/<pid>/stat over the window.

A positive time scale (default 2) gives every token a fixed wall-clock write time, which the sim
logs on the client's monotonic clock. Token times are the client's kernel receive stamps
(``SO_TIMESTAMPNS``, as loadgen's own client reads), so the direct path, the control, shows
0.01-0.04 ms at p99 and the difference between the paths is what the proxy adds, not the measuring
client's own queueing (``--read-stamps`` stamps reads instead: the direct path then shows p99 3-7
ms at 100 streams on two shared cores). ``--pin`` runs the proxy on a core of its own and the sim
and the client on the others. Target: added p99 < 1 ms per chunk at 100 streams.

``--realtime`` runs the relay at SCHED_FIFO on its core, so other work on a shared machine cannot
keep it waiting; ``--assembler-apart`` puts the capture's assembler process beside the sim and the
client instead of beside the relay. The assembler's CPU is printed apart from the relay's.

``--relay`` picks the relay that moves reply bodies: the compiled pump (the default where it is
built), the Python one (``LOADGEN_RELAY=python``), or ``both``: one capture of each, measured in
turn in the same run, which is how to compare them on a shared machine.

Measured on the 2-core development machine, 100 streams of 64 tokens, ``--pin --relay both``, six
runs at load average 0.4-0.9 (docs/performance.md, "The capture proxy"): added per chunk p50 0.01
ms with the compiled pump against 0.06-0.15 ms with the Python relay, p99 0.20-0.53 ms against
0.31-0.60 ms. Relay CPU per chunk 13.0-14.8 us against 14.8-18.8 us, most of it the kernel's
loopback send and the per-request work. Figures vary from run to run with the machine's load:
compare paths within one run, and CPU per chunk across runs.

    .venv/bin/python bench/capture_overhead.py                  # 1 and 100 streams; 4 s each
    .venv/bin/python bench/capture_overhead.py -c 100 -d 8 --redact
    .venv/bin/python bench/capture_overhead.py -c 100 --pin       # the proxy on a core of its own
    .venv/bin/python bench/capture_overhead.py -c 100 --pin --realtime --assembler-apart
    .venv/bin/python bench/capture_overhead.py -c 100 --pin --relay both   # compiled vs Python relay

Prints figures; it is not a test. Everything binds 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from router_overhead import measure  # noqa: E402

from loadgen.capture.process import CaptureProcess  # noqa: E402
from targets.sim.process import SimProcess  # noqa: E402


def _fmt(pair: tuple[float, float]) -> str:
    return f"{pair[0]:6.2f} / {pair[1]:6.2f}"


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` on ``cores`` (affinity is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cores)


def _children(pid: int) -> list[int]:
    """The capture's own child processes (its assembler process)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out.extend(int(c) for c in f.read().split())
    return out


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "-c", "--concurrency", type=int, action="append", help="streams (repeatable; default 1, 100)"
    )
    ap.add_argument("-d", "--duration", type=float, default=4.0, help="measurement window per point, s")
    ap.add_argument("-w", "--warmup", type=float, default=1.0, help="warm-up before each window, s")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    ap.add_argument(
        "--time-scale", type=float, default=2.0, help="sim wall seconds per simulated second (> 0)"
    )
    ap.add_argument("--profile", default="h200-llama3-8b-fp8")
    ap.add_argument("--redact", action="store_true", help="the proxy redacts what it records")
    ap.add_argument(
        "--read-stamps",
        action="store_true",
        help="stamp tokens when the client reads them, not when its kernel received them",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the proxy on a core of its own; the sim and the client share the others",
    )
    ap.add_argument(
        "--assembler-apart",
        action="store_true",
        help="with --pin: the assembler process beside the sim and the client, not the relay",
    )
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="with --pin: the relay at real-time priority (SCHED_FIFO; needs CAP_SYS_NICE), so other "
        "work on a shared machine cannot delay it on its core",
    )
    ap.add_argument(
        "--relay",
        choices=("compiled", "python", "both"),
        default="compiled",
        help="which relay moves reply bodies (LOADGEN_RELAY); both: one capture of each, measured in turn",
    )
    args = ap.parse_args()
    if args.realtime and not args.pin:
        ap.error("--realtime goes with --pin")
    if args.time_scale <= 0:
        ap.error("--time-scale must be > 0 (see the module docstring)")
    args.quickack = False  # what router_overhead.measure expects
    args.kernel_stamps = not args.read_stamps
    concurrencies = args.concurrency or [1, 100]

    out_dir = Path(tempfile.mkdtemp(prefix="loadgen-capture-overhead-"))
    sim = SimProcess.start(["--profile", args.profile, "--time-scale", str(args.time_scale), "--seed", "1"])
    caps: list[tuple[str, CaptureProcess]] = []
    try:
        relays = ["python", "compiled"] if args.relay == "both" else [args.relay]
        for relay in relays:
            name = "capture proxy" if len(relays) == 1 else f"proxy {relay}"
            os.environ["LOADGEN_RELAY"] = relay  # the capture child's relay (pump.py)
            cap = CaptureProcess.start(
                ["--upstream", sim.url, "--out", str(out_dir / f"sessions-{relay}.jsonl"),
                 *(["--redact"] if args.redact else [])]
            )  # fmt: skip
            caps.append((name, cap))
        paths = [("direct", [sim.url], None)] + [(name, [cap.url], cap.proc.pid) for name, cap in caps]
        helpers = {name: _children(cap.proc.pid) for name, cap in caps}  # each one's assembler process
        if args.pin:
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) < 2:
                ap.error("--pin needs at least two cores")
            for _, cap in caps:
                _pin(cap.proc.pid, {cores[-1]})
            for pid in (p for pids in helpers.values() for p in pids):
                _pin(pid, set(cores[:-1]) if args.assembler_apart else {cores[-1]})
            for pid in (sim.proc.pid, os.getpid()):
                _pin(pid, set(cores[:-1]))
            if args.realtime:
                try:
                    for _, cap in caps:
                        for tid in os.listdir(f"/proc/{cap.proc.pid}/task"):
                            os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(1))
                except PermissionError:
                    raise SystemExit(
                        "--realtime: not permitted here (needs CAP_SYS_NICE); run without it"
                    ) from None
        print(
            f"sim ({args.profile}, time-scale {args.time_scale:g}), {args.max_tokens} tokens/request, "
            f"{args.duration:g} s window per point; times in ms (p50 / p99); token times: "
            + ("client reads" if args.read_stamps else "client kernel receive stamps")
            + ("; proxy on a core of its own" if args.pin else "")
            + (", its assembler process beside the sim" if args.pin and args.assembler_apart else "")
            + (", the relay at real-time priority" if args.realtime else "")
        )
        header = (
            f"{'path':<14} {'streams':>7} {'requests':>8}  {'TTFT added':>15}  {'token delivery':>15}  "
            f"{'client ITL':>15}  {'sim ITL':>15}  {'chunks/s':>8}  {'proxy CPU':>9}  {'us/chunk':>8}"
        )
        print(header)
        print("-" * len(header))
        results = {}
        for streams in concurrencies:
            for name, urls, pid in paths:
                helper_cpu_s = _cpu_s(helpers.get(name, []))
                r = measure(name, urls, [sim.url], streams, args, pid)
                r["helper_cpu_s"] = _cpu_s(helpers.get(name, [])) - helper_cpu_s
                results[(name, streams)] = r
                cpu = "" if r["cpu_share"] is None else f"{r['cpu_share']:.0%}"
                per = "" if r["cpu_us_per_chunk"] is None else f"{r['cpu_us_per_chunk']:.1f}"
                print(
                    f"{name:<14} {streams:>7} {r['requests']:>8}  {_fmt(r['ttft_added'])}  {_fmt(r['delivery'])}  "
                    f"{_fmt(r['itl'])}  {_fmt(r['sim_itl'])}  {r['chunks_per_s']:>8,.0f}  {cpu:>9}  {per:>8}",
                    flush=True,
                )
        print("\nadded by the proxy (proxy minus direct; ms, p50 / p99)")
        for streams in concurrencies:
            base = results[("direct", streams)]
            for name, _ in caps:
                r = results[(name, streams)]
                d_ttft = (
                    r["ttft_added"][0] - base["ttft_added"][0],
                    r["ttft_added"][1] - base["ttft_added"][1],
                )
                d_tok = (r["delivery"][0] - base["delivery"][0], r["delivery"][1] - base["delivery"][1])
                print(
                    f"{name:<16} {streams:>4} streams  TTFT {_fmt(d_ttft)}   per chunk (token delivery) {_fmt(d_tok)}"
                )
        print("\nthe assembler process (parsing and sessions, beside the relay; us of CPU per chunk)")
        for streams in concurrencies:
            for name, _ in caps:
                r = results[(name, streams)]
                # Its CPU is read around the whole point, warm-up included (it lags a little).
                chunks = r["chunks_per_s"] * (args.warmup + args.duration)
                per = r["helper_cpu_s"] / chunks * 1e6 if chunks else 0.0
                print(f"{name:<16} {streams:>4} streams  {per:.1f}")
    finally:
        for _, cap in caps:
            cap.stop()
            print(f"\n{cap.output.strip()}")
        sim.stop()


if __name__ == "__main__":
    main()
