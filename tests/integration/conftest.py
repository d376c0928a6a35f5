"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from tests.integration.test_client_hostile import start_hostile


@pytest.fixture(scope="module")
def hostile():
    """The hostile server (tests/hostile_server.py) on 127.0.0.1: its base URL, for one module."""
    proc, port = start_hostile()
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=5)
