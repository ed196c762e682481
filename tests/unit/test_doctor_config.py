"""`callbox doctor --config`'s items, each against real files and sockets in a temporary directory
(no engine): TLS certificate and key, token file, the doors' addresses, audit store and log file."""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.server_config import ServerConfig, parse_config
from harness.doctor.config_checks import check_audit, check_log, check_tokens, config_report, door_checks
from harness.doctor.listeners import Bindable, Holder, try_unix
from harness.doctor.report import CheckResult
from harness.doctor.tls_checks import check_cert, check_key, span
from tests.support.certs import write_pair

TOKEN = "t" * 32


def _config(tmp_path: Path, text: str) -> ServerConfig:
    return parse_config(text, source="config file test.toml", base=tmp_path)


@pytest.fixture
def listening() -> Iterator[int]:
    """A TCP port this process listens on (as another server would)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# ---- TLS -------------------------------------------------------------------------------------


def test_a_valid_certificate_says_how_long_it_has(tmp_path: Path) -> None:
    cert, _ = write_pair(tmp_path, "good", valid_to_days=200)
    result = check_cert(cert)
    assert result.status == "PASS" and result.reason.startswith(f"[tls] cert = '{cert}' (CN=localhost) expires in ")
    assert "199 days" in result.reason or "200 days" in result.reason


def test_an_expired_certificate_fails_with_when_and_the_fix(tmp_path: Path) -> None:
    cert, _ = write_pair(tmp_path, "old", valid_from_days=-30, valid_to_days=-3)
    result = check_cert(cert)
    assert result.status == "FAIL" and result.id == "config.tls-cert"
    assert f"[tls] cert = '{cert}' expired 3 days ago, on " in result.reason
    assert result.reason.endswith("renew it and point [tls] cert at the new one")


def test_a_certificate_near_its_end_warns_and_one_not_yet_valid_fails(tmp_path: Path) -> None:
    soon, _ = write_pair(tmp_path, "soon", valid_to_days=5)
    warned = check_cert(soon)
    assert warned.status == "WARN" and "expires in 4 days" in warned.reason and "renew it soon" in warned.reason
    later, _ = write_pair(tmp_path, "later", valid_from_days=2)
    early = check_cert(later)
    assert early.status == "FAIL" and "is not valid yet" in early.reason and "clock" in early.reason


def test_the_dates_come_from_the_standard_library_without_cryptography(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cert, _ = write_pair(tmp_path, "old", valid_from_days=-30, valid_to_days=-3)
    good, _ = write_pair(tmp_path, "good")
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography: ImportError
    assert check_cert(cert).status == "FAIL" and "expired 3 days ago" in check_cert(cert).reason
    assert check_cert(good).status == "PASS" and "commonName=localhost" in check_cert(good).reason


def test_certificate_files_that_are_missing_or_not_certificates(tmp_path: Path) -> None:
    missing = check_cert(tmp_path / "none.crt")
    assert missing.status == "FAIL" and missing.reason == f"[tls] cert = '{tmp_path}/none.crt' does not exist; fix " \
                                                          "the path"
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    junk = check_cert(tmp_path / "junk.crt")
    assert junk.status == "FAIL" and "is not a PEM certificate" in junk.reason
    assert check_cert(None).status == "SKIP"


def test_the_key_must_belong_to_the_certificate(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "good")
    _, other = write_pair(tmp_path, "other")
    matched = check_key(key, cert)
    assert (matched.status, matched.reason) == ("PASS", f"[tls] key = '{key}' matches the certificate, mode 0600")
    mismatched = check_key(other, cert)
    assert mismatched.status == "FAIL" and mismatched.id == "config.tls-key"
    assert f"[tls] key = '{other}' does not belong to [tls] cert = '{cert}'" in mismatched.reason
    assert "give the key the certificate was issued for" in mismatched.reason


def test_an_encrypted_unparsable_or_shared_key(tmp_path: Path) -> None:
    cert, locked = write_pair(tmp_path, "locked", passphrase=b"secret")
    encrypted = check_key(locked, cert)
    assert encrypted.status == "FAIL" and "encrypted with a passphrase" in encrypted.reason
    (tmp_path / "junk.key").write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    assert check_key(tmp_path / "junk.key", cert).status == "FAIL"
    shared_cert, shared = write_pair(tmp_path, "shared", key_mode=0o644)
    warned = check_key(shared, shared_cert)
    assert warned.status == "WARN" and f"run `chmod 600 {shared}`" in warned.reason and "mode 0644" in warned.reason
    assert check_key(None, None).status == "SKIP"


def test_spans() -> None:
    assert span(dt.timedelta(days=364, hours=3)) == "364 days"
    assert span(dt.timedelta(hours=5)) == "5 hours"
    assert span(dt.timedelta(minutes=12)) == "12 minutes"


# ---- tokens, audit, log ------------------------------------------------------------------------


def test_a_token_file_others_may_read_fails_with_the_fix(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{TOKEN}\n")
    tokens.chmod(0o644)
    result = check_tokens(tokens)
    assert result.status == "FAIL" and result.id == "config.tokens"
    assert result.reason.startswith(f"[auth] token_file = '{tokens}': ") and f"chmod 600 {tokens}" in result.reason
    tokens.chmod(0o600)
    assert check_tokens(tokens).reason == f"[auth] token_file = '{tokens}': 1 client(s) (alice), mode 0600"
    tokens.write_text("no colon here\n")
    assert check_tokens(tokens).status == "FAIL"
    assert check_tokens(None).status == "SKIP"


def test_the_audit_store_and_the_log_file(tmp_path: Path) -> None:
    made = check_audit(tmp_path / "state" / "audit.db")
    assert made.status == "PASS" and "will be created" in made.reason
    (tmp_path / "afile").write_text("")
    blocked = check_audit(tmp_path / "afile" / "audit.db")
    assert blocked.status == "FAIL" and "is not a directory" in blocked.reason
    unwritable = check_audit(Path("/proc/callbox-doctor-test/audit.db"))  # nobody, root included, makes files there
    assert unwritable.status == "FAIL" and "cannot make files in /proc" in unwritable.reason
    assert check_log(tmp_path / "callbox.log").status == "PASS"
    missing = check_log(tmp_path / "nowhere" / "callbox.log")
    assert missing.status == "FAIL" and "its directory" in missing.reason and "does not exist" in missing.reason
    assert check_log(None).status == "SKIP"


# ---- the doors ---------------------------------------------------------------------------------


def _by_id(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.id: r for r in results}


def test_a_port_in_use_names_the_key_the_holder_and_the_fix(tmp_path: Path, listening: int) -> None:
    config = _config(tmp_path, f'[doors.grpc]\nlisten = "127.0.0.1:{listening}"\n'
                               '[doors.e2b]\nlisten = "127.0.0.1:0"\n')
    results = _by_id(door_checks(config))
    taken = results["config.grpc"]
    assert taken.status == "FAIL"
    assert taken.reason.startswith(f"[doors.grpc] listen = '127.0.0.1:{listening}': port {listening} is in use by "
                                   f"pid {os.getpid()}: ")
    assert taken.reason.endswith("stop that or choose another address")
    assert results["config.e2b"].status == "PASS" and "port 0" in results["config.e2b"].reason


def test_doors_on_one_port_clash_and_bad_addresses_say_why(tmp_path: Path) -> None:
    config = _config(tmp_path, '[doors.mcp_http]\nlisten = "127.0.0.1:47999"\n[http]\nlisten = "0.0.0.0:47999"\n'
                               '[doors.e2b]\nlisten = "127.0.0.1:99999"\n')
    results = _by_id(door_checks(config, _attempt_free))
    assert results["config.mcp-http"].status == "PASS"
    clash = results["config.http"]
    assert clash.status == "FAIL" and "is also where [doors.mcp_http] listen listens" in clash.reason
    bad = results["config.e2b"]
    assert bad.status == "FAIL" and bad.reason.startswith("[doors.e2b] listen = '127.0.0.1:99999': bad address")


def _attempt_free(door: str, listen: str) -> tuple[str, Bindable]:
    """The door's own parser; the port then taken as free (the clash is the file's, not this host's)."""
    from harness.doctor.config_checks import attempt_listen

    where, _ = attempt_listen(door, listen)
    return where, Bindable()


def test_a_port_held_by_callbox_serve_passes_and_says_so(tmp_path: Path) -> None:
    holder = Holder(4242, "/usr/bin/python3 /usr/local/bin/callbox serve --config /etc/callbox/callbox.toml")
    assert holder.is_callbox_serve and not Holder(7, "nginx: master process").is_callbox_serve
    assert Holder(8, "python -m harness.cli.main serve --grpc").is_callbox_serve
    config = _config(tmp_path, '[doors.grpc]\nlisten = "127.0.0.1:7443"\n')
    held = door_checks(config, lambda door, listen: ("127.0.0.1:7443", Bindable("port 7443 is in use", True, holder)))
    assert held[0].status == "PASS"
    assert "is held by a running callbox serve (pid 4242: /usr/bin/python3" in held[0].reason


def test_unix_sockets_live_stale_or_in_the_way(tmp_path: Path) -> None:
    path = tmp_path / "executor.sock"
    assert try_unix(path).problem is None  # nothing there: serve makes it
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        live = try_unix(path)
        assert live.in_use and live.holder is not None and live.holder.pid == os.getpid()
        config = _config(tmp_path, f'[doors.grpc]\nlisten = "unix:{path}"\n')
        [result] = door_checks(config)
        assert result.status == "FAIL" and result.reason.startswith(f"[doors.grpc] listen = 'unix:{path}': ")
        assert f"by pid {os.getpid()}" in result.reason
    finally:
        server.close()
    assert try_unix(path).problem is None  # stale: nobody listens, serve removes it
    path.unlink()
    path.write_text("")
    assert "is not a socket" in (try_unix(path).problem or "")
    assert "longer than 107 bytes" in (try_unix(tmp_path / ("x" * 120)).problem or "")


# ---- the whole file ----------------------------------------------------------------------------


def test_a_file_the_loader_refuses_is_still_checked_item_by_item(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{TOKEN}\n")
    tokens.chmod(0o644)
    path = tmp_path / "callbox.toml"
    path.write_text('[doors.grpc]\nlisten = "127.0.0.1:0"\n[tls]\ninsecure = true\n[auth]\ntoken_file = "tokens"\n'
                    f'[audit]\ndb = "{tmp_path}/audit.db"\n')
    report = config_report(path)
    by_id = _by_id(report.results)
    assert by_id["config.file"].status == "FAIL" and "chmod 600" in by_id["config.file"].reason  # config check's word
    assert by_id["config.tokens"].status == "FAIL"
    assert by_id["config.grpc"].status == "PASS" and by_id["config.audit"].status == "PASS"
    assert report.config is not None and report.policy is not None


def test_a_file_that_does_not_parse_skips_the_items(tmp_path: Path) -> None:
    path = tmp_path / "callbox.toml"
    path.write_text("[doors.grpc]\nlisten = 5\n")
    report = config_report(path)
    assert report.results[0].status == "FAIL" and "doors.grpc.listen" in report.results[0].reason
    assert all(r.status == "SKIP" and r.reason == "skipped: the file does not load (config.file)"
               for r in report.results[1:])
    assert report.config is None
