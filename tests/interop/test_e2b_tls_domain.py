"""SDKs that only reach ``https://PORT-SANDBOXID.DOMAIN``, against a server with a sandbox
domain and a TLS certificate for it, each unmodified in its own cached virtualenv
(:mod:`tests.interop.e2b_versions`).

``e2b_code_interpreter`` before 2.10.4 (the OpenAI Agents SDK pins 2.8.1) reaches its kernel
only at ``https://49999-ID.DOMAIN``, and ``e2b`` 2.3.4 to 2.6.4 send envd's calls only to
``https://49983-ID.DOMAIN``, whatever ``E2B_SANDBOX_URL`` says. So the server runs as an
operator would run it for them: ``--e2b-domain e2b.test:PORT`` (``.test`` is reserved, never a
real domain; the port because the test cannot bind 443) with ``--tls-cert``/``--tls-key``, a
certificate for ``e2b.test`` and ``*.e2b.test`` signed by a CA, both made here with the same
``openssl`` commands as the operator's recipe in docs/doors/e2b.md. The client sets only what
that page says such a client sets (``E2B_DOMAIN`` or ``E2B_API_URL``, never
``E2B_SANDBOX_URL``) and trusts the CA by ``SSL_CERT_FILE``. The pinned SDK is run the same
way, as a client of the recipe that never sets ``E2B_SANDBOX_URL``.

The wildcard DNS record is played by ``/etc/hosts`` in a mount namespace of the client's own
(``unshare``; as a normal user with a user namespace, skipped where those are not allowed): a
file of the test's is bind-mounted over it for the client alone, so the machine's is never
changed, and the client program adds its sandbox's two names once the create names it
(:mod:`tests.interop.tls_domain_program`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.engine.image.variants import VARIANTS
from tests.conftest import unavailable
from tests.interop.e2b_server import INTEROP_POLICY, E2bServer, serve_e2b, without_e2b
from tests.interop.e2b_versions import AGENTS_SDK_PINS, PINNED, ROOT, python_for
from tests.interop.tls_domain_program import (
    CODE_INTERPRETER,
    COMMANDS,
    CONNECT,
    CREATE,
    SERVER_ADDRESS,
    STEPS,
    host_line,
)

pytestmark = [pytest.mark.interop, pytest.mark.docker]

DOMAIN_NAME = "e2b.test"
OLDEST_HOST_ONLY_E2B = "2.3.4"
"""The oldest ``e2b`` that reads ``E2B_API_URL``; it and those up to 2.6.4 reach envd only by
the sandbox domain (those before read nothing and go to E2B's cloud)."""
PROGRAM = Path(__file__).with_name("tls_domain_program.py")
RUN_TIMEOUT_S = 300
CERTIFICATE_COMMANDS = (
    # A CA, then the server's certificate for the domain and every name under it, signed by it.
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 "
    "-subj '/CN=callbox sandboxes CA' -keyout ca.key -out ca.crt",
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 "
    "-subj '/CN={domain}' -addext 'subjectAltName=DNS:{domain},DNS:*.{domain}' "
    "-addext 'basicConstraints=critical,CA:FALSE' -CA ca.crt -CAkey ca.key -keyout server.key -out server.crt",
)
"""The operator's recipe (docs/doors/e2b.md), for ``{domain}``, run in the certificates' directory."""


@dataclass(frozen=True)
class DomainServer:
    server: E2bServer
    domain: str
    """What the server answers as the sandbox domain: ``e2b.test:PORT``."""
    ca: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((SERVER_ADDRESS, 0))
        port: int = probe.getsockname()[1]
        return port


def make_certificates(directory: Path, domain: str) -> None:
    if shutil.which("openssl") is None:
        unavailable("no openssl command (Debian's openssl package) to make the test's CA and certificate",
                    module=True)
    for command in CERTIFICATE_COMMANDS:
        subprocess.run(["sh", "-c", command.format(domain=domain)], cwd=directory, check=True, capture_output=True,
                       timeout=60)


def own_hosts_prefix() -> list[str]:
    """The command prefix that runs a program with ``$CALLBOX_TEST_HOSTS`` as its ``/etc/hosts``
    (a mount namespace of its own); skips the module, with the reason, where it cannot."""
    unshare = ["unshare", "--mount", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    prefix = [*unshare, "sh", "-c", 'mount --bind "$CALLBOX_TEST_HOSTS" /etc/hosts && exec "$@"', "sh"]
    if shutil.which("unshare") is None:
        unavailable("no unshare command (util-linux) for a private /etc/hosts", module=True)
    probe = subprocess.run([*unshare, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        unavailable(f"cannot make a mount namespace for a private /etc/hosts ({' '.join(unshare)}): "
                    f"{probe.stderr.strip()}", module=True)
    return prefix


@pytest.fixture(scope="module")
def domain_server(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DomainServer]:
    """One ``callbox serve --e2b`` with ``--e2b-domain e2b.test:PORT`` over TLS for the module."""
    own_hosts_prefix()
    certificates = tmp_path_factory.mktemp("certificates")
    make_certificates(certificates, DOMAIN_NAME)
    port = free_port()
    domain = f"{DOMAIN_NAME}:{port}"
    args = ("--e2b-domain", domain, "--tls-cert", str(certificates / "server.crt"),
            "--tls-key", str(certificates / "server.key"))
    with serve_e2b(engine, policy=INTEROP_POLICY, args=args, port=port) as server:
        assert server.url == f"https://{SERVER_ADDRESS}:{port}", server.url
        yield DomainServer(server, domain, certificates / "ca.crt")


def hosts_file(directory: Path) -> Path:
    """The client's ``/etc/hosts``: the API's name leads to the server (the sandboxes' names
    are added as they are made)."""
    hosts = directory / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{SERVER_ADDRESS} api.{DOMAIN_NAME}\n")
    return hosts


def run_isolated(python: Path, mode: str, served: DomainServer, client_env: dict[str, str],
                 hosts: Path) -> dict[str, Any]:
    """The program in its own mount namespace with ``hosts`` as its ``/etc/hosts``, with only
    ``client_env`` of the E2B variables and the CA trusted; its report."""
    env = {**without_e2b(os.environ), **client_env, "E2B_API_KEY": served.server.api_key,
           "SSL_CERT_FILE": str(served.ca), "CALLBOX_TEST_DOMAIN": served.domain, "CALLBOX_TEST_HOSTS": str(hosts)}
    done = subprocess.run([*own_hosts_prefix(), str(python), str(PROGRAM), mode], env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, cwd=str(ROOT))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}\n" \
                                           f"{served.server.log()}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def test_an_old_code_interpreter_runs_code_by_the_sandbox_domain_over_tls(engine: Any, domain_server: DomainServer,
                                                                          tmp_path: Path) -> None:
    image = VARIANTS["code-interpreter"].tag
    try:
        engine.client.images.get(image)
    except Exception:  # docker's ImageNotFound: the variant is make test's to build, not this test's
        unavailable(f"image {image} is missing (run `make image-code-interpreter`)")
    e2b, interpreter = AGENTS_SDK_PINS
    # Only E2B_DOMAIN: the API is https://api.e2b.test:PORT, the kernel https://49999-ID.e2b.test:PORT.
    report = run_isolated(python_for(e2b, interpreter), CODE_INTERPRETER, domain_server,
                          {"E2B_DOMAIN": domain_server.domain}, hosts_file(tmp_path))
    assert (report["e2b"], report["code_interpreter"]) == AGENTS_SDK_PINS
    assert report["results"] == dict.fromkeys(STEPS[CODE_INTERPRETER], "ok"), report["results"]


def test_an_sdk_without_e2b_sandbox_url_runs_a_command_by_the_sandbox_domain_over_tls(
        domain_server: DomainServer, tmp_path: Path) -> None:
    # Only E2B_API_URL: envd's calls go to https://49983-ID.e2b.test:PORT, named by the create's answer.
    api_url = f"https://api.{domain_server.domain}"
    report = run_isolated(python_for(OLDEST_HOST_ONLY_E2B), COMMANDS, domain_server, {"E2B_API_URL": api_url},
                          hosts_file(tmp_path))
    assert report["e2b"] == OLDEST_HOST_ONLY_E2B
    assert report["results"] == dict.fromkeys(STEPS[COMMANDS], "ok"), report["results"]


def test_the_pinned_sdk_runs_a_command_by_the_sandbox_domain_over_tls(domain_server: DomainServer,
                                                                      tmp_path: Path) -> None:
    # Its envd client (pyqwest) reads /etc/hosts once, at start, as it would read real DNS at
    # each lookup: the sandbox is made in one run, and reached with the names known in another.
    hosts, env = hosts_file(tmp_path), {"E2B_DOMAIN": domain_server.domain}
    created = run_isolated(python_for(PINNED), CREATE, domain_server, env, hosts)
    with hosts.open("a", encoding="ascii") as names:
        names.write(host_line(created["sandbox_id"], DOMAIN_NAME))
    report = run_isolated(python_for(PINNED), CONNECT, domain_server,
                          {**env, "CALLBOX_TEST_SANDBOX": created["sandbox_id"]}, hosts)
    assert report["e2b"] == PINNED
    assert report["results"] == dict.fromkeys(STEPS[CONNECT], "ok"), report["results"]
