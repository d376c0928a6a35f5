"""Who may join a distributed run: the join secret and its challenge-response (docs/distributed.md).

A master bound off loopback requires every worker to prove the join secret before it gets a
slot or any part of the plan: on connect the master sends a random nonce, the worker answers
HMAC-SHA256(secret, nonce || its Locust client id), the master compares with
``hmac.compare_digest``. The secret itself never crosses the wire and never sits on a command
line: it is read from ``LOADGEN_JOIN_SECRET`` or from a file (``--join-secret-file``), and
handed to the Locust process in its environment.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path

from loadgen.errors import UserError

SECRET_ENV = "LOADGEN_JOIN_SECRET"
# Set by the front for the Locust master when --allow-unauthenticated-workers was given.
ALLOW_ENV = "LOADGEN_ALLOW_UNAUTHENTICATED_WORKERS"
NONCE_BYTES = 32
UNAUTHENTICATED_WARNING = (
    "--allow-unauthenticated-workers: any client that reaches the master's port joins this run, "
    "receives its plan and has its records merged"
)


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a name, or 0.0.0.0 / '*': reachable from elsewhere


def read_secret(secret_file: str | None) -> str | None:
    """The join secret: the file's content if a file is named, else ``$LOADGEN_JOIN_SECRET``."""
    if secret_file:
        try:
            text = Path(secret_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise UserError(f"--join-secret-file {secret_file}: cannot read it ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise UserError(f"--join-secret-file {secret_file}: not UTF-8 text") from None
        if not text:
            raise UserError(f"--join-secret-file {secret_file}: the file is empty")
        return text
    return os.environ.get(SECRET_ENV, "").strip() or None


def master_secret(bind: str, secret_file: str | None, allow_unauthenticated: bool) -> str | None:
    """The master's secret; a usage error when it binds off loopback with neither a secret nor
    ``--allow-unauthenticated-workers``."""
    secret = read_secret(secret_file)
    if secret is None and not allow_unauthenticated and not is_loopback(bind):
        raise UserError(
            f"--bind {bind} is reachable from other machines: give the workers' join secret in ${SECRET_ENV} "
            "or --join-secret-file PATH, or say --allow-unauthenticated-workers"
        )
    return secret


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def response(secret: str, nonce: str, client_id: str) -> str:
    """HMAC-SHA256(secret, nonce || client id), hex: what a worker answers to the challenge."""
    return hmac.new(secret.encode(), bytes.fromhex(nonce) + client_id.encode(), hashlib.sha256).hexdigest()


def verify(secret: str, nonce: str, client_id: str, answer: object) -> bool:
    if not isinstance(answer, str):
        return False
    return hmac.compare_digest(response(secret, nonce, client_id).encode(), answer.encode())


def hostname_of(client_id: str) -> str:
    """The host part of a Locust client id (``<hostname>_<uuid hex>``)."""
    return client_id.rpartition("_")[0] or client_id
