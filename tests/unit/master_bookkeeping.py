"""A master's bookkeeping without Locust's network: the start of a script run in a child process.

loadgen.runtime imports Locust, which patches the standard library with gevent; a test process
must stay unpatched, so tests run the master's methods in a child (``sys.executable -c``) whose
script begins with this: a ``MasterRuntime`` over a stand-in runner that records what it sends,
a closed-loop run (nothing re-planned) started 10 s ago, and two slot holders a_1 and b_1.
"""

MASTER_SETUP = """
import json, time
from types import SimpleNamespace
from loadgen.config import RunConfig
from loadgen.runtime.master import MasterRuntime

class Runner:
    clients = {}
    sent = []
    def send_message(self, *args, **kwargs): self.sent.append(args[0])
    def quit(self): pass
    def stop(self): pass

env = SimpleNamespace(runner=Runner(), parsed_options=SimpleNamespace(), events=SimpleNamespace())
rt = MasterRuntime(env)
rt.config = RunConfig(run_id="r", workload="tiny", concurrency=2)
rt.t0_unix_s = time.time() - 10.0
rt.slots = {"a_1": 0, "b_1": 1}
"""
