"""https:// targets: a self-signed certificate made here (openssl), trusted with --ca-cert or not
checked with --insecure, honoured alike by the streaming client, the preflight and the identity
probes; an untrusted certificate is a one-line error that names the fix.
"""

from __future__ import annotations

import shutil
import subprocess

import gevent.ssl
import pytest

from loadgen.engine.preflight import preflight
from targets.adapters.openai import OpenAIChatAdapter
from targets.errors import TargetError
from targets.identity import read_identity
from targets.tls import tls_context
from tests.integration.test_client_hostile import send, start_hostile

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def make_certificate(d) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem)."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=loadgen-test",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    cert, key = make_certificate(tmp_path_factory.mktemp("tls"))
    proc, port = start_hostile("--tls", cert, key)
    yield f"https://127.0.0.1:{port}", cert
    proc.kill()
    proc.wait(timeout=5)


def test_client_trusts_the_given_ca_cert(tls_server):
    base, cert = tls_server
    ctx = tls_context(cert, ssl_module=gevent.ssl)
    res, _ = send(base, "ok", ssl_context=ctx)
    assert res.ok and res.text == " t0 t1 t2 t3"
    res, _ = send(base, "gzip", ssl_context=ctx)  # compressed, over TLS
    assert res.ok and res.text == " t0 t1 t2 t3"


def test_client_refuses_an_untrusted_certificate(tls_server):
    base, _ = tls_server
    res, _ = send(base, "ok")
    assert res.error_category == "connection" and "certificate verify failed" in res.error_message


def test_client_insecure_skips_the_check(tls_server):
    base, _ = tls_server
    res, _ = send(base, "ok", ssl_context=tls_context(insecure=True, ssl_module=gevent.ssl))
    assert res.ok and len(res.chunk_ns) == 4


def test_preflight_and_identity_honour_the_ca_cert(tls_server):
    base, cert = tls_server
    ctx = tls_context(cert)
    got = preflight(f"{base}/ok", OpenAIChatAdapter(), timeout_s=5.0, ssl_context=ctx)
    assert got["tokens"] == 4
    assert read_identity(f"{base}/ok", timeout_s=5.0, ssl_context=ctx)["model"] == "hostile-model"
    assert read_identity(f"{base}/ok", timeout_s=5.0, ssl_context=tls_context(insecure=True))["model"]


def test_untrusted_certificate_is_a_one_line_error_naming_the_fix(tls_server):
    base, _ = tls_server
    for probe in (
        lambda: preflight(f"{base}/ok", OpenAIChatAdapter(), timeout_s=5.0),
        lambda: read_identity(f"{base}/ok", timeout_s=5.0),
    ):
        with pytest.raises(TargetError) as e:
            probe()
        msg = str(e.value)
        assert "\n" not in msg and f"target {base}/ok: its TLS certificate is not trusted" in msg
        assert "give --ca-cert FILE" in msg


def test_tls_options_are_checked(tmp_path, tls_server):
    _, cert = tls_server
    with pytest.raises(TargetError, match="--ca-cert and --insecure contradict each other"):
        tls_context(cert, insecure=True)
    with pytest.raises(TargetError, match=r"--ca-cert .*nope\.pem: no such file"):
        tls_context(str(tmp_path / "nope.pem"))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(TargetError, match="not a PEM certificate file"):
        tls_context(str(bad))


def test_the_quality_eval_honours_the_ca_cert(tls_server):
    from loadgen.commands.evalset import load_eval_set
    from loadgen.commands.quality import evaluate

    base, cert = tls_server
    items = load_eval_set(None)[:2]
    trusted = evaluate(f"{base}/ok", items, ssl_context=tls_context(cert))
    # The server streams t0 t1 ... to every question: answered (wrongly), never an error.
    assert all(i.answer.startswith("t0 t1 t2") and i.error is None for i in trusted.items)
    untrusted = evaluate(f"{base}/ok", items)
    assert all(i.answer is None and "certificate verify failed" in (i.error or "") for i in untrusted.items)


def test_a_kept_tls_connection_carries_the_next_requests(tls_server):
    """A TLS 1.3 server sends session tickets after the handshake, so an idle connection reads as
    readable: it used to be taken for closed and every request opened a new connection (one more
    handshake, charged to the request's schedule lag)."""
    import time

    from loadgen.engine.client import SessionConnection

    base, cert = tls_server
    conn = SessionConnection(f"{base}/ok", ssl_context=tls_context(cert, ssl_module=gevent.ssl))
    try:
        conn.preconnect()
        time.sleep(0.2)  # the tickets arrive
        for _ in range(3):
            res, _ = send(base, "ok", conn=conn)
            assert res.ok, res.error_message
            time.sleep(0.05)
        assert conn.connections_opened == 1
    finally:
        conn.close()
