"""The relay's certificate (harness/engine/ray/relay_tls.py): made once, kept, made again when
it no longer fits, and its key readable by its owner only."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness.engine.agent_client import RELAY_TLS_NAME
from harness.engine.ray.relay_tls import CERT_FILE, KEY_FILE, relay_identity


def names(pem: bytes) -> list[object]:
    certificate = x509.load_pem_x509_certificate(pem)
    return list(certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_identity_is_a_self_signed_p256_certificate_for_the_address(tmp_path: Path) -> None:
    state = tmp_path / "relay"
    identity = relay_identity(state, "10.250.0.2")
    certificate = x509.load_pem_x509_certificate(identity.certificate_pem)
    key = serialization.load_pem_private_key(identity.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)
    assert key.public_key() == certificate.public_key()
    certificate.verify_directly_issued_by(certificate)
    assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)
    assert names(identity.certificate_pem) == [x509.IPAddress(ipaddress.ip_address("10.250.0.2")),
                                               x509.DNSName(RELAY_TLS_NAME)]
    assert certificate.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=3000)
    assert (mode(state), mode(state / KEY_FILE), mode(state / CERT_FILE)) == (0o700, 0o600, 0o644)
    assert (state / KEY_FILE).read_bytes() == identity.key_pem
    assert [p.name for p in state.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_the_kept_identity_is_reused(tmp_path: Path) -> None:
    first = relay_identity(tmp_path / "relay", "10.250.0.2")
    assert relay_identity(tmp_path / "relay", "10.250.0.2") == first


def test_modes_loosened_on_disk_are_tightened_again(tmp_path: Path) -> None:
    state = tmp_path / "relay"
    first = relay_identity(state, "127.0.0.1")
    state.chmod(0o755)
    (state / KEY_FILE).chmod(0o644)
    assert relay_identity(state, "127.0.0.1") == first
    assert (mode(state), mode(state / KEY_FILE)) == (0o700, 0o600)


def test_another_address_makes_a_new_identity(tmp_path: Path) -> None:
    first = relay_identity(tmp_path / "relay", "10.250.0.2")
    second = relay_identity(tmp_path / "relay", "10.250.0.3")
    assert second.key_pem != first.key_pem
    assert x509.IPAddress(ipaddress.ip_address("10.250.0.3")) in names(second.certificate_pem)
    assert relay_identity(tmp_path / "relay", "10.250.0.3") == second


def test_a_host_name_is_named_as_such(tmp_path: Path) -> None:
    identity = relay_identity(tmp_path / "relay", "node-1.cluster.local")
    assert names(identity.certificate_pem) == [x509.DNSName("node-1.cluster.local"), x509.DNSName(RELAY_TLS_NAME)]


@pytest.mark.parametrize("damage", ["key of another", "garbage", "key missing", "expiring"])
def test_a_kept_identity_that_does_not_fit_is_made_again(tmp_path: Path, damage: str) -> None:
    state = tmp_path / "relay"
    first = relay_identity(state, "127.0.0.1")
    if damage == "key of another":
        (state / KEY_FILE).write_bytes(relay_identity(tmp_path / "other", "127.0.0.1").key_pem)
    elif damage == "garbage":
        (state / CERT_FILE).write_bytes(b"not a certificate")
    elif damage == "key missing":
        (state / KEY_FILE).unlink()
    else:
        key = serialization.load_pem_private_key(first.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        old = x509.load_pem_x509_certificate(first.certificate_pem)
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)
        short = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(old.issuer)
                 .public_key(old.public_key()).serial_number(old.serial_number)
                 .not_valid_before(old.not_valid_before_utc).not_valid_after(soon)
                 .add_extension(old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value,
                                critical=False)
                 .sign(key, hashes.SHA256()))
        (state / CERT_FILE).write_bytes(short.public_bytes(serialization.Encoding.PEM))
    second = relay_identity(state, "127.0.0.1")
    assert second.certificate_pem != first.certificate_pem
    assert relay_identity(state, "127.0.0.1") == second
    assert mode(state / KEY_FILE) == 0o600
