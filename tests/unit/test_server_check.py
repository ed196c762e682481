"""The one judge of ``callbox serve``'s settings (harness/cli/server_check.py): each refusal,
named by the file's key when the value came from the file and by the flag when it came from
the command line, with the fix; flags over the file; nothing written while judging; and a
reload refused with the very message of the start."""

from __future__ import annotations

import argparse
import datetime
import os
import re
from pathlib import Path

import pytest

from harness.cli.main import build_parser
from harness.cli.serve_reload import reload
from harness.cli.server_check import Origin
from harness.cli.server_config import ConfigError, apply_config, check_file, serve_namespace

TOKENS = "alice:" + "a" * 32 + "\nbuilder:" + "b" * 32 + "\n"
UNKNOWN_TOOL = '[tools.shel]\ndecision = "deny"\n'


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default state dir (audit store, default token file) in this test's directory."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("CALLBOX_AUDIT_DB", "CALLBOX_TOKEN", "CALLBOX_TOKEN_FILE", "CALLBOX_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "state"


def write(tmp_path: Path, text: str) -> Path:
    """``text`` as callbox.toml beside a token file (alice, builder), two policies (one naming
    an unknown tool, one with a pool of 5) and a directory ``adir``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    (tmp_path / "typo-policy.toml").write_text(UNKNOWN_TOOL)
    (tmp_path / "pool-policy.toml").write_text("[pool]\nsize = 5\n")
    (tmp_path / "adir").mkdir(exist_ok=True)
    (tmp_path / "plain-file").write_text("not a socket\n")
    path = tmp_path / "callbox.toml"
    path.write_text(text)
    return path


def pem_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key, as PEM files ``NAME.crt`` and ``NAME.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


GRPC_UNIX = '[doors.grpc]\nlisten = "unix:{dir}/executor.sock"\n[auth]\ntoken_file = "tokens"\n'

FILE_REFUSALS = [
    pytest.param('[doors.grpc]\nlisten = "0.0.0.0:7443"\n',
                 r"\[doors\.grpc\] listen = '0\.0\.0\.0:7443': refusing to serve TCP 0\.0\.0\.0:7443 without TLS: "
                 r"bearer tokens would cross the network in clear text; set \[tls\] cert and \[tls\] key, or \[tls\] "
                 r"insecure = true to accept that", id="grpc-tcp-without-tls"),
    pytest.param('[doors.grpc]\nlisten = "127.0.0.1:7443"\n', r"\[doors\.grpc\] listen = '127\.0\.0\.1:7443': refusing",
                 id="grpc-tcp-on-loopback-without-tls"),
    pytest.param('[doors.e2b]\nlisten = "0.0.0.0:0"\n',
                 r"\[doors\.e2b\] listen = '0\.0\.0\.0:0': refusing to serve the E2B API on 0\.0\.0\.0:0 without TLS: "
                 r"API keys and access tokens .*; set \[tls\] cert and \[tls\] key, or \[tls\] insecure = true",
                 id="e2b-off-loopback-without-tls"),
    pytest.param('[doors.mcp_http]\nlisten = "0.0.0.0:8765"\n',
                 r"\[doors\.mcp_http\] listen = '0\.0\.0\.0:8765': refusing to serve MCP over HTTP on 0\.0\.0\.0: "
                 r"without a token file .*; listen on 127\.0\.0\.1 and tunnel, or set \[tls\] insecure = true",
                 id="mcp-off-loopback"),
    pytest.param(GRPC_UNIX + '[http]\nlisten = "0.0.0.0:9464"\n',
                 r"\[http\] listen = '0\.0\.0\.0:9464': refusing to serve the console on 0\.0\.0\.0:9464 without TLS",
                 id="http-off-loopback-without-tls"),
    pytest.param(GRPC_UNIX + '[limits]\nmax_sandboxes = 2\n[pool]\nsize = 5\n',
                 r"\[pool\] size = 5 is more than \[limits\] max_sandboxes = 2: the gRPC and E2B doors count pooled "
                 r"sandboxes in that limit, so the pool could never hold them; lower \[pool\] size or raise \[limits\] "
                 r"max_sandboxes$", id="pool-size-over-max-sandboxes"),
    pytest.param(GRPC_UNIX + '[limits]\nmax_sandboxes = 4\n[pool]\nsize = 1\nmax = 9\n',
                 r"\[pool\] max = 9 is more than \[limits\] max_sandboxes = 4: .*; lower \[pool\] max or raise",
                 id="pool-max-over-max-sandboxes"),
    pytest.param(GRPC_UNIX + '[policy]\nfile = "pool-policy.toml"\n[limits]\nmax_sandboxes = 3\n',
                 r"\[pool\] size = 5 of \[policy\] file = '.*/pool-policy\.toml' is more than \[limits\] "
                 r"max_sandboxes = 3", id="the-policys-pool-over-max-sandboxes"),
    pytest.param('[doors.grpc]\nlisten = "nonsense"\n',
                 r"\[doors\.grpc\] listen = 'nonsense' is neither a socket path nor HOST:PORT; use e\.g\.",
                 id="grpc-bad-address"),
    pytest.param('[doors.grpc]\nlisten = "unix:/tmp/' + "s" * 120 + '.sock"\n',
                 r"\[doors\.grpc\] listen = 'unix:/tmp/s+\.sock': the socket path is longer than 107 bytes; choose "
                 r"a shorter one", id="socket-path-too-long"),
    pytest.param('[doors.grpc]\nlisten = "unix:{dir}/plain-file"\n',
                 r"\[doors\.grpc\] listen = 'unix:.*/plain-file': .*/plain-file exists and is not a socket; remove it",
                 id="socket-path-is-a-file"),
    pytest.param('[doors.grpc]\nlisten = "unix:{dir}/plain-file/x.sock"\n',
                 r"\[doors\.grpc\] listen = 'unix:.*/plain-file/x\.sock': .*/plain-file is not a directory",
                 id="socket-directory-cannot-be-made"),
    pytest.param('[doors.e2b]\nlisten = "127.0.0.1:99999"\n',
                 r"\[doors\.e2b\] listen = '127\.0\.0\.1:99999': bad address '127\.0\.0\.1:99999': write HOST:PORT",
                 id="e2b-bad-port"),
    pytest.param('[doors.e2b]\nlisten = "127.0.0.1:0"\ndomain = "https://e2b.example.com"\n',
                 r"\[doors\.e2b\] domain = 'https://e2b\.example\.com': sandbox domain .*: it is a URL, "
                 r"not a host name", id="e2b-domain-url"),
    pytest.param(GRPC_UNIX + '[audit]\ndb = "adir"\n',
                 r"\[audit\] db = '.*/adir': .*/adir is a directory, not a file; fix the path",
                 id="audit-db-directory"),
    pytest.param(GRPC_UNIX + '[log]\nfile = "adir"\n', r"\[log\] file = '.*/adir': .*/adir is a directory",
                 id="log-file-directory"),
    pytest.param(GRPC_UNIX + '[policy]\nfile = "typo-policy.toml"\n',
                 r"\[policy\] file = '.*/typo-policy\.toml': \[tools\.shel\] is for 'shel', which is not a registered "
                 r"tool", id="policy-names-an-unknown-tool"),
    pytest.param(GRPC_UNIX + '[profiles.ci]\npolicy = "typo-policy.toml"\n',
                 r"\[profiles\.ci\] policy = '.*/typo-policy\.toml': \[tools\.shel\] is for 'shel'",
                 id="profile-policy-names-an-unknown-tool"),
    pytest.param(GRPC_UNIX + '[runtime]\ndefault = "runsc"\n[pool]\nsize = 1\n', None, id="good-control"),
    pytest.param('[limits]\nmax_sandboxes = 2\n',
                 r"no door to serve; add \[doors\.grpc\], \[doors\.mcp_http\] and/or \[doors\.e2b\]", id="no-door"),
]


@pytest.mark.parametrize(("text", "refusal"), FILE_REFUSALS)
def test_a_file_is_refused_naming_its_key_and_the_fix(tmp_path: Path, text: str, refusal: str | None) -> None:
    path = write(tmp_path, text.format(dir=tmp_path))
    if refusal is None:
        assert check_file(path).config is not None
        return
    with pytest.raises(ConfigError) as raised:
        check_file(path)
    message = raised.value.message
    assert message.startswith(f"config file {path}: "), message
    assert re.search(refusal, message), message
    assert raised.value.exit_code == 2
    assert "--" not in message.replace("--config", ""), f"a flag named for a value of the file: {message}"


def test_tls_problems_name_both_keys(tmp_path: Path) -> None:
    cert, key = pem_pair(tmp_path, "server")
    _other_cert, other_key = pem_pair(tmp_path, "other")
    base = '[doors.e2b]\nlisten = "0.0.0.0:0"\n[auth]\ntoken_file = "tokens"\n'
    assert check_file(write(tmp_path, base + f'[tls]\ncert = "{cert}"\nkey = "{key}"\n')).config is not None
    cases = {
        f'[tls]\ncert = "{cert}"\nkey = "{other_key}"\n':
            r"\[tls\] cert = '.*/server\.crt' and \[tls\] key = '.*/other\.key' cannot be used: the key is not the "
            r"certificate's; give the server's certificate and the key it was made with, both PEM",
        '[tls]\ncert = "tokens"\nkey = "tokens"\n':
            r"\[tls\] cert = '.*/tokens' and \[tls\] key = '.*/tokens' cannot be used: not a PEM certificate",
        f'[tls]\nkey = "{key}"\n':
            r"\[tls\] key = '.*/server\.key' without \[tls\] cert: .*; add \[tls\] cert \(PEM\), or remove \[tls\] key",
        '[tls]\ncert = "missing.crt"\nkey = "missing.key"\n': r"\[tls\] cert = '.*/missing\.crt' is not a file",
    }
    for tls, refusal in cases.items():
        with pytest.raises(ConfigError, match=refusal):
            check_file(write(tmp_path, base + tls))
    # MCP over HTTP has no TLS: a certificate does not let it off loopback
    mcp = f'[doors.mcp_http]\nlisten = "10.9.8.7:0"\n[tls]\ncert = "{cert}"\nkey = "{key}"\n'
    with pytest.raises(ConfigError, match=r"\[doors\.mcp_http\] listen = '10\.9\.8\.7:0': refusing to serve MCP"):
        check_file(write(tmp_path, mcp))


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(("argv", "refusal"), [
    (["--grpc", "0.0.0.0:7443"], r"^--grpc 0\.0\.0\.0:7443: refusing to serve TCP 0\.0\.0\.0:7443 without TLS: .*; "
                                 r"pass --tls-cert and --tls-key, or --insecure to accept that"),
    (["--e2b", "0.0.0.0:0"], r"^--e2b 0\.0\.0\.0:0: refusing to serve the E2B API on 0\.0\.0\.0:0 without TLS: .*"
                             r"pass --tls-cert and --tls-key, or --insecure"),
    (["--mcp-http", "0.0.0.0:0"], r"^--mcp-http 0\.0\.0\.0:0: refusing to serve MCP over HTTP on 0\.0\.0\.0: .*or "
                                  r"pass --insecure on a trusted network"),
    (["--grpc", "x:y"], r"^--grpc 'x:y' is neither a socket path nor HOST:PORT"),
    (["--grpc", "unix:{dir}/x.sock", "--tls-cert", "{dir}/tokens"],
     r"^--tls-cert .*/tokens without --tls-key: .*; pass --tls-key FILE too, or leave --tls-cert out"),
    (["--grpc", "unix:{dir}/x.sock", "--http", "0.0.0.0:0"], r"^--http 0\.0\.0\.0:0: refusing to serve the console"),
    (["--grpc", "unix:{dir}/x.sock", "--policy", "{dir}/pool-policy.toml", "--max-sandboxes", "2"],
     r"^\[pool\] size = 5 of --policy .*/pool-policy\.toml is more than --max-sandboxes 2: .*; lower \[pool\] size in "
     r"that policy or pass a larger --max-sandboxes$"),
    (["--grpc", "unix:{dir}/x.sock", "--policy", "{dir}/nope.toml"],
     r"^--policy .*/nope\.toml is not a file; fix the path, or leave --policy out"),
    (["--grpc", "unix:{dir}/x.sock", "--audit-db", "{dir}/adir"], r"^--audit-db .*/adir: .*/adir is a directory"),
    (["--e2b", "127.0.0.1:0", "--e2b-domain", "10.0.0.5"],
     r"^--e2b-domain 10\.0\.0\.5: sandbox domain '10\.0\.0\.5': an IP address cannot have subdomains; give the name "
     r"whose every subdomain leads to this server, with :PORT"),
    ([], r"^give --grpc \[ADDR\], --mcp-http HOST:PORT and/or --e2b HOST:PORT, or --config FILE$"),
])
def test_flags_are_refused_naming_the_flag(tmp_path: Path, argv: list[str], refusal: str) -> None:
    write(tmp_path, "")
    with pytest.raises(ConfigError, match=refusal) as raised:
        apply_config(serve_args(*(arg.format(dir=tmp_path) for arg in argv)))
    assert "config file" not in raised.value.message and raised.value.exit_code == 2


def test_flags_over_the_file_are_judged_together(tmp_path: Path) -> None:
    path = write(tmp_path, '[doors.grpc]\nlisten = "0.0.0.0:7443"\n[auth]\ntoken_file = "tokens"\n'
                           '[pool]\nsize = 5\n')
    args = serve_args("--config", str(path), "--insecure")
    assert apply_config(args).policy.pool.size == 5  # --insecure lets the file's TCP door through
    assert args.origins["grpc"] == Origin("[doors.grpc] listen", "key")
    assert args.origins["insecure"] == Origin("--insecure")
    # the value from the flag is named by the flag, without the file's name
    with pytest.raises(ConfigError, match=r"^--grpc 0\.0\.0\.0:1: refusing"):
        apply_config(serve_args("--config", str(path), "--grpc", "0.0.0.0:1"))
    # one of the file and one of the command line: the file named, each by its own name
    with pytest.raises(ConfigError) as raised:
        apply_config(serve_args("--config", str(path), "--insecure", "--max-sandboxes", "2"))
    assert raised.value.message == (
        f"config file {path}: [pool] size = 5 is more than --max-sandboxes 2: the gRPC and E2B doors count pooled "
        "sandboxes in that limit, so the pool could never hold them; lower [pool] size or pass a larger "
        "--max-sandboxes")
    # a file without a door, served with a door given as a flag
    bare = write(tmp_path, '[limits]\nmax_per_client = 2\n')
    args = serve_args("--config", str(bare), "--grpc", f"unix:{tmp_path}/x.sock")
    apply_config(args)
    assert args.max_per_client == 2


def test_an_mcp_only_server_may_pool_beyond_the_executor_limit(tmp_path: Path) -> None:
    path = write(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:0"\n[limits]\nmax_sandboxes = 2\n'
                           '[pool]\nsize = 3\n')
    assert check_file(path).policy.pool.size == 3  # that door does not count pooled sandboxes in the limit


def test_judging_writes_nothing(tmp_path: Path, state_home: Path) -> None:
    (tmp_path / "logs").mkdir()
    path = write(tmp_path, f'[doors.grpc]\nlisten = "unix:{tmp_path}/run/executor.sock"\n'
                           '[doors.e2b]\nlisten = "127.0.0.1:0"\n[http]\nlisten = "127.0.0.1:0"\n'
                           '[audit]\ndb = "var/audit.db"\n[log]\nfile = "logs/callbox.log"\n')
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    checked = check_file(path)  # no token file: the default one would be made at the first start
    assert checked.registry is not None and "shell" in checked.registry.names()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not state_home.exists()


def test_the_default_token_file_is_read_when_it_exists(tmp_path: Path, state_home: Path) -> None:
    default = state_home / "callbox" / "grpc-tokens"
    default.parent.mkdir(parents=True)
    default.write_text("default:" + "d" * 32 + "\n")
    default.chmod(0o644)
    path = write(tmp_path, '[doors.e2b]\nlisten = "127.0.0.1:0"\n')
    with pytest.raises(ConfigError, match=r"token file .*grpc-tokens is accessible by group or others .*chmod 600"):
        check_file(path)
    default.chmod(0o600)
    check_file(path)


def test_a_policy_with_mcp_servers_is_judged_without_starting_them(tmp_path: Path) -> None:
    (tmp_path / "mcp-policy.toml").write_text('[[tool]]\nname = "git"\nkind = "mcp"\n'
                                              'command = ["python3", "-m", "mcp_server_git"]\n')
    path = write(tmp_path, GRPC_UNIX.format(dir=tmp_path) + '[policy]\nfile = "mcp-policy.toml"\n')
    checked = check_file(path)
    assert checked.registry is None  # listed at start, in a sandbox
    (note,) = checked.notes
    assert note.startswith("the tools of the mcp servers [policy] file = '") and "checked then" in note


def test_serve_namespace_has_every_setting_of_the_serve_parser(tmp_path: Path) -> None:
    parsed = vars(serve_args("--config", str(tmp_path / "c.toml")))
    made = vars(serve_namespace(tmp_path / "c.toml"))
    assert made.items() <= parsed.items()
    assert set(parsed) - set(made) == {"command", "verbose"}


def test_a_reload_is_refused_with_the_message_of_the_start(tmp_path: Path) -> None:
    path = write(tmp_path, GRPC_UNIX.format(dir=tmp_path))
    command_line = serve_args("--config", str(path))
    running = argparse.Namespace(**vars(command_line))
    apply_config(running)
    path.write_text(GRPC_UNIX.format(dir=tmp_path) + '[limits]\nmax_sandboxes = 1\nmax_per_client = 1\n'
                                                     '[pool]\nsize = 2\n')
    with pytest.raises(ConfigError) as at_start:
        check_file(path)
    with pytest.raises(ConfigError) as on_reload:
        reload(command_line, running, [])
    assert on_reload.value.message == at_start.value.message
    assert "[pool] size = 2 is more than [limits] max_sandboxes = 1" in at_start.value.message
    assert (running.max_sandboxes, running.max_per_client, running.server_config.pool) == (64, 16, None)


def test_config_check_exits_2_with_the_judges_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    path = write(tmp_path, '[doors.e2b]\nlisten = "0.0.0.0:0"\n')
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"callbox: config file {path}: [doors.e2b] listen = '0.0.0.0:0': refusing") and \
        err.count("\n") == 1
    assert not os.path.exists(tmp_path / "state")
