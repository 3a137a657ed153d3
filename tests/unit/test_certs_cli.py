"""`radixmesh certs`: the files a cluster's internal-mTLS Secrets hold, one folder per role,
checked as a TLS peer would check them (and through a real gRPC mutual-TLS handshake)."""

from __future__ import annotations

import itertools
import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.cli import main
from services.transport_config import INTERNAL_SERVER_NAME

ROLES = ("tokenizer", "scheduler", "model", "grammar")


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_one_folder_per_role_signed_by_one_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--days", "30"]) == 0
    ca = _cert(out / "ca" / "ca.crt")
    assert (out / "ca" / "ca.key").exists()
    for role in ROLES:
        folder = out / role
        assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        for p in folder.iterdir():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        cert = _cert(folder / "tls.crt")
        assert _cn(cert) == role
        cert.verify_directly_issued_by(ca)
        assert (folder / "ca.crt").read_bytes() == (out / "ca" / "ca.crt").read_bytes()
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert INTERNAL_SERVER_NAME in sans.get_values_for_type(x509.DNSName)
        days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
        assert days == 30
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    printed = capsys.readouterr().out
    assert (
        f"kubectl -n radixmesh create secret generic radixmesh-mtls-model "
        f"--type=kubernetes.io/tls --from-file={out / 'model'}"
    ) in printed


def test_existing_files_are_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--roles", "model"]) == 0
    key = (out / "ca" / "ca.key").read_bytes()
    assert main(["certs", "--out", str(out), "--roles", "model"]) == 2
    assert "exists: choose a new --out folder" in capsys.readouterr().err
    assert (out / "ca" / "ca.key").read_bytes() == key
    assert main(["certs", "--out", str(tmp_path / "x"), "--roles", "Bad_Role"]) == 2
    assert "role 'Bad_Role'" in capsys.readouterr().err


def test_renewal_from_the_same_ca_and_a_rotation_overlap(tmp_path: Path) -> None:
    first, renewed, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["certs", "--out", str(first), "--roles", "scheduler"]) == 0
    assert main(["certs", "--out", str(other), "--roles", "scheduler"]) == 0
    args = ["--ca-dir", str(first / "ca"), "--trust", str(other / "ca" / "ca.crt")]
    assert main(["certs", "--out", str(renewed), "--roles", "scheduler", *args]) == 0
    assert not (renewed / "ca").exists()  # the CA was reused, not made
    _cert(renewed / "scheduler" / "tls.crt").verify_directly_issued_by(
        _cert(first / "ca" / "ca.crt")
    )
    bundle = (renewed / "scheduler" / "ca.crt").read_text()
    assert bundle.count("BEGIN CERTIFICATE") == 2
    assert (other / "ca" / "ca.crt").read_text().strip() in bundle


def _health_server(folder: Path) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    creds = grpc.ssl_server_credentials(
        [((folder / "tls.key").read_bytes(), (folder / "tls.crt").read_bytes())],
        root_certificates=(folder / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, port


def _check(port: int, folder: Path, trust: Path | None = None) -> bool:
    creds = grpc.ssl_channel_credentials(
        (trust or folder / "ca.crt").read_bytes(),
        (folder / "tls.key").read_bytes(),
        (folder / "tls.crt").read_bytes(),
    )
    opts = [("grpc.ssl_target_name_override", INTERNAL_SERVER_NAME)]
    with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=opts) as chan:
        try:
            health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError:
            return False
    return True


def test_the_files_make_a_mutual_tls_link_and_a_foreign_ca_is_refused(tmp_path: Path) -> None:
    ours, foreign = tmp_path / "ours", tmp_path / "foreign"
    assert main(["certs", "--out", str(ours), "--roles", "tokenizer,scheduler"]) == 0
    assert main(["certs", "--out", str(foreign), "--roles", "tokenizer"]) == 0
    server, port = _health_server(ours / "scheduler")
    try:
        assert _check(port, ours / "tokenizer")
        # The client trusts our CA but presents a foreign certificate: the server refuses it.
        assert not _check(port, foreign / "tokenizer", trust=ours / "ca" / "ca.crt")
    finally:
        server.stop(None)


def test_a_ca_rotation_keeps_old_and_new_pods_talking(tmp_path: Path) -> None:
    """The README's three rolls: at every step, a pod from the previous step and one from the
    next complete a mutual-TLS handshake both ways."""
    old, new = tmp_path / "old", tmp_path / "new"
    assert main(["certs", "--out", str(old), "--roles", "tokenizer,scheduler"]) == 0
    assert main(["certs", "--out", str(new), "--roles", "tokenizer"]) == 0
    roles = ["--roles", "tokenizer,scheduler"]
    rolls = [
        ["--ca-dir", str(old / "ca"), "--trust", str(new / "ca" / "ca.crt")],  # trust both
        ["--ca-dir", str(new / "ca"), "--trust", str(old / "ca" / "ca.crt")],  # switch certs
        ["--ca-dir", str(new / "ca")],  # drop the old CA
    ]
    folders = [old]
    for i, args in enumerate(rolls, 1):
        assert main(["certs", "--out", str(tmp_path / f"r{i}"), *roles, *args]) == 0
        folders.append(tmp_path / f"r{i}")
    for before, after in itertools.pairwise(folders):
        for server_side, client_side in ((before, after), (after, before)):
            server, port = _health_server(server_side / "scheduler")
            try:
                assert _check(port, client_side / "tokenizer"), (server_side, client_side)
            finally:
                server.stop(None)
    # Skipping a roll breaks the link: that is why there are three.
    server, port = _health_server(old / "scheduler")
    try:
        assert not _check(port, folders[3] / "tokenizer")
    finally:
        server.stop(None)
