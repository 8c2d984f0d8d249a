"""A private certificate authority made in the test, with the ``cryptography`` package (in the
dev environment through other packages; a test skips, naming it, without): server
certificates for 127.0.0.1 and localhost, client certificates, each written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509", reason="the tests' CA needs `cryptography`")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class TestCA:
    """A CA whose certificate is ``self.cert`` (the file clients trust)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, folder: Path, name: str = "Statusgate Test CA") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / f"{name.replace(' ', '-').lower()}.pem"
        self.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, client: bool = False) -> Issued:
        """A leaf certificate and key for ``name`` (a server one for 127.0.0.1 and
        localhost, or a client one), written as ``name.pem`` and ``name.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if not client:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        cert, key_file = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_key_pem(key))
        key_file.chmod(0o600)
        return Issued(cert, key_file, serial)


def serial_of(der: bytes) -> int:
    """The serial number of a DER certificate (what a TLS peer presented)."""
    return int(x509.load_der_x509_certificate(der).serial_number)
