"""The relay's own TLS identity: a self-signed ECDSA P-256 certificate for the node's address.

Made once and kept in the relay's state directory (the key readable by its owner only), so a
relay that restarts presents the certificate the harness already pinned. It is made again when
the kept one does not fit: another address, a key that is not the certificate's, a validity
that ends within a month, or files that do not parse.

The harness trusts exactly this certificate (it is the only root of its channel) and checks
the name :data:`RELAY_TLS_NAME` in it (``grpc.ssl_target_name_override``), so the check does not
depend on the address the harness dials: what proves the relay is holding the key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.engine.agent_client import RELAY_TLS_NAME

__all__ = ["CERT_FILE", "KEY_FILE", "RELAY_TLS_NAME", "RelayIdentity", "relay_identity"]

log = logging.getLogger("callbox.relay")

CERT_FILE = "relay-cert.pem"
KEY_FILE = "relay-key.pem"
VALIDITY = dt.timedelta(days=3650)
RENEW_BEFORE = dt.timedelta(days=30)
"""A kept certificate that ends sooner than this is made again."""


@dataclass(frozen=True)
class RelayIdentity:
    """The relay's certificate and private key, both PEM."""

    certificate_pem: bytes
    key_pem: bytes


def relay_identity(state_dir: Path, host: str) -> RelayIdentity:
    """The kept identity in ``state_dir`` if it fits ``host`` (an IP address or a DNS name),
    else a new one written there (directory 0700, key 0600)."""
    state_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    state_dir.chmod(0o700)
    cert_path, key_path = state_dir / CERT_FILE, state_dir / KEY_FILE
    kept = _load(cert_path, key_path)
    if kept is not None:
        why = _misfit(kept, host)
        if why is None:
            key_path.chmod(0o600)
            return kept
        log.info("relay certificate in %s is made again: %s", state_dir, why)
    identity = _generate(host)
    # the key first: a certificate on disk without its key would be useless
    _write(key_path, identity.key_pem, 0o600)
    _write(cert_path, identity.certificate_pem, 0o644)
    return identity


def _san_entry(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _generate(host: str) -> RelayIdentity:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, RELAY_TLS_NAME)])
    now = dt.datetime.now(dt.UTC)
    names: list[x509.GeneralName] = [_san_entry(host), x509.DNSName(RELAY_TLS_NAME)]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # a little slack for clocks that disagree
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        # its own trust anchor: the harness pins it as the only root of the channel
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return RelayIdentity(
        certificate_pem=certificate.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
    )


def _load(cert_path: Path, key_path: Path) -> RelayIdentity | None:
    try:
        return RelayIdentity(certificate_pem=cert_path.read_bytes(), key_pem=key_path.read_bytes())
    except FileNotFoundError:
        return None


def _misfit(identity: RelayIdentity, host: str) -> str | None:
    """Why the kept identity cannot serve ``host`` (None: it can)."""
    try:
        certificate = x509.load_pem_x509_certificate(identity.certificate_pem)
        key = serialization.load_pem_private_key(identity.key_pem, password=None)
    except ValueError as error:
        return f"the kept files do not parse ({error})"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        return "the kept key is not ECDSA P-256"
    if key.public_key() != certificate.public_key():
        return "the kept key is not the certificate's"
    try:
        certificate.verify_directly_issued_by(certificate)
    except (ValueError, TypeError, InvalidSignature):
        return "the kept certificate is not self-signed"
    if certificate.not_valid_after_utc - dt.datetime.now(dt.UTC) < RENEW_BEFORE:
        return f"the kept certificate ends on {certificate.not_valid_after_utc:%Y-%m-%d}"
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the kept certificate names no address"
    if _san_entry(host) not in names or x509.DNSName(RELAY_TLS_NAME) not in names:
        return f"the kept certificate is not for {host}"
    return None


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` at once; the file has ``mode`` from its creation on."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # the umask may have taken bits away
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
