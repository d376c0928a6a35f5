"""TLS settings for ``https://`` targets: one place that turns ``--ca-cert``/``--insecure`` into a
client ``SSLContext``, used alike by the preflight and identity probes (``http.client``) and the
streaming client (gevent sockets).

``ca_cert``: a PEM file of certificates to trust *instead of* the system store (a private CA or a
self-signed server certificate); the host name is still checked. ``insecure``: no certificate or
host-name check at all, for throw-away test servers; runs that use it say so in ``run.json``.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from types import ModuleType

from .errors import TargetError

__all__ = ["INSECURE_WARNING", "tls_context"]

INSECURE_WARNING = "TLS certificates were not verified (--insecure): the server's identity is unproven"


def tls_context(
    ca_cert: str | None = None,
    insecure: bool = False,
    *,
    ca_pem: str | None = None,
    ssl_module: ModuleType = ssl,
) -> ssl.SSLContext:
    """A client context for ``ca_cert``/``insecure``; the system defaults when neither is given.

    ``ca_pem`` is the certificate file's content, for a worker that does not share the master's
    files (it wins over ``ca_cert``). ``ssl_module`` is ``ssl`` for blocking sockets or
    ``gevent.ssl`` for the streaming client's cooperative sockets (its contexts wrap into
    gevent's ``SSLSocket``). An unreadable or invalid certificate is a one-line ``TargetError``.
    """
    if (ca_cert or ca_pem) and insecure:
        raise TargetError("--ca-cert and --insecure contradict each other: give one of them")
    if ca_pem:
        try:
            return ssl_module.create_default_context(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as e:
            raise TargetError(f"--ca-cert {ca_cert or ''}: not a PEM certificate ({e})") from None
    if ca_cert:
        if not Path(ca_cert).is_file():
            raise TargetError(f"--ca-cert {ca_cert}: no such file")
        try:
            return ssl_module.create_default_context(cafile=ca_cert)
        except (ssl.SSLError, ValueError, OSError) as e:
            raise TargetError(f"--ca-cert {ca_cert}: not a PEM certificate file ({e})") from None
    if insecure:
        # Not create_default_context(): loading the system trust store only to ignore it costs
        # tens of milliseconds in a worker that is about to start sending.
        ctx = ssl_module.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl_module.create_default_context()
