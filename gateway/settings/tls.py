"""The listeners' TLS (SPEC 25): ``listen.tls`` and ``admin_listen.tls`` read into server
contexts, with a message naming the field for every file that cannot serve.

Read at start, by ``statusgate check`` and at every reload (the files are re-read, so a
rotated certificate is served to connections made after a reload; a reload whose files are
unreadable or do not match is refused whole, and the running contexts stay). TLS 1.2 or
later; a client CA turns on client certificates (mutual TLS). It never logs or prints a
key, and never asks for a passphrase on a terminal: an encrypted key is refused.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from gateway.settings.loading import Strict

PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
MAX_PEM = 1024 * 1024  # a chain or a bundle of CAs is kilobytes; more is not a PEM file


class ListenTls(Strict):
    cert_file: str
    """The listener's certificate (PEM), followed by any intermediate certificates, relative
    to this file; re-read on reload."""
    key_file: str
    """The certificate's private key (PEM, unencrypted), relative to this file; re-read on
    reload."""
    client_ca_file: str | None = None
    """CA certificates (PEM) that clients' certificates must chain to: mutual TLS. Unset: no
    client certificate is asked for."""
    client_cert: Literal["required", "optional"] | None = None
    """With client_ca_file: required (the default; a client without a certificate that
    chains to the CA is refused in the handshake) or optional (a certificate is asked for
    and, when sent, must chain to the CA; a client without one is served, as a health probe
    that cannot present one)."""


class TlsProblem(ValueError):
    """A TLS file that cannot serve: ``field`` (``cert_file``...) and what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def server_context(tls: ListenTls, base_dir: Path) -> ssl.SSLContext:
    """A server context from the files ``tls`` names (relative paths against ``base_dir``);
    TlsProblem naming the field that cannot serve."""
    if tls.client_cert is not None and tls.client_ca_file is None:
        raise TlsProblem(
            "client_cert", "needs client_ca_file (the CA client certificates chain to)"
        )
    cert_path, key_path = base_dir / tls.cert_file, base_dir / tls.key_file
    _certificates(cert_path, "cert_file")
    _key(key_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # the listeners speak HTTP/1.1 only
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsProblem(
                "key_file", f"{key_path} is not the private key of the certificate in cert_file"
            ) from None
        raise TlsProblem(
            "cert_file", f"cannot use {cert_path} with key_file: {_why(exc)}"
        ) from None
    if tls.client_ca_file is not None:
        ca_path = base_dir / tls.client_ca_file
        context.load_verify_locations(cadata=_certificates(ca_path, "client_ca_file"))
        context.verify_mode = (
            ssl.CERT_OPTIONAL if tls.client_cert == "optional" else ssl.CERT_REQUIRED
        )
    return context


def listener_contexts(
    listeners: Mapping[str, ListenTls | None], base_dir: Path, shown: str
) -> tuple[dict[str, ssl.SSLContext], list[str]]:
    """A context for each listener with TLS (by its config key, ``listen`` or
    ``admin_listen``), and one ``file: key.tls.field: message`` line per one that cannot."""
    contexts: dict[str, ssl.SSLContext] = {}
    problems: list[str] = []
    for name, tls in listeners.items():
        if tls is None:
            continue
        try:
            contexts[name] = server_context(tls, base_dir)
        except TlsProblem as exc:
            problems.append(f"{shown}: {name}.tls.{exc.field}: {exc}")
    return contexts, problems


def _read(path: Path, field: str) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_PEM + 1)
    except OSError as exc:
        raise TlsProblem(field, f"cannot read {path} ({exc.strerror})") from None
    if len(data) > MAX_PEM:
        raise TlsProblem(field, f"{path} is larger than a PEM file ({MAX_PEM // 1024} KiB)")
    return data.decode("ascii", errors="replace")


def _certificates(path: Path, field: str) -> str:
    """The PEM certificates in ``path``, each one parsed (TlsProblem if none or a bad one)."""
    text = _read(path, field)
    if PEM_CERTIFICATE not in text:
        raise TlsProblem(field, f"no PEM certificate in {path} (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.create_default_context(cadata=text)  # parses every certificate in the text
    except ssl.SSLError as exc:
        raise TlsProblem(field, f"a certificate in {path} cannot be read: {_why(exc)}") from None
    return text


def _key(path: Path) -> None:
    text = _read(path, "key_file")
    if "PRIVATE KEY-----" not in text:
        raise TlsProblem("key_file", f"no PEM private key in {path} (-----BEGIN PRIVATE KEY-----)")
    if "ENCRYPTED" in text:
        raise TlsProblem(
            "key_file", f"the key in {path} is encrypted: give it unencrypted (file mode 0600)"
        )


def _no_passphrase() -> bytes:
    """Never a terminal prompt: a key that wants a passphrase fails to load."""
    return b""


def _why(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")
