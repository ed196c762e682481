"""What an allowlist sandbox with secrets needs around its egress proxy: its own CA, the leaf
for the secrets' hosts, the secrets file the proxy reads once, the trust it installs.

At sandbox start (:func:`make`, before the packet filter's lock is taken) the real values
are read (:meth:`SecretSpec.read`), a placeholder is drawn per secret, and the ``openssl``
command line makes an EC P-256 CA for this sandbox alone, name-constrained to the secrets'
hosts, and one leaf for all of them; the CA's key is deleted at once, so nothing can sign
another certificate with it. :func:`install` then writes, into the proxy's directory (its
bind mount, owned by the proxy's user, mode 0700): the leaf and its key (0600), the
secrets file (0600; the proxy removes both once read, before it listens) and ``trust/``
(0755), which the sandbox mounts read-only at :data:`TRUST_DIR`, holding the CA and the
bundle the proxy writes there (the image's system CAs and this CA). The real values are in
the proxy's memory only: not its command line, not its environment, not a log.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from docker.types import Mount as DockerMount

from harness.core.errors import SandboxStartError
from harness.engine.secrets import SecretSpec, new_placeholder

__all__ = ["BUNDLE", "TRUST_DIR", "SecretMaterial", "install", "make", "sandbox_env"]

log = logging.getLogger("callbox.network")

TRUST_DIR = "/etc/callbox/egress"
"""Where the sandbox sees its CA and bundle (read-only)."""
BUNDLE = f"{TRUST_DIR}/ca-bundle.pem"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE",
          "PIP_CERT")
"""The variables that point TLS clients at the bundle: OpenSSL (Python's ssl, curl's default),
requests, Node, git, curl and pip."""
SECRETS_FILE = "secrets.json"
CERT_VALID_DAYS = 825


@dataclass(frozen=True)
class SecretMaterial:
    """What one sandbox's secrets need, made before its proxy is created."""

    specs: tuple[SecretSpec, ...]
    values: tuple[str | None, ...]
    """The real values (None: an optional secret whose source is missing; it is not carried)."""
    placeholders: tuple[str, ...]
    ca: bytes
    leaf: bytes
    leaf_key: bytes

    def __repr__(self) -> str:
        return f"SecretMaterial({[s.name for s in self.specs]})"


def _openssl() -> str:
    path = shutil.which("openssl")
    if path is None:
        raise SandboxStartError("this policy has [[secret]] entries, and the egress proxy needs a certificate "
                                "authority made for the sandbox with the openssl command, which is not installed "
                                "where callbox runs; install it (Debian: apt-get install openssl)")
    return path


def _run(args: list[str], cwd: Path) -> None:
    try:
        subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as exc:
        raise SandboxStartError(f"openssl could not make the sandbox's certificates: "
                                f"{exc.stderr.decode(errors='replace').strip()[-300:]}") from None
    except subprocess.TimeoutExpired:
        raise SandboxStartError("openssl took over 30 s to make the sandbox's certificates") from None


def _names(specs: tuple[SecretSpec, ...]) -> list[str]:
    from sandbox.egress_policy import Entry

    names: dict[str, None] = {}
    for spec in specs:
        for text in spec.hosts:
            entry = Entry.parse(text)
            names["*." + entry.host if entry.wildcard else entry.host] = None
    return list(names)


def make(sandbox_id: str, specs: tuple[SecretSpec, ...]) -> SecretMaterial:
    """Read the values and make the certificates (SecretUnavailable, SandboxStartError)."""
    values: list[str | None] = []
    for spec in specs:
        try:
            values.append(spec.read())
        except Exception:
            if not spec.optional:
                raise
            values.append(None)
    openssl = _openssl()
    names = _names(specs)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = Path(tempfile.mkdtemp(prefix="callbox-ca-", dir=base))
    try:
        curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        permitted = ",".join(f"permitted;DNS:{name.removeprefix('*.')}" for name in names)
        _run([openssl, "req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days",
              str(CERT_VALID_DAYS), "-subj", f"/CN=callbox egress CA of sandbox {sandbox_id}",
              "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign",
              "-addext", f"nameConstraints=critical,{permitted}"], work)
        (work / "leaf.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            "subjectAltName=" + ",".join(f"DNS:{name}" for name in names) + "\n")
        _run([openssl, "req", "-new", *curve, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj",
              f"/CN={names[0]}"], work)
        _run([openssl, "x509", "-req", "-in", "leaf.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
              str(int.from_bytes(os.urandom(16), "big") >> 1), "-days", str(CERT_VALID_DAYS),
              "-extfile", "leaf.ext", "-out", "leaf.crt"], work)
        return SecretMaterial(specs, tuple(values), tuple(new_placeholder(s.name) for s in specs),
                              (work / "ca.crt").read_bytes(), (work / "leaf.crt").read_bytes(),
                              (work / "leaf.key").read_bytes())
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the CA's key with it


def _write(path: Path, data: bytes, mode: int, uid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)
    os.chown(path, uid, uid)


def install(material: SecretMaterial, log_dir: Path, proxy_dir: str, uid: int, test_ca: Path | None) -> list[str]:
    """Write the proxy's files into ``log_dir`` (``proxy_dir`` inside the proxy); its arguments."""
    trust = log_dir / "trust"
    trust.mkdir(mode=0o755)
    os.chown(trust, uid, uid)
    _write(trust / "ca.crt", material.ca, 0o644, uid)
    _write(log_dir / "leaf.crt", material.leaf, 0o644, uid)
    _write(log_dir / "leaf.key", material.leaf_key, 0o600, uid)
    carried = []
    for spec, value, placeholder in zip(material.specs, material.values, material.placeholders, strict=True):
        if value is None:
            continue
        name, template = spec.header_parts()
        carried.append({"name": spec.name, "hosts": list(spec.hosts), "header": name, "template": template,
                        "basic_user": spec.basic_auth, "placeholder": placeholder, "value": value})
    document = {"secrets": carried, "cert": f"{proxy_dir}/leaf.crt", "key": f"{proxy_dir}/leaf.key",
                "ca": f"{proxy_dir}/trust/ca.crt", "bundle": f"{proxy_dir}/trust/ca-bundle.pem"}
    _write(log_dir / SECRETS_FILE, json.dumps(document).encode(), 0o600, uid)
    args = ["--secrets-file", f"{proxy_dir}/{SECRETS_FILE}"]
    if test_ca is not None:
        _write(log_dir / "test-ca.crt", test_ca.read_bytes(), 0o644, uid)
        args += ["--test-extra-ca", f"{proxy_dir}/test-ca.crt"]
    return args


def sandbox_mount(log_dir: Path) -> DockerMount:
    return DockerMount(TRUST_DIR, str(log_dir / "trust"), type="bind", read_only=True, propagation="rprivate")


def sandbox_env(material: SecretMaterial) -> dict[str, str]:
    """The placeholders and the variables naming the bundle, for the sandbox's programs."""
    env = {variable: BUNDLE for variable in CA_ENV}
    env.update({spec.name: placeholder for spec, placeholder in zip(material.specs, material.placeholders,
                                                                   strict=True)})
    return env

