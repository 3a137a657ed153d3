"""An ephemeral certificate authority for a local stack: one CA and one certificate per service
role (common name = the role), so `radixmesh serve` runs its internal links over mutual TLS
without any setup. In a cluster the same files come from a Secret (see docs/security.md).

Keys are EC P-256; files are written 0600 into a directory the caller owns (0700).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Every certificate carries the name clients verify (channels override the target name with
# it), so certificates do not depend on pod addresses.
from radixmesh_server.transport_config import INTERNAL_SERVER_NAME


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_local_pki(directory: Path, roles: list[str], days: int = 7) -> dict[str, CertFiles]:
    """A fresh CA and a client+server certificate for each role, in `directory`."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("radixmesh-local-ca"))
        .issuer_name(_name("radixmesh-local-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM))
    out: dict[str, CertFiles] = {}
    sans: list[x509.GeneralName] = [
        x509.DNSName(INTERNAL_SERVER_NAME),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    for role in roles:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(role))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        files = CertFiles(ca_path, directory / f"{role}.pem", directory / f"{role}.key")
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM))
        _write(files.key, _key_pem(key))
        out[role] = files
    return out


def make_server_cert(directory: Path, hostname: str = "localhost") -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for `hostname` (the public port's TLS in
    tests and local trials): returns (ca, cert, key) paths."""
    files = make_local_pki(directory, [hostname])[hostname]
    return files.ca, files.cert, files.key
