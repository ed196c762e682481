"""``[[secret]]``: the egress proxy carries the real value; the sandbox holds a placeholder.

One allowlist sandbox for the whole module (real engine, real proxy). A TLS server in the
test destination's network namespace (tests/netdest.py) answers as ``dest.callbox.test``
(the secrets' host: the proxy terminates TLS there with the sandbox's own CA) and as
``api.callbox.test`` (allowed, no secret: a plain tunnel). Its certificate comes from a test
CA the engine gives the proxy as its test-only extra CA. The server reports every request's
headers to this test on its stdout and answers with their hashes only, so nothing it sends
back can put a secret into the sandbox.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import queue
import secrets
import sqlite3
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.networks import proxy_name
from harness.engine.secrets import PLACEHOLDER_PREFIX
from harness.engine.spec import HostLimits
from harness.tools import registry_for
from tests.conftest import DEST_HOSTS, IMAGE, RUNTIME
from tests.integration.helpers import run
from tests.security.engines import NETWORKED, not_on_ray

pytestmark = [pytest.mark.docker, not_on_ray(NETWORKED)]

PORT = 8443
TOKEN_VAR = "CALLBOX_TEST_SECRET_TOKEN"

SERVER = f"""
import hashlib, http.server, json, ssl, sys, threading
from functools import partial

class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def report(self):
        print(json.dumps({{"host": self.headers.get("Host"), "path": self.path,
                          "headers": [[k, v] for k, v in self.headers.items()]}}), flush=True)
    def do_GET(self):
        self.report()
        if self.path.startswith("/echo"):
            auth = self.headers.get("Authorization", "")
            body = json.dumps({{"auth_sha256": hashlib.sha256(auth.encode()).hexdigest()}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()
    def log_message(self, *args):
        pass

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT}), partial(Handler, directory=sys.argv[3]))
server.socket = context.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _test_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA (what a public CA is to a real host) and the server's certificate from it."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=callbox test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", cwd=directory)
    (directory / "ext").write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in DEST_HOSTS) + "\n")
    _openssl("req", "-new", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=dest.callbox.test",
             cwd=directory)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "ext", "-out", "server.crt", cwd=directory)
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


def _site(root: Path) -> None:
    """A package index with one wheel (for pip) and a git repository served the dumb way (for git)."""
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("callbox_probe/__init__.py", "VALUE = 42\n")
        archive.writestr("callbox_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: callbox-probe\n"
                         "Version: 1.0\n")
        archive.writestr("callbox_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("callbox_probe-1.0.dist-info/RECORD", "")
    package = root / "simple" / "callbox-probe"
    package.mkdir(parents=True)
    (package / "callbox_probe-1.0-py3-none-any.whl").write_bytes(wheel.getvalue())
    name = "callbox_probe-1.0-py3-none-any.whl"
    (package / "index.html").write_text(f'<a href="{name}">{name}</a>\n')
    work = root / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, timeout=60)
    (work / "README").write_text("served over https\n")
    subprocess.run([*git, "add", "README"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-qm", "one"], check=True, timeout=60)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True, timeout=60)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True, timeout=60)


class Server:
    """The TLS server in the destination's namespace, and the requests it reported."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.seen: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.seen.put(json.loads(line))

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while not self.seen.empty():
            out.append(self.seen.get_nowait())
        return out

    def last(self, path: str) -> dict[str, str]:
        """The headers of the last request for ``path`` (each is reported before its answer)."""
        hits = [r for r in self.drain() if r["path"] == path]
        assert hits, f"the server saw no request for {path}"
        return {k.lower(): v for k, v in hits[-1]["headers"]}


@pytest.fixture(scope="module")
def world(destination: Any, engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("egress-secrets")
    ca, cert, key = _test_ca(directory)
    _site(directory / "site")
    os.chmod(directory, 0o755)
    token = "real-" + secrets.token_hex(20)
    git_token = "gitreal-" + secrets.token_hex(20)
    (directory / "git-token").write_text(git_token + "\n")
    process = subprocess.Popen(["ip", "netns", "exec", destination.namespace, sys.executable, "-u", "-c", SERVER,
                                str(cert), str(key), str(directory / "site")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    old = os.environ.get(TOKEN_VAR)
    os.environ[TOKEN_VAR] = token
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        server = Server(process)
        secrets_engine = DockerEngine(engine.client, run_root=engine.run_root, reap_on_start=False,
                                      egress_test_network=destination.network, egress_test_hosts=DEST_HOSTS,
                                      egress_test_ca=str(ca))
        policy = parse_policy(f"""
[sandbox]
network = "allowlist"
allow_hosts = ["dest.callbox.test:{PORT}", "api.callbox.test:{PORT}"]

[[secret]]
name = "API_TOKEN"
env = "{TOKEN_VAR}"
hosts = ["dest.callbox.test:{PORT}"]
header = "Authorization: Bearer {{value}}"

[[secret]]
name = "GIT_TOKEN"
file = "{directory / 'git-token'}"
hosts = ["dest.callbox.test:{PORT}"]
basic_auth = "x-access-token"

[[tool]]
name = "whoami"
kind = "http"
url = "https://dest.callbox.test:{PORT}/echo/tool"
headers = {{ Authorization = {{ env = "{TOKEN_VAR}", prefix = "token " }} }}
""", source="test.toml", base_dir=directory, host=HostLimits(cpus=None, memory=None))
        spec = policy.sandbox_spec().model_copy(update={"image": IMAGE, "runtime": RUNTIME})
        with AuditStore(directory / "audit.sqlite3") as audit, \
                Session(registry_for(policy), policy, audit, spec=spec,
                        engine_factory=lambda: secrets_engine) as session:
            box = session.sandbox()
            yield {"session": session, "box": box, "server": server, "token": token, "git_token": git_token,
                   "dir": directory, "audit": directory / "audit.sqlite3", "engine": secrets_engine}
    finally:
        if old is None:
            os.environ.pop(TOKEN_VAR, None)
        else:
            os.environ[TOKEN_VAR] = old
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sh(world: dict[str, Any], script: str, timeout_s: int = 60) -> str:
    box = world["box"]
    result = run(box, ["bash", "-c", script], env=box.spec.env, timeout_ms=timeout_s * 1000)
    out = result.stdout.data().decode(errors="replace")
    err = result.stderr.data().decode(errors="replace")
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_secrets_host_gets_the_real_value_and_the_sandbox_a_placeholder(world: dict[str, Any]) -> None:
    box, server, token = world["box"], world["server"], world["token"]
    placeholder = box.spec.env["API_TOKEN"]
    assert placeholder.startswith(PLACEHOLDER_PREFIX + "API_TOKEN_") and token not in placeholder
    # curl verifies the proxy's certificate with the sandbox's bundle (SSL_CERT_FILE and friends)
    out = sh(world, f"curl -sS --fail https://dest.callbox.test:{PORT}/echo/bearer "
                    '-H "Authorization: Bearer $API_TOKEN"')
    assert json.loads(out)["auth_sha256"] == sha(f"Bearer {token}")
    assert server.last("/echo/bearer")["authorization"] == f"Bearer {token}"
    # basic auth from URL userinfo: the file's value, as the policy's user
    sh(world, f'curl -sS --fail "https://me:$GIT_TOKEN@dest.callbox.test:{PORT}/echo/basic"')
    sent = server.last("/echo/basic")["authorization"]
    assert base64.b64decode(sent.removeprefix("Basic ")).decode() == f"x-access-token:{world['git_token']}"
    # the placeholder in another header, or to another host, passes unchanged: worthless there
    sh(world, f'curl -sS --fail https://dest.callbox.test:{PORT}/echo/other -H "X-Note: $API_TOKEN"')
    assert server.last("/echo/other")["x-note"] == placeholder
    out = sh(world, f'curl -sS --fail -v https://api.callbox.test:{PORT}/echo/unlisted '
                    '-H "Authorization: Bearer $API_TOKEN" 2>&1')
    assert server.last("/echo/unlisted")["authorization"] == f"Bearer {placeholder}"
    assert "issuer: CN=callbox test CA" in out  # tunnelled: the host's own certificate, not intercepted
    # the declared http tool: its header leaves the sandbox as the placeholder, the proxy fills it
    result = world["session"].call(ToolCall("whoami", {}, "c-tool"))
    assert not result.is_error, result.text
    assert result.structured["json"]["auth_sha256"] == sha(f"token {token}")
    assert server.last("/echo/tool")["authorization"] == f"token {token}"
    # the audit store says which connections could carry which secrets (names only)
    with sqlite3.connect(world["audit"]) as db:
        records = [json.loads(row[0]) for row in db.execute("SELECT record FROM egress ORDER BY ts")]
    carried = {r["host"]: r.get("secrets") for r in records if r["decision"] == "allow"}
    assert carried == {"dest.callbox.test": ["API_TOKEN", "GIT_TOKEN", "CALLBOX_HTTP_WHOAMI_AUTHORIZATION"],
                       "api.callbox.test": None}


def test_pip_and_git_over_https_work_through_the_proxy(world: dict[str, Any]) -> None:
    sh(world, f"pip download -q --no-deps --disable-pip-version-check --no-cache-dir -d /tmp/dl "
              f"--index-url https://api.callbox.test:{PORT}/simple/ callbox-probe && ls /tmp/dl", timeout_s=120)
    for host in ("api.callbox.test", "dest.callbox.test"):  # tunnelled, and through the proxy's own TLS
        out = sh(world, f"git clone -q https://{host}:{PORT}/repo.git /tmp/clone-{host} && "
                        f"cat /tmp/clone-{host}/README", timeout_s=120)
        assert out == "served over https\n"


def test_shown_values_are_redacted(world: dict[str, Any]) -> None:
    result = world["session"].call(ToolCall("shell", {"command": "echo $API_TOKEN"}, "c-echo"))
    assert "[redacted: secret:API_TOKEN:placeholder]" in result.text
    assert world["session"].redactor.redact(f"x {world['token']} y")[0] == "x [redacted: secret:API_TOKEN] y"


HOLDER = f"""
import os, sys, time, urllib.request
request = urllib.request.Request("https://dest.callbox.test:{PORT}/echo/held",
                                 headers={{"Authorization": "Bearer " + os.environ["API_TOKEN"]}})
answer = urllib.request.urlopen(request, timeout=30).read()
print("held", flush=True)
time.sleep(50)  # callbox-held-probe
"""


def _host_pids(world: dict[str, Any]) -> list[int]:
    top = world["engine"].client.api.top(f"callbox-{world['box'].id}", ps_args="-eo pid")
    return [int(row[0]) for row in top["Processes"]]


def _memory_holds(pid: int, needles: list[bytes]) -> list[str]:
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            start, end = (int(a, 16) for a in addresses.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            found += [f"{pid} {line.strip()}" for n in needles if n in data]
    return found


def test_no_process_file_or_record_of_the_sandbox_holds_a_real_value(world: dict[str, Any]) -> None:
    needles = [world["token"].encode(), world["git_token"].encode()]
    # a process that used the secret (Python, through the proxy), still running while its memory is read
    box = world["box"]
    events = iter(box.agent.exec(["python3", "-c", HOLDER], env=box.spec.env, timeout_ms=60_000))
    for event in events:  # wait until it has its answer
        if event.WhichOneof("event") == "output" and b"held" in event.output.stdout:
            break
    else:
        pytest.fail("the holding process ended without its answer")
    if RUNTIME == "runsc":
        _scan_under_gvisor(world, needles)
        return
    pids = _host_pids(world)
    assert len(pids) >= 2
    found: list[str] = []
    # the scan sees what a process holds: the placeholder it sent is in its memory
    placeholder = box.spec.env["API_TOKEN"].encode()
    assert any(_memory_holds(pid, [placeholder]) for pid in pids)
    for pid in pids:
        for part in ("environ", "cmdline"):
            data = Path(f"/proc/{pid}/{part}").read_bytes()
            found += [f"{pid} {part}" for n in needles if n in data]
        found += _memory_holds(pid, needles)
    # every file the sandbox can write or was given (the image's own files are older than the secret
    # and its root file system is read-only): its tmpfs places and every mount
    root = Path(f"/proc/{pids[0]}/root")
    mounts = [line.split()[4] for line in Path(f"/proc/{pids[0]}/mountinfo").read_text().splitlines()]
    scanned = 0
    for mount in mounts:
        if mount == "/" or mount.startswith(("/proc", "/sys", "/dev")):
            continue
        base = root / mount.lstrip("/")
        for path in [base] if base.is_file() else base.rglob("*"):
            if path.is_file() and not path.is_symlink():
                scanned += 1
                data = path.read_bytes()
                found += [str(path) for n in needles if n in data]
    assert scanned > 3 and any(m == "/etc/callbox/egress" for m in mounts)
    # what Docker knows of the sandbox and its proxy, the proxy's output, the audit store
    found += _outside_the_sandbox(world, needles)
    assert found == []
    assert any(b"callbox-held-probe" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)


DUMP = """
import base64, glob
for d in glob.glob("/proc/[0-9]*"):
    for part in ("environ", "cmdline"):
        try:
            print(d, part, base64.b64encode(open(d + "/" + part, "rb").read()).decode())
        except OSError:
            pass
"""


def _scan_under_gvisor(world: dict[str, Any], needles: list[bytes]) -> None:
    """Under gVisor the sandbox's processes live in its own kernel (the Sentry), out of this
    host's /proc: their environments and command lines are read from inside and searched
    here. (Their memory is the Sentry's, which the runc run's scan of the same proxy design
    stands for.)"""
    found: list[str] = []
    seen_probe = False
    for line in sh(world, f"python3 -c '{DUMP}'").splitlines():
        where, part, data = line.split(" ", 2)
        text = base64.b64decode(data)
        seen_probe |= b"callbox-held-probe" in text
        found += [f"{where} {part}" for n in needles if n in text]
    assert seen_probe  # the holding process was among those read
    found += _outside_the_sandbox(world, needles)
    assert found == []


def _outside_the_sandbox(world: dict[str, Any], needles: list[bytes]) -> list[str]:
    """What holds a real value of what Docker knows of the sandbox and its proxy, the
    proxy's output, the audit store and the proxy's directory."""
    found: list[str] = []
    api = world["engine"].client.api
    for name in (f"callbox-{world['box'].id}", proxy_name(world["box"].id)):
        text = json.dumps(api.inspect_container(name)).encode() + api.logs(name)
        found += [f"docker {name}" for n in needles if n in text]
    for path in world["dir"].glob("audit.sqlite3*"):
        found += [str(path) for n in needles if n in path.read_bytes()]
    egress_dir = world["engine"].run_root / "egress" / world["box"].id
    for path in egress_dir.rglob("*"):
        if path.is_file():
            found += [str(path) for n in needles if n in path.read_bytes()]
    assert sorted(p.name for p in egress_dir.iterdir()) == ["events.jsonl", "expires", "leaf.crt", "rules.json",
                                                            "test-ca.crt", "trust"]  # secrets file and key gone
    return found
