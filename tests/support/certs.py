"""Self-signed TLS certificates for tests, valid over any window (expired, not yet valid), with
their keys (``cryptography``)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path


def write_pair(directory: Path, name: str, *, valid_from_days: float = -1, valid_to_days: float = 365,
               passphrase: bytes | None = None, key_mode: int = 0o600) -> tuple[Path, Path]:
    """``NAME.crt`` and ``NAME.key`` in ``directory``: a self-signed EC certificate for
    ``localhost`` valid from ``valid_from_days`` to ``valid_to_days`` around now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + dt.timedelta(days=valid_from_days))
            .not_valid_after(now + dt.timedelta(days=valid_to_days))
            .sign(key, hashes.SHA256()))
    encryption = (serialization.BestAvailableEncryption(passphrase) if passphrase is not None
                  else serialization.NoEncryption())
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    os.chmod(key_path, key_mode)
    return cert_path, key_path
