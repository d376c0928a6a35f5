"""Identity probes carry the adapter's auth headers: a Messages-API server wants ``x-api-key``
and ``anthropic-version``, not ``Authorization: Bearer``, on ``/v1/models``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from targets.identity import read_identity

KEY = "sk-test-identity"


class _KeyedModels(BaseHTTPRequestHandler):
    """``/v1/models`` for the right ``x-api-key`` with an ``anthropic-version``; 401 otherwise."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        keyed = self.headers.get("x-api-key") == KEY and self.headers.get("anthropic-version")
        if self.path == "/v1/models" and keyed:
            body = orjson.dumps({"data": [{"id": "claude-test", "type": "model"}]})
            self.send_response(200)
        else:
            body = orjson.dumps({"type": "error", "error": {"type": "authentication_error"}})
            self.send_response(401 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def keyed_server() -> Iterator[str]:
    _KeyedModels.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedModels)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_messages_identity_probe_sends_x_api_key(keyed_server) -> None:
    ident = read_identity(keyed_server, "anthropic-messages", timeout_s=3, api_key=KEY)
    assert ident["endpoints"]["/v1/models"] == 200 and ident["model"] == "claude-test"
    assert all("Authorization" not in h for h in _KeyedModels.seen)  # the key never goes as Bearer


def test_openai_identity_probe_keeps_bearer(keyed_server) -> None:
    ident = read_identity(keyed_server, "openai-chat", timeout_s=3, api_key=KEY)
    assert ident["endpoints"]["/v1/models"] == 401 and ident["model"] is None
    assert _KeyedModels.seen[0]["Authorization"] == f"Bearer {KEY}"
