"""A Locust worker that forges loadgen's messages without the join secret (tests only).

It answers every challenge with a made-up MAC, and sends READY, a report, a final and a DONE
carrying a fabricated record for the run named by ``ROGUE_RUN_ID``: a master that requires the
join secret must merge none of it. It prints ``ROGUE: received <type>`` for the first message of
each type the master sends it (Locust's own included: ``spawn`` carries the master's options).
"""

from __future__ import annotations

import os

import gevent
from locust import User, events, task

RUN_ID = os.environ.get("ROGUE_RUN_ID", "")
FAKE = {
    "request_id": f"{RUN_ID}-9999-0", "session_id": "rogue", "session_index": 9999, "turn_index": 0,
    "turn_class": "first", "tenant": "default", "target": "rogue", "worker": "rogue", "status": 200,
    "t_sched_us": 0, "t_send_us": 0,
}  # fmt: skip


def _payload() -> dict:
    return {"run_id": RUN_ID, "h": {}, "r": [FAKE], "state": {"started": 1, "sessions": [], "requests": 0}}


@events.init.add_listener
def _forge(environment, **_kwargs) -> None:
    runner = environment.runner
    seen: set[str] = set()
    locust_handle_message = runner.handle_message

    def record(msg) -> None:
        if msg.type not in seen:
            seen.add(msg.type)
            print(f"ROGUE: received {msg.type}", flush=True)
        locust_handle_message(msg)

    runner.handle_message = record  # every message from the master, Locust's own included
    runner.register_message("loadgen_challenge", lambda msg, **_: runner.send_message("loadgen_auth", {"mac": "00" * 32}))
    runner.register_message("loadgen_denied", lambda msg, **_: print("ROGUE: denied", flush=True))
    runner.register_message("loadgen_plan", lambda msg, **_: print("ROGUE: got a plan", flush=True))
    runner.register_message("loadgen_go", lambda msg, **_: print("ROGUE: got go", flush=True))
    runner.send_message("loadgen_hello", {})

    @events.report_to_master.add_listener
    def _report(client_id, data, **_kw) -> None:
        data["loadgen"] = _payload()

    def spam() -> None:
        while True:
            runner.send_message("loadgen_ready", {"run_id": RUN_ID, "prepare_s": 0.0})
            runner.send_message("loadgen_final", _payload())
            runner.send_message("loadgen_done", _payload())
            gevent.sleep(0.2)

    gevent.spawn(spam)


class LLMDriverUser(User):  # the master's user class name: Locust spawns it here too
    @task
    def idle(self) -> None:
        gevent.sleep(1.0)
