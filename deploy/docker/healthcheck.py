"""The image's HEALTHCHECK: GET /healthz on the port named by the gateway's own config.

Reads STATUSGATE_CONFIG (default /config/gateway.yaml), the file `serve` was started with,
so a different `listen.port` needs no image change. Exit 0 when /healthz answers 200, else 1
with one line on stderr. It never prints config values or the environment: the config may
interpolate secrets from it.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from gateway.errors import ConfigError
from gateway.settings.config import load_gateway_file

WILDCARD_HOSTS = {"", "0.0.0.0", "::"}  # noqa: S104 (names the wildcard, binds nothing)


def healthz_url(host: str, port: int) -> str:
    """The loopback URL for a wildcard listener, else the listener's own address."""
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


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
    url = healthz_url(listen.host, listen.port)
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 (http to itself)
            status = answer.status
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
