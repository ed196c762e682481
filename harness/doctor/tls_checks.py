"""``callbox doctor --config``'s TLS items: ``[tls] cert`` and ``[tls] key``.

The certificate must be readable, parse as PEM and be within its validity dates (a warning
within :data:`EXPIRY_WARN_DAYS` of its end, with how long is left); the key must be readable,
unencrypted (``callbox serve`` has no passphrase to give), private to its owner (a warning
otherwise: serve still starts) and belong to the certificate. The pair is loaded the way the
HTTP doors load it (``ssl.SSLContext.load_cert_chain``), so a mismatch is the TLS library's
own verdict. Dates and key details come from the ``cryptography`` package when it is
installed, else from the standard library's certificate decoder.
"""

from __future__ import annotations

import datetime as dt
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.doctor.report import CheckResult, result_maker

EXPIRY_WARN_DAYS = 30
CERT_KEY = "[tls] cert"
KEY_KEY = "[tls] key"


@dataclass(frozen=True)
class CertFacts:
    subject: str
    not_before: dt.datetime
    not_after: dt.datetime


class _Encrypted(Exception):
    """The key asked for a passphrase."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _named(key: str, path: Path) -> str:
    return f"{key} = {str(path)!r}"


def read_pem(key: str, path: Path) -> tuple[bytes | None, str | None]:
    """The file's bytes, or why it cannot be read (naming the key and the fix)."""
    try:
        return path.read_bytes(), None
    except FileNotFoundError:
        return None, f"{_named(key, path)} does not exist; fix the path"
    except IsADirectoryError:
        return None, f"{_named(key, path)} is a directory; give the PEM file"
    except PermissionError:
        return None, f"{_named(key, path)} cannot be read by this user (permission denied); callbox serve must be " \
                     "able to read it"
    except OSError as exc:
        return None, f"{_named(key, path)} cannot be read: {exc.strerror or exc}"


def cert_facts(data: bytes, path: Path) -> CertFacts:
    """Subject and validity of the first certificate in PEM ``data``; ValueError when it is none."""
    try:
        from cryptography import x509
    except ImportError:
        return _stdlib_facts(data, path)
    cert = x509.load_pem_x509_certificate(data)
    return CertFacts(cert.subject.rfc4514_string() or "(empty subject)", cert.not_valid_before_utc,
                     cert.not_valid_after_utc)


def _stdlib_facts(data: bytes, path: Path) -> CertFacts:
    import _ssl

    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError("no PEM certificate in it")
    decode: Any = getattr(_ssl, "_test_decode_cert", None)
    if decode is None:
        raise ValueError("this Python cannot decode certificates; install the cryptography package")
    try:
        decoded = decode(str(path))
    except ssl.SSLError as exc:
        raise ValueError(str(exc)) from None

    def when(text: str) -> dt.datetime:
        return dt.datetime.fromtimestamp(ssl.cert_time_to_seconds(text), dt.UTC)

    subject = ",".join(f"{k}={v}" for rdn in decoded.get("subject", ()) for k, v in rdn)
    return CertFacts(subject or "(empty subject)", when(decoded["notBefore"]), when(decoded["notAfter"]))


def span(delta: dt.timedelta) -> str:
    """A duration in the largest sensible unit: "364 days", "5 hours", "12 minutes"."""
    seconds = abs(delta.total_seconds())
    if seconds >= 2 * 86400:
        return f"{int(seconds // 86400)} days"
    if seconds >= 2 * 3600:
        return f"{int(seconds // 3600)} hours"
    return f"{max(int(seconds // 60), 0)} minutes"


def _day(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def check_cert(path: Path | None, now: dt.datetime | None = None) -> CheckResult:
    make = result_maker("config.tls-cert")
    if path is None:
        return make("SKIP", f"{CERT_KEY} not set: the doors serve without TLS")
    data, problem = read_pem(CERT_KEY, path)
    if data is None:
        return make("FAIL", problem or "")
    try:
        facts = cert_facts(data, path)
    except ValueError as exc:
        return make("FAIL", f"{_named(CERT_KEY, path)} is not a PEM certificate ({exc}); give the certificate "
                            "file (-----BEGIN CERTIFICATE-----)")
    now = now or dt.datetime.now(dt.UTC)
    if now < facts.not_before:
        return make("FAIL", f"{_named(CERT_KEY, path)} is not valid yet: from {_day(facts.not_before)}, in "
                            f"{span(facts.not_before - now)} (check this host's clock, or issue it again)")
    if now >= facts.not_after:
        return make("FAIL", f"{_named(CERT_KEY, path)} expired {span(now - facts.not_after)} ago, on "
                            f"{_day(facts.not_after)}; renew it and point {CERT_KEY} at the new one")
    left = f"expires in {span(facts.not_after - now)}, on {_day(facts.not_after)}"
    if facts.not_after - now < dt.timedelta(days=EXPIRY_WARN_DAYS):
        return make("WARN", f"{_named(CERT_KEY, path)} ({facts.subject}) {left}; renew it soon")
    return make("PASS", f"{_named(CERT_KEY, path)} ({facts.subject}) {left}")


def _key_problem(data: bytes) -> str | None:
    """Why PEM ``data`` is no usable private key (None: it is one)."""
    if b"ENCRYPTED" in data:
        return "is encrypted with a passphrase, which callbox serve cannot give; store it decrypted " \
               "(`openssl pkey -in KEY -out KEY.plain`, mode 0600)"
    if b"PRIVATE KEY-----" not in data:
        return "is not a PEM private key (-----BEGIN PRIVATE KEY-----); give the key file"
    try:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
    except ImportError:
        return None
    try:
        load_pem_private_key(data, password=None)
    except TypeError:
        return "is encrypted with a passphrase, which callbox serve cannot give; store it decrypted"
    except ValueError as exc:
        return f"does not parse as a private key ({exc})"
    except Exception as exc:  # an algorithm this cryptography does not support
        return f"does not parse as a private key ({type(exc).__name__}: {exc})"
    return None


def check_key(path: Path | None, cert: Path | None) -> CheckResult:
    make = result_maker("config.tls-key")
    if path is None:
        return make("SKIP", f"{KEY_KEY} not set: the doors serve without TLS")
    data, problem = read_pem(KEY_KEY, path)
    if data is None:
        return make("FAIL", problem or "")
    if (problem := _key_problem(data)) is not None:
        return make("FAIL", f"{_named(KEY_KEY, path)} {problem}")
    if cert is None:
        return make("FAIL", f"{_named(KEY_KEY, path)} without {CERT_KEY}; give both or neither")
    if read_pem(CERT_KEY, cert)[0] is None:
        return make("SKIP", f"{_named(KEY_KEY, path)} not compared with {CERT_KEY}, which cannot be read")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(path), password=_no_passphrase)
    except _Encrypted:
        return make("FAIL", f"{_named(KEY_KEY, path)} is encrypted with a passphrase, which callbox serve cannot "
                            "give; store it decrypted")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "mismatch" in str(exc).lower():
            return make("FAIL", f"{_named(KEY_KEY, path)} does not belong to {CERT_KEY} = {str(cert)!r} (the TLS "
                                "library says: key values mismatch); give the key the certificate was issued for")
        return make("FAIL", f"{_named(KEY_KEY, path)} and {CERT_KEY} cannot be loaded together: {exc}")
    except OSError as exc:
        return make("FAIL", f"{_named(KEY_KEY, path)} cannot be loaded: {exc.strerror or exc}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return make("WARN", f"{_named(KEY_KEY, path)} matches the certificate but group or others may read it "
                            f"(mode {mode:04o}); run `chmod 600 {path}`")
    return make("PASS", f"{_named(KEY_KEY, path)} matches the certificate, mode {mode:04o}")
