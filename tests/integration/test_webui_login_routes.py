"""--web-login protects every route of the web UI, loadgen's own included, whatever gets added.

The browser test (test_webui_browser.py) logs in through a real Chromium and checks a fixed list
of paths; this one walks the Flask URL map of a web UI with loadgen's runtime installed, so a
route added later without ``auth_required_if_enabled`` fails here. It runs in a child process
(importing Locust monkey-patches the interpreter) and opens no port: Flask's test client calls
the app directly.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = r'''
import json, secrets, sys
from flask_login import UserMixin
from locust import User, task
from locust.env import Environment
from loadgen.runtime.locust_runtime import install

class Idle(User):
    @task
    def idle(self):
        pass

class Operator(UserMixin):
    def __init__(self, name):
        self.id = name

sys.argv = ["locust"]  # the web UI reads Locust's defaults from the command line
env = Environment(user_classes=[Idle])
env.create_local_runner()
web = env.create_web_ui("127.0.0.1", 0, web_login=True, delayed_start=True)
web.app.secret_key = secrets.token_hex(16)
web.login_manager.user_loader(Operator)
install(env)
client = web.app.test_client()
out = []
for rule in web.app.url_map.iter_rules():
    path = rule.rule.replace("<", "").replace(">", "")
    for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
        r = client.open(path, method=method)
        out.append([rule.endpoint, rule.rule, method, r.status_code, r.headers.get("Location"),
                    b"extended_stats" in r.get_data()])
print(json.dumps(out))
'''

# Routes a browser must reach before logging in: the login page and the files it loads.
PUBLIC_ENDPOINTS = {"locust.login", "static", "locust.send_assets"}


def test_every_route_but_the_login_page_redirects_to_login():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    routes = json.loads(proc.stdout.strip().splitlines()[-1])
    guarded = [r for r in routes if r[0] not in PUBLIC_ENDPOINTS]
    assert {"/loadgen/live.json", "/loadgen/charts", "/stats/requests", "/"} <= {r[1] for r in guarded}
    for endpoint, rule, method, status, location, leaked in guarded:
        assert status in (302, 401), (method, rule, status)
        assert (location or "/login").startswith("/login"), (method, rule, location)
        assert not leaked, (endpoint, rule)  # loadgen's rows never reach an anonymous caller
