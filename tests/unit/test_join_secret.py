"""The join secret: its HMAC, where it is read from, and when a master must have one."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys

import pytest

from loadgen.commands.run import RunOptions, join_env, master_join_env
from loadgen.errors import UserError
from loadgen.runtime import join_auth
from loadgen.runtime.join_auth import (
    hostname_of,
    is_loopback,
    master_secret,
    new_nonce,
    read_secret,
    response,
    verify,
)


def test_the_answer_is_hmac_sha256_of_the_nonce_then_the_client_id() -> None:
    nonce = new_nonce()
    expected = hmac.new(b"s3cret", bytes.fromhex(nonce) + b"host-a_0123abcd", hashlib.sha256).hexdigest()
    assert response("s3cret", nonce, "host-a_0123abcd") == expected
    assert verify("s3cret", nonce, "host-a_0123abcd", expected)


def test_a_wrong_secret_another_nonce_another_id_or_no_answer_fails() -> None:
    nonce = new_nonce()
    good = response("s3cret", nonce, "h_1")
    assert not verify("s3cret", nonce, "h_1", response("wrong", nonce, "h_1"))
    assert not verify("s3cret", new_nonce(), "h_1", good)  # a replayed answer to an old nonce
    assert not verify("s3cret", nonce, "h_2", good)  # another worker's answer
    assert not verify("s3cret", nonce, "h_1", None)
    assert not verify("s3cret", nonce, "h_1", "")
    assert new_nonce() != new_nonce() and len(bytes.fromhex(new_nonce())) == 32


def test_the_answer_never_contains_the_secret() -> None:
    nonce = new_nonce()
    assert "s3cret" not in response("s3cret", nonce, "h_1")


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "*", "10.0.0.5", "::", "master.example.com"):
        assert not is_loopback(host), host


def test_hostname_is_the_client_id_before_its_last_underscore() -> None:
    assert hostname_of("my_host_name_0123456789abcdef") == "my_host_name"
    assert hostname_of("plain") == "plain"


def test_non_loopback_bind_without_secret_or_allow_flag_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.delenv(join_auth.SECRET_ENV, raising=False)
    with pytest.raises(UserError) as e:
        master_secret("0.0.0.0", None, False)
    assert e.value.exit_code == 2
    assert "LOADGEN_JOIN_SECRET" in e.value.message and "--allow-unauthenticated-workers" in e.value.message
    assert master_secret("0.0.0.0", None, True) is None
    assert master_secret("127.0.0.1", None, False) is None  # loopback needs none
    monkeypatch.setenv(join_auth.SECRET_ENV, "from-env")
    assert master_secret("0.0.0.0", None, False) == "from-env"
    assert master_secret("127.0.0.1", None, False) == "from-env"  # used when given


def test_the_secret_file_wins_and_is_stripped_an_empty_or_missing_one_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(join_auth.SECRET_ENV, "from-env")
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    assert read_secret(str(f)) == "from-file"
    f.write_text("\n")
    with pytest.raises(UserError, match="empty"):
        read_secret(str(f))
    with pytest.raises(UserError, match="cannot read"):
        read_secret(str(tmp_path / "nope"))
    monkeypatch.setenv(join_auth.SECRET_ENV, "  ")
    assert read_secret(None) is None


def test_the_secret_reaches_the_locust_process_in_its_environment_only(monkeypatch, capsys) -> None:
    monkeypatch.delenv(join_auth.SECRET_ENV, raising=False)
    env = join_env("abc")
    assert env[join_auth.SECRET_ENV] == "abc" and join_auth.ALLOW_ENV not in env
    env = master_join_env(RunOptions(master=True, bind="0.0.0.0", allow_unauthenticated_workers=True))
    assert env[join_auth.ALLOW_ENV] == "1" and join_auth.SECRET_ENV not in env
    assert "allow-unauthenticated-workers" in capsys.readouterr().err


def test_loadgen_master_off_loopback_without_a_secret_exits_2_with_one_line(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != join_auth.SECRET_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "master", "--headless", "--expect-workers", "1", "--bind", "0.0.0.0",
         "--target", "http://127.0.0.1:9", "--workload", "tiny", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "join secret" in lines[0], out.stderr
    assert list(tmp_path.iterdir()) == []
