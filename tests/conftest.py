"""Shared test helpers: free loopback ports and artifacts."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests save screenshots and reports for a person to look at."""
    d = Path(os.environ.get("LOADGEN_TEST_ARTIFACTS", REPO / "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d
