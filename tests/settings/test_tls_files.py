"""`statusgate check` on listen.tls and admin_listen.tls (SPEC 25): every file that cannot
serve is one line naming the field, never a traceback or a key; good files make contexts of
TLS 1.2 or later, with client certificates required or optional as configured."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from certs import TestCA

from gateway.run.cli import main
from gateway.settings.config import load_settings

from conftest import PROVIDER_ENV, write_config


@pytest.fixture(autouse=True)
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)


def config_with(folder: Path, listen_tls: dict[str, Any], admin_tls: dict[str, Any]) -> Path:
    changes = {
        "listen": {"tls": listen_tls},
        "admin_listen": {"host": "127.0.0.1", "port": 0, "tls": admin_tls},
    }
    return write_config(folder, "http://127.0.0.1:9", config_changes=changes)


def test_good_files_make_tls_12_contexts_with_client_certificates_as_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files relative to the config's folder load: both listeners get a context refusing
    anything older than TLS 1.2; the admin one asks for client certificates of the CA,
    optional when so configured, and `check` passes, warning while public_base_url is
    http:// on a TLS agent listener."""
    ca = TestCA(tmp_path / "ca")
    server = ca.issue("server")
    listen = {"cert_file": "ca/server.pem", "key_file": "ca/server.key"}
    admin = {**listen, "client_ca_file": str(ca.cert), "client_cert": "optional"}
    config = config_with(tmp_path, listen, admin)
    assert server.cert == tmp_path / "ca" / "server.pem"
    settings = load_settings(config)
    assert set(settings.tls) == {"listen", "admin_listen"}
    assert all(c.minimum_version == ssl.TLSVersion.TLSv1_2 for c in settings.tls.values())
    assert settings.tls["listen"].verify_mode == ssl.CERT_NONE
    assert settings.tls["admin_listen"].verify_mode == ssl.CERT_OPTIONAL
    required = config_with(tmp_path, listen, {**admin, "client_cert": "required"})
    assert load_settings(required).tls["admin_listen"].verify_mode == ssl.CERT_REQUIRED
    assert main(["check", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert ": ok: " in out
    assert err.strip().splitlines() == [
        f"{config}: public_base_url: warning: listen.tls is set but this URL is http://: the"
        " status URLs and Locations agents are handed would not reach the TLS listener"
        " (write https://)"
    ]
    https = config_with(tmp_path, listen, admin)
    data = yaml.safe_load(https.read_text())
    https.write_text(yaml.safe_dump({**data, "public_base_url": "https://gateway.test"}))
    assert main(["check", "--config", str(https)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_names_the_field_of_every_file_that_cannot_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing certificate, a file that is no PEM certificate, a key of another
    certificate, an encrypted key, a CA file without certificates and client_cert without a
    CA: `check` exits 1 with one line for each, naming file and field, and no key."""
    ca = TestCA(tmp_path / "ca")
    server, other = ca.issue("server"), ca.issue("other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_text(
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n"
    )
    good = {"cert_file": str(server.cert), "key_file": str(server.key)}
    cases = [
        (
            {"cert_file": "absent.pem", "key_file": str(server.key)},
            "listen.tls.cert_file: cannot read",
        ),
        (
            {"cert_file": str(garbage), "key_file": str(server.key)},
            "listen.tls.cert_file: no PEM certificate",
        ),
        (
            {"cert_file": str(server.cert), "key_file": str(other.key)},
            f"listen.tls.key_file: {other.key} is not the private key of the certificate in"
            " cert_file",
        ),
        (
            {"cert_file": str(server.cert), "key_file": str(encrypted)},
            "listen.tls.key_file: the key in",
        ),
        (
            {"cert_file": str(server.cert), "key_file": str(server.cert)},
            "listen.tls.key_file: no PEM private key",
        ),
    ]
    admin_cases = [
        (
            {**good, "client_ca_file": str(garbage)},
            "admin_listen.tls.client_ca_file: no PEM certificate",
        ),
        (
            {**good, "client_cert": "required"},
            "admin_listen.tls.client_cert: needs client_ca_file",
        ),
    ]
    secret = server.key.read_text().splitlines()[1]
    for listen, admin, expected in [
        *[(tls, good, text) for tls, text in cases],
        *[(good, tls, text) for tls, text in admin_cases],
    ]:
        folder = tmp_path / f"case{len(list(tmp_path.glob('case*')))}"
        config = config_with(folder, listen, admin)
        assert main(["check", "--config", str(config)]) == 1
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{config}: {expected}"), err
        assert "Traceback" not in err and secret not in err + out
    shutil.rmtree(tmp_path / "ca")


async def handshake(context: ssl.SSLContext, ca: TestCA, cert: Any) -> bytes:
    """What a client presenting ``cert`` reads from a server with ``context`` that answers
    b"served" (b"" when the server ended the connection in the handshake)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"served")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ca.cert))
    if cert is not None:
        client.load_cert_chain(cert.cert, cert.key)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        try:
            return await asyncio.wait_for(reader.read(), 30)
        except (ssl.SSLError, ConnectionError):
            return b""
        finally:
            writer.close()
    finally:
        server.close()


async def test_optional_client_certificates_serve_clients_without_one(tmp_path: Path) -> None:
    """client_cert: optional serves a client without a certificate and one with a
    certificate of the CA, and refuses one whose certificate is of another CA; required
    refuses the client without one."""
    ca, other = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", name="Other CA")
    server = ca.issue("server")
    listen = {"cert_file": str(server.cert), "key_file": str(server.key)}
    admin = {**listen, "client_ca_file": str(ca.cert), "client_cert": "optional"}
    optional = load_settings(config_with(tmp_path / "a", listen, admin)).tls["admin_listen"]
    required = load_settings(
        config_with(tmp_path / "b", listen, {**admin, "client_cert": "required"})
    ).tls["admin_listen"]
    alice, mallory = ca.issue("alice", client=True), other.issue("mallory", client=True)
    assert await handshake(optional, ca, None) == b"served"
    assert await handshake(optional, ca, alice) == b"served"
    assert await handshake(optional, ca, mallory) == b""
    assert await handshake(required, ca, None) == b""
    assert await handshake(required, ca, alice) == b"served"
