"""``[[secret]]`` definitions, their checks, and how the proxy fills a request's headers."""

from __future__ import annotations

import base64
import http.client
import http.server
import ipaddress
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harness.core.errors import CallboxError
from harness.core.policy import PolicyError, load_policy, parse_policy
from harness.core.secrets import secret_problems
from harness.engine.secrets import PLACEHOLDER_PREFIX, SecretSpec, new_placeholder, redaction_pairs
from harness.engine.spec import HostLimits, SandboxSpec
from sandbox.egress_policy import Entry
from sandbox.egress_secrets import Secret, SecretRules, load_secrets, rewrite_headers
from sandbox.egress_tls import SecretsProxy, TlsEnd

BEARER = dict(name="API_TOKEN", env="HOST_TOKEN", hosts=("api.example.com",), header="Authorization: Bearer {value}")


def secret(**fields: object) -> Secret:
    values: dict[str, object] = dict(name="API_TOKEN", hosts=(Entry.parse("api.example.com"),),
                                     header="Authorization", template="Bearer {value}", basic_user=None,
                                     placeholder="PH_123", value="real-value")
    values.update(fields)
    return Secret(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "problem"), [
    ({"env": None}, "give exactly one source"),
    ({"file": "/run/key"}, "give exactly one source"),
    ({"header": None}, "give exactly one of header"),
    ({"header": "Authorization Bearer {value}"}, 'is not "NAME: TEMPLATE"'),
    ({"header": "Authorization: Bearer"}, "must hold {value} exactly once"),
    ({"header": "Host: {value}"}, "cannot carry a secret in Host"),
    ({"hosts": ()}, "hosts is empty"),
    ({"hosts": ("10.0.0.1",)}, "host names only"),
    ({"hosts": ("10.0.0.0/8",)}, "host names only"),
    ({"name": "API-TOKEN"}, "not an environment variable name"),
])
def test_a_bad_secret_is_refused_naming_the_fix(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        SecretSpec.model_validate({**BEARER, **fields})


def test_a_value_that_cannot_be_read_names_its_source_never_a_value(tmp_path: Path) -> None:
    spec = SecretSpec.model_validate(BEARER)
    with pytest.raises(CallboxError, match="environment variable HOST_TOKEN of the harness, which is not set"):
        spec.read({})
    assert spec.read({"HOST_TOKEN": "v" * 12}) == "v" * 12
    missing = SecretSpec(name="K", file=tmp_path / "nope", hosts=("a.example",), basic_auth="u")
    with pytest.raises(CallboxError, match=r"cannot be read \(No such file or directory\); create it"):
        missing.read()
    (tmp_path / "key").write_text("from-a-file\n")
    assert SecretSpec(name="K", file=tmp_path / "key", hosts=("a.example",), basic_auth="u").read() == "from-a-file"


def test_a_spec_carries_secrets_only_to_allowed_hosts_of_an_allowlist() -> None:
    secret_spec = SecretSpec.model_validate(BEARER)
    SandboxSpec(network="allowlist", allow_hosts=("api.example.com",), secrets=(secret_spec,))
    with pytest.raises(ValidationError, match="which allow_hosts does not allow"):
        SandboxSpec(network="allowlist", allow_hosts=("other.example.com",), secrets=(secret_spec,))
    with pytest.raises(ValidationError, match="secrets go out through the egress proxy of network 'allowlist'"):
        SandboxSpec(network="none", secrets=(secret_spec,))
    with pytest.raises(ValidationError, match="the name is taken"):
        SandboxSpec(network="allowlist", allow_hosts=("api.example.com",), env={"API_TOKEN": "x"},
                    secrets=(secret_spec,))


def test_a_policy_secret_that_cannot_be_read_fails_before_the_first_call(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOST_TOKEN", raising=False)
    policy_text = ('[sandbox]\nnetwork = "allowlist"\nallow_hosts = ["api.example.com"]\n[[secret]]\n'
                   'name = "API_TOKEN"\nenv = "HOST_TOKEN"\nhosts = ["api.example.com"]\n'
                   'header = "Authorization: Bearer {value}"\n')
    policy = parse_policy(policy_text, source="p.toml", base_dir=tmp_path, host=HostLimits(cpus=None, memory=None))
    assert [s.name for s in policy.sandbox_spec().secrets] == ["API_TOKEN"]
    problem = secret_problems(policy)
    assert problem is not None
    assert problem.startswith("key 'secret[0]': secret API_TOKEN takes its value from the environment variable "
                              "HOST_TOKEN of the harness, which is not set; set it where callbox runs")
    path = tmp_path / "p.toml"
    path.write_text(policy_text)
    with pytest.raises(PolicyError, match=r"p.toml: key 'secret\[0\]': secret API_TOKEN takes its value"):
        load_policy(path)
    with pytest.raises(CallboxError, match="HOST_TOKEN of the harness, which is not set"):
        redaction_pairs(policy.sandbox_spec().secrets)
    monkeypatch.setenv("HOST_TOKEN", "the-real-value")
    placeholder = new_placeholder("API_TOKEN")
    assert placeholder.startswith(PLACEHOLDER_PREFIX + "API_TOKEN_")
    assert redaction_pairs(policy.sandbox_spec().secrets, {"API_TOKEN": placeholder}) == [
        ("secret:API_TOKEN", "the-real-value"), ("secret:API_TOKEN:placeholder", placeholder)]


def test_the_placeholder_is_filled_only_in_the_secrets_header() -> None:
    head = (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nauthorization: token PH_123\r\nX-Note: PH_123\r\n\r\n")
    out, used = rewrite_headers(head, [secret()])
    assert used == ["API_TOKEN"]
    assert out == (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nauthorization: Bearer real-value\r\n"
                   b"X-Note: PH_123\r\n\r\n")
    # no placeholder in it: the header is the client's own and goes unchanged
    own = b"GET / HTTP/1.1\r\nAuthorization: Bearer mine\r\n\r\n"
    assert rewrite_headers(own, [secret()]) == (own, [])


def test_basic_auth_fills_the_password_as_the_policys_user() -> None:
    sent = base64.b64encode(b"me:PH_123").decode()
    head = f"GET / HTTP/1.1\r\nAuthorization: Basic {sent}\r\n\r\n".encode()
    out, _ = rewrite_headers(head, [secret(template=None, basic_user="x-access-token")])
    value = out.split(b"Basic ")[1].split(b"\r\n")[0]
    assert base64.b64decode(value) == b"x-access-token:real-value"
    out, _ = rewrite_headers(head, [secret(template=None, basic_user="")])
    assert base64.b64decode(out.split(b"Basic ")[1].split(b"\r\n")[0]) == b"me:real-value"


def test_secrets_apply_to_their_hosts_and_ports_only() -> None:
    rules = SecretRules([secret(hosts=(Entry.parse("api.example.com"), Entry.parse("*.corp.example:8443")))])
    assert rules.for_host("API.example.com.", 443) and rules.for_host("api.example.com", 80)
    assert not rules.for_host("api.example.com", 8443) and not rules.for_host("example.com", 443)
    assert rules.for_host("git.corp.example", 8443) and not rules.for_host("corp.example", 8443)
    assert not rules.intercepts("api.example.com", 443)  # no TLS context: nothing is opened
    assert "real-value" not in repr(rules)


SECRET_HOST = "secret.test"


def _tls_server(directory: Path) -> tuple[Path, Any, list[dict[str, Any]]]:
    """A local TLS server for ``secret.test`` (its own test CA), recording each request."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=unit CA",
            "-addext", "basicConstraints=critical,CA:TRUE")
    (directory / "ext").write_text(f"subjectAltName=DNS:{SECRET_HOST}\n")
    openssl("req", "-new", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={SECRET_HOST}")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "ext", "-out", "server.crt")
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = b""
            if "chunked" in self.headers.get("Transfer-Encoding", ""):
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({"auth": self.headers.get("Authorization"), "body": body})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "server.crt", directory / "server.key")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return directory / "ca.crt", server, seen


def test_the_proxy_fills_the_secret_over_its_own_tls_on_every_request_of_a_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engine.docker import egress_secrets as material_of
    from sandbox.egress import Config
    from sandbox.egress_policy import Allowlist

    test_ca, server, seen = _tls_server(tmp_path)
    port = server.server_address[1]
    monkeypatch.setenv("UNIT_TOKEN", "the-real-value-42")
    spec = SecretSpec(name="API_TOKEN", env="UNIT_TOKEN", hosts=(f"{SECRET_HOST}:{port}",),
                      header="Authorization: Bearer {value}")
    material = material_of.make("unit", (spec,))
    proxy_dir = tmp_path / "proxy"
    proxy_dir.mkdir()
    args = material_of.install(material, proxy_dir, str(proxy_dir), os.getuid(), test_ca)
    rules = load_secrets(args[1], str(test_ca))
    assert rules is not None and not (proxy_dir / "secrets.json").exists() and not (proxy_dir / "leaf.key").exists()
    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real_getaddrinfo(
        "127.0.0.1" if host == SECRET_HOST else host, *a, **k))
    config = Config(listen=("127.0.0.1", 0), sandbox_id="unit", allowlist=Allowlist.parse([f"{SECRET_HOST}:{port}"]),
                    test_network=ipaddress.ip_network("127.0.0.0/8"))
    proxy = SecretsProxy(config, lambda record: None, rules)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        placeholder = material.placeholders[0]
        client = http.client.HTTPSConnection(*proxy.address, timeout=10, context=ssl.create_default_context(
            cafile=str(proxy_dir / "trust" / "ca-bundle.pem")))
        client.set_tunnel(SECRET_HOST, port)
        for body in (iter([b"one ", b"chunked ", b"body"]), b"second, with a length"):
            client.request("POST", "/x", body=body, headers={"Authorization": f"Bearer {placeholder}"})
            response = client.getresponse()
            assert (response.status, response.read()) == (200, b"ok")
        client.close()
        # a client that sends its TLS hello with the CONNECT, before the proxy's 200
        bundle = ssl.create_default_context(cafile=str(proxy_dir / "trust" / "ca-bundle.pem"))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        hello = bundle.wrap_bio(incoming, outgoing, server_hostname=SECRET_HOST)
        with pytest.raises(ssl.SSLWantReadError):
            hello.do_handshake()
        raw = socket.create_connection(proxy.address, timeout=10)
        raw.sendall(f"CONNECT {SECRET_HOST}:{port} HTTP/1.1\r\n\r\n".encode() + outgoing.read())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += raw.recv(65536)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        incoming.write(rest)
        early = TlsEnd(raw, hello, incoming, outgoing)
        while True:
            try:
                hello.do_handshake()
                break
            except ssl.SSLWantReadError:
                early._flush()
                assert early._feed()
        early.sendall(f"POST /x HTTP/1.1\r\nHost: {SECRET_HOST}\r\nAuthorization: {placeholder}\r\n"
                      "Content-Length: 5\r\nConnection: close\r\n\r\nearly".encode())
        reply = b""
        while chunk := early.recv():
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok")
        raw.close()
        # a host whose certificate the proxy cannot verify (no test CA now) gets nothing: the client a 502
        unverified_dir = tmp_path / "unverified"
        unverified_dir.mkdir()
        unverified = load_secrets(material_of.install(material, unverified_dir, str(unverified_dir), os.getuid(),
                                                      None)[1])
        strict = SecretsProxy(config, lambda record: None, unverified)
        threading.Thread(target=strict.serve_forever, daemon=True).start()
        client = http.client.HTTPSConnection(*strict.address, timeout=10, context=ssl.create_default_context(
            cafile=str(unverified_dir / "trust" / "ca-bundle.pem")))
        client.set_tunnel(SECRET_HOST, port)
        client.request("POST", "/x", body=b"never sent", headers={"Authorization": f"Bearer {placeholder}"})
        response = client.getresponse()
        assert response.status == 502
        assert f"{SECRET_HOST}'s certificate does not verify" in response.read().decode()
        strict.stop()
    finally:
        proxy.stop()
        server.shutdown()
    assert seen == [{"auth": "Bearer the-real-value-42", "body": b"one chunked body"},
                    {"auth": "Bearer the-real-value-42", "body": b"second, with a length"},
                    {"auth": "Bearer the-real-value-42", "body": b"early"}]


def test_an_image_without_system_cas_stops_the_proxy_naming_the_fix(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engine.docker import egress_secrets as material_of
    from sandbox.egress_secrets import load

    monkeypatch.setenv("HOST_TOKEN", "the-real-value")
    material = material_of.make("unit", (SecretSpec.model_validate(BEARER),))
    args = material_of.install(material, tmp_path, str(tmp_path), os.getuid(), None)
    with pytest.raises(ValueError, match=r"no system CA bundle at /nowhere.*install Debian's ca-certificates"):
        load(args[1], system_bundle="/nowhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaf.crt", "trust"]  # the secrets and the key gone anyway


@pytest.mark.parametrize("headers", [b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                                     b"Content-Length: 4\r\nContent-Length: 40\r\n"])
def test_a_request_whose_end_is_ambiguous_is_not_forwarded(headers: bytes) -> None:
    from sandbox.egress_tls import _framing

    with pytest.raises(ValueError, match=r"ambiguous|more than one"):
        _framing(b"POST / HTTP/1.1\r\nHost: a\r\n" + headers + b"\r\n")
    assert _framing(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n") == ("length", 4)
