"""The image's HEALTHCHECK: GET /healthz on the port named by the gateway's own config.

Reads STATUSGATE_CONFIG (default /config/gateway.yaml), the file `serve` was started with,
so a different `listen.port` needs no image change. Exit 0 when /healthz answers 200, else 1
with one line on stderr. With `listen.tls` it speaks HTTPS to itself on loopback without
checking the certificate (the names in it are the ones agents use, not 127.0.0.1); where the
listener requires client certificates it presents STATUSGATE_HEALTHCHECK_CERT and
STATUSGATE_HEALTHCHECK_KEY (PEM files), else it says what to set. It never prints config values
or the environment: the config may interpolate secrets from it.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request
from pathlib import Path

from gateway import ConfigError
from gateway.settings.config import Listen, load_gateway_file

WILDCARD_HOSTS = {"", "0.0.0.0", "::"}  # noqa: S104 (names the wildcard, binds nothing)


def healthz_url(host: str, port: int, scheme: str = "http") -> str:
    """The loopback URL for a wildcard listener, else the listener's own address."""
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/healthz"


def tls_context(listen: Listen) -> ssl.SSLContext | None:
    """The client context for a TLS listener (None for plain HTTP); ValueError saying what
    to set when the listener requires a client certificate and none is named."""
    if listen.tls is None:
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # itself, on loopback: alive, not who it is
    cert, key = (os.environ.get(f"STATUSGATE_HEALTHCHECK_{n}") for n in ("CERT", "KEY"))
    if cert:
        context.load_cert_chain(cert, key or None)
    elif listen.tls.client_ca_file is not None and listen.tls.client_cert != "optional":
        raise ValueError(
            "listen.tls requires client certificates: set STATUSGATE_HEALTHCHECK_CERT and"
            " STATUSGATE_HEALTHCHECK_KEY, or listen.tls.client_cert: optional"
        )
    return context


def main() -> int:
    path = Path(os.environ.get("STATUSGATE_CONFIG", "/config/gateway.yaml"))
    try:
        listen = load_gateway_file(path).listen
    except ConfigError as exc:  # its messages name files, fields and variables, never values
        print(f"unhealthy: {exc.problems[0]}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"unhealthy: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 1
    if listen.port == 0:
        print(f"unhealthy: {path} listens on port 0, which cannot be checked", file=sys.stderr)
        return 1
    try:
        context = tls_context(listen)
    except (ValueError, OSError) as exc:  # OSError: a client certificate that cannot load
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    url = healthz_url(listen.host, listen.port, "https" if context else "http")
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:  # noqa: S310
            status = answer.status
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
