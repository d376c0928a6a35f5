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


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # No name is looked up: Chromium's own background lookups went to the machine's resolver (traffic
    # off loopback, and on a network-less machine a wait of up to a minute a page). The pages under
    # test are files or 127.0.0.1, which need none.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


@pytest.fixture
def chromium(tmp_path: Path) -> list[str]:
    """The command prefix for Debian's headless Chromium (installed by scripts/ensure-chromium.sh).

    Skips when it is missing, unless LOADGEN_REQUIRE_BROWSER is set (as `make test` does), in
    which case the test fails: CI must never skip the browser checks silently.
    """
    import shutil

    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("LOADGEN_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed; run scripts/ensure-chromium.sh")
        pytest.skip("chromium is not installed (scripts/ensure-chromium.sh installs it)")
    return [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]


@pytest.fixture(scope="session")
def llama_paths() -> tuple[Path, Path]:
    """(llama-server binary, SmolLM2 model), built and fetched once per machine.

    Skips when they cannot be had, unless LOADGEN_REQUIRE_LLAMA is set (as `make test` does), in
    which case the test fails: CI must never skip the real-engine checks silently.
    """
    from targets.llamacpp.launcher import LlamaServerError, ensure_llama_server

    try:
        return ensure_llama_server()
    except LlamaServerError as exc:
        if os.environ.get("LOADGEN_REQUIRE_LLAMA"):
            pytest.fail(f"LOADGEN_REQUIRE_LLAMA is set but {exc}")
        pytest.skip(f"{exc} (set LOADGEN_REQUIRE_LLAMA=1 to make this a failure)")
