"""Certificates for the internal mutual TLS: one CA and one certificate per service role
(common name = the role).

Two users: `radixmesh serve` makes an ephemeral CA per local stack (`make_local_pki`), and
`radixmesh certs` makes the files a cluster's Secrets hold (`write_role_folders`: one folder per
role with `ca.crt`, `tls.crt`, `tls.key`, the key names of a `kubernetes.io/tls` Secret and of
cert-manager's, so either can supply them). Keys are EC P-256; files are written 0600 into
directories created 0700.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.security import InternalTLS

# Every certificate carries the name clients verify (channels override the target name with
# it), so certificates do not depend on pod addresses.
from services.transport_config import INTERNAL_SERVER_NAME

# The roles the services admit (security.require_peer); `launcher` only for local stacks.
SERVICE_ROLES = ("tokenizer", "scheduler", "model", "grammar")
# A role is a certificate's common name and a folder / Secret name suffix.
_ROLE_RE = re.compile(r"[a-z][a-z0-9-]{0,40}")


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path

    def internal(self) -> InternalTLS:
        """These files as a process's internal TLS (read now)."""
        return InternalTLS(
            self.ca.read_bytes(),
            self.cert.read_bytes(),
            self.key.read_bytes(),
            INTERNAL_SERVER_NAME,
        )


@dataclass(frozen=True)
class CertAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


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


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise ValueError(f"certificates must be valid for at least 1 day, got {days}")
    now = dt.datetime.now(dt.timezone.utc)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


def check_role(role: str) -> str:
    if not _ROLE_RE.fullmatch(role):
        raise ValueError(f"role {role!r}: use lower-case letters, digits and '-' (e.g. scheduler)")
    return role


def new_ca(name: str = "radixmesh-local-ca", days: int = 7) -> CertAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return CertAuthority(cert, key)


def load_ca(cert_path: Path, key_path: Path) -> CertAuthority:
    """A CA written earlier by `write_role_folders` (to issue more certificates from it)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the CA from {cert_path} and {key_path}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: expected an EC private key")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    return CertAuthority(cert, key)


def _spki(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def issue(ca: CertAuthority, role: str, days: int) -> tuple[bytes, bytes]:
    """A client+server certificate for `role` signed by `ca`: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    sans: list[x509.GeneralName] = [
        x509.DNSName(INTERNAL_SERVER_NAME),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(role))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(end, ca.cert.not_valid_after_utc))  # never outlive the CA
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_local_pki(directory: Path, roles: list[str], days: int = 7) -> dict[str, CertFiles]:
    """A fresh CA and a client+server certificate for each role, in `directory`."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = new_ca(days=days)
    ca_path = directory / "ca.pem"
    _write(ca_path, ca.cert_pem)
    out: dict[str, CertFiles] = {}
    for role in roles:
        cert, key = issue(ca, role, days)
        files = CertFiles(ca_path, directory / f"{role}.pem", directory / f"{role}.key")
        _write(files.cert, cert)
        _write(files.key, key)
        out[role] = files
    return out


# File names inside each role folder (and keys of its Secret).
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
CA_KEY_FILE = "ca.key"


def write_role_folders(
    out: Path,
    roles: Sequence[str] = SERVICE_ROLES,
    days: int = 365,
    ca: CertAuthority | None = None,
    extra_trust: bytes = b"",
) -> dict[str, CertFiles]:
    """`out/<role>/{ca.crt,tls.crt,tls.key}` for each role, signed by `ca`, or by a new CA
    written to `out/ca/{ca.crt,ca.key}` (the key never goes into a Secret; keep it to issue
    replacements from the same CA). `extra_trust` (PEM) is appended to every `ca.crt`: during a
    CA rotation every service trusts the old and the new CA. Existing files are never
    overwritten (a lost CA key cannot be recovered): FileExistsError names the first one."""
    for role in roles:
        check_role(role)
    targets = [out / r / f for r in roles for f in (CA_FILE, CERT_FILE, KEY_FILE)]
    if ca is None:
        targets += [out / "ca" / CA_FILE, out / "ca" / CA_KEY_FILE]
    for t in targets:
        if t.exists():
            raise FileExistsError(f"{t} exists: choose a new --out folder or remove it")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    if ca is None:
        # A CA name of its own: during a rotation two CAs are trusted side by side, and TLS
        # stacks find a certificate's issuer by name first.
        ca = new_ca(f"radixmesh-cluster-ca {secrets.token_hex(4)}", days)
        (out / "ca").mkdir(mode=0o700)
        _write(out / "ca" / CA_FILE, ca.cert_pem)
        _write(out / "ca" / CA_KEY_FILE, _key_pem(ca.key))
    trust = ca.cert_pem + (b"\n" + extra_trust.strip() + b"\n" if extra_trust.strip() else b"")
    files: dict[str, CertFiles] = {}
    for role in roles:
        folder = out / role
        folder.mkdir(mode=0o700, exist_ok=True)
        cert, key = issue(ca, role, days)
        f = CertFiles(folder / CA_FILE, folder / CERT_FILE, folder / KEY_FILE)
        _write(f.ca, trust)
        _write(f.cert, cert)
        _write(f.key, key)
        files[role] = f
    return files


def make_server_cert(directory: Path, hostname: str = "localhost") -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for `hostname` (the public port's TLS in
    tests and local trials): returns (ca, cert, key) paths."""
    files = make_local_pki(directory, [hostname])[hostname]
    return files.ca, files.cert, files.key
