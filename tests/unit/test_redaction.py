"""The redactor: every built-in secret kind is found, ordinary hashes, UUIDs and base64 are
not, secret env values and policy patterns are redacted, a bad pattern is a policy error,
findings say where but never what, and a stream split anywhere is redacted like the whole.

Test secrets are built from pieces at run time, so no real-looking token sits in the source.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import uuid

import pytest

from harness.core import redaction
from harness.core.policy import PolicyError, parse_policy
from harness.core.redaction import Finding, RedactionSettings, Redactor, redaction_summary, replacement

GITHUB = "ghp_" + "A1b2C3d4" * 4 + "E5f6"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\nVJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3S\n"


def pem(label: str, body: str = PEM_BODY) -> str:
    return f"-----BEGIN {label}-----\n{body}-----END {label}-----"


def jwt() -> str:
    def seg(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    signature = base64.urlsafe_b64encode(hashlib.sha256(b"sig").digest()).decode().rstrip("=")
    return f"{seg({'alg': 'HS256', 'typ': 'JWT'})}.{seg({'sub': '1234567890', 'name': 'x'})}.{signature}"


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"

POSITIVE: list[tuple[str, str, str]] = [
    # (kind, the secret, the text around it with {} where it goes)
    ("aws_access_key", "AKIA" + "IOSFODNN7EXAMPLE", "export AWS_ACCESS_KEY_ID={}\n"),
    ("aws_access_key", "ASIA" + "Y34FZKBOKMUTVV7A", '"AccessKeyId": "{}",'),
    ("aws_secret_key", AWS_SECRET, "aws_secret_access_key = {}\n"),
    ("aws_secret_key", AWS_SECRET, "AWS_SECRET_ACCESS_KEY={}"),
    ("aws_secret_key", AWS_SECRET, '{{"SecretAccessKey": "{}"}}'),
    ("google_api_key", "AIza" + "SyD-9tSrke72PouQMnMX" + "-a7eZSW0jkFMBWY", "key={}&q=1"),
    ("github_token", GITHUB, "token: {}"),
    ("github_token", "gho_" + "x" * 36, "{}"),
    ("github_token", "ghu_" + "Y" * 36, "({})"),
    ("github_token", "ghs_" + "1" * 36, "https://x-access-token:{}@github.com/o/r"),
    ("github_token", "ghr_" + "z9" * 18, "{}\n"),
    ("github_token", "github_pat_" + "11ABCDEFG0" + "a" * 12 + "_" + "b" * 59, "GH_TOKEN={}"),
    ("slack_token", "xoxb-" + "123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx", "Bearer {}"),
    ("slack_token", "xoxp-" + "1234567890-1234567890-1234567890-abcdef", "{}"),
    ("slack_token", "xapp-" + "1-A0123456789-1234567890123-abcdef0123", "{}"),
    ("slack_webhook", "T00000000/B00000000/" + "XXXXXXXXXXXXXXXXXXXXXXXX", "https://hooks.slack.com/services/{}"),
    ("private_key", pem("RSA PRIVATE KEY"), "key:\n{}\ndone"),
    ("private_key", pem("OPENSSH PRIVATE KEY"), "{}"),
    ("private_key", pem("EC PRIVATE KEY"), "{}"),
    ("private_key", pem("PRIVATE KEY"), "{}"),
    ("private_key", pem("ENCRYPTED PRIVATE KEY"), "{}"),
    ("private_key", pem("PGP PRIVATE KEY BLOCK", "\nlQOYBF0AAAABCAC7\n=abcd\n"), "{}"),
    ("private_key", pem("PRIVATE KEY", PEM_BODY.replace("\n", "\\n")).replace("\n", "\\n"),
     '{{"private_key": "{}\\n", "client_email": "a@b.iam"}}'),
    ("jwt", jwt(), "Authorization: Bearer {}\n"),
    ("jwt", jwt(), '{{"id_token":"{}"}}'),
]


@pytest.mark.parametrize(("kind", "secret", "around"), POSITIVE)
def test_each_builtin_kind_is_redacted(kind: str, secret: str, around: str) -> None:
    text = around.format(secret)
    redacted, findings = Redactor().redact(text)
    assert secret not in redacted
    assert redacted == around.format(replacement(kind))
    (finding,) = findings
    assert (finding.kind, finding.field) == (kind, "text")
    assert text[finding.start:finding.end] == secret
    assert finding.line == text.count("\n", 0, finding.start) + 1


def test_a_private_key_block_without_its_end_line_is_redacted_through_its_key_lines() -> None:
    text = ("$ head -3 id_rsa\n-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nMIIEpAIBAAKCAQEA7\n"
            "QC7VJT\n$ ls\n")
    redacted, (finding,) = Redactor().redact(text)
    assert redacted == "$ head -3 id_rsa\n[redacted: private_key]$ ls\n"
    assert "MIIE" not in redacted and finding.kind == "private_key"


NEGATIVE = [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b\nMerge: 1a2b3c4 5d6e7f8",
    hashlib.sha256(b"x").hexdigest() + "  file.tar.gz",
    "sha256:" + hashlib.sha256(b"image").hexdigest(),
    hashlib.sha512(b"x").hexdigest(),
    hashlib.sha1(b"AKIA").hexdigest().upper(),
    str(uuid.uuid4()) + " " + str(uuid.UUID(int=0)) + " " + str(uuid.uuid4()).upper(),
    base64.b64encode(random.Random(1).randbytes(600)).decode(),
    base64.urlsafe_b64encode(random.Random(2).randbytes(600)).decode(),
    base64.b64encode(json.dumps({"alg": "none", "payload": "a" * 40}).encode()).decode(),  # eyJ, but one segment
    "eyJhbGciOiJIUzI1NiJ9 is the header only; eyJ.a.b is too short",
    "XAKIAIOSFODNN7EXAMPLE and AKIAIOSFODNN7EXAMPLE1234 and akiaiosfodnn7example",
    "ghp_tooShort gho_ ghx_" + "a" * 36 + " github_pat_short",
    "xoxb-123 xoxz-1234567890-abcdef slack.com/services/T0",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa\n-----END CERTIFICATE-----",
    "aws_secret_access_key = <your secret here>\nsecret_access_key: short",
    "version 1.2.3.4567890123 at /usr/lib/python3.11/site-packages/eyJ/x.py",
    "AIzaShort and theAIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",  # glued to a word on its left
]


@pytest.mark.parametrize("text", NEGATIVE)
def test_ordinary_text_hashes_uuids_and_base64_are_left_alone(text: str) -> None:
    assert Redactor().redact(text) == (text, [])


def test_findings_never_carry_the_secret() -> None:
    secret_env = "s3cr3t-" + "value-" + "0123456789"
    text = f"{GITHUB} {jwt()} {secret_env} {pem('PRIVATE KEY')}"
    redacted, findings = Redactor(secrets=[("env:TOKEN", secret_env)]).redact(text)
    assert [f.kind for f in findings] == ["github_token", "jwt", "env:TOKEN", "private_key"]
    shown = json.dumps([f.to_dict() for f in findings]) + repr(findings)
    shown += json.dumps(redaction_summary(findings))
    for secret in (GITHUB, jwt(), secret_env, "MIIEvQIBADANBgkqhkiG9w0"):
        assert secret not in shown and secret not in redacted


def test_secret_env_values_from_the_harness_and_the_sandbox_env(caplog: pytest.LogCaptureFixture) -> None:
    settings = RedactionSettings(secret_env=("OPENAI_API_KEY", "SHORT", "MISSING", "DB_PASSWORD"))
    host = {"OPENAI_API_KEY": "sk-" + "proj-" + "abcdefghijkl", "SHORT": "abc1234", "OTHER": "not-a-secret-1"}
    sandbox = {"DB_PASSWORD": "hunter2-" + "hunter2", "OTHER": "also-not-secret"}
    with caplog.at_level(logging.WARNING, logger="callbox.policy"):
        redactor = Redactor.for_policy(settings, host, sandbox)
    text = f"a {host['OPENAI_API_KEY']} b {sandbox['DB_PASSWORD']} c abc1234 not-a-secret-1 also-not-secret"
    redacted, findings = redactor.redact(text)
    assert redacted == ("a [redacted: env:OPENAI_API_KEY] b [redacted: env:DB_PASSWORD] c abc1234 "
                        "not-a-secret-1 also-not-secret")
    assert [f.kind for f in findings] == ["env:OPENAI_API_KEY", "env:DB_PASSWORD"]
    assert "SHORT" in caplog.text and "shorter than 8" in caplog.text and "abc1234" not in caplog.text


def test_a_value_found_twice_and_overlapping_finds_are_each_one_redaction() -> None:
    value = "value-" + "of-a-secret"
    text = f"{value}{value} {GITHUB}"
    redacted, findings = Redactor(secrets=[("env:A", value), ("env:B", GITHUB)]).redact(text)
    assert redacted == "[redacted: env:A][redacted: env:A] [redacted: github_token]"  # the same span as env:B
    assert [(f.start, f.end) for f in findings] == [(0, len(value)), (len(value), 2 * len(value)),
                                                    (2 * len(value) + 1, len(text))]


def test_policy_patterns_and_their_secret_group() -> None:
    policy = parse_policy('[redaction]\npatterns = ["corp_[0-9a-f]{16}", "password=(?P<secret>\\\\S+)"]\n')
    redactor = Redactor.for_policy(policy.redaction, {}, {})
    redacted, findings = redactor.redact("id corp_0123456789abcdef\npassword=letmein ok")
    assert redacted == "id [redacted: pattern:0]\npassword=[redacted: pattern:1] ok"
    assert [(f.kind, f.line) for f in findings] == [("pattern:0", 1), ("pattern:1", 2)]


@pytest.mark.parametrize(("toml", "problem"), [
    ('patterns = ["ok", "a(b"]', "key 'redaction.patterns[1]': 'a(b' is not a valid regular expression"),
    ('patterns = ["x*"]', "key 'redaction.patterns[0]': 'x*' matches the empty string"),
    ('secret_env = ["NOT-A-NAME"]', "key 'redaction.secret_env[0]': 'NOT-A-NAME' is not an environment variable"),
    ("builtin_patterns = \"sometimes\"", "redaction.builtin_patterns"),
    ("patern = []", "unexpected key 'redaction.patern' (allowed: builtin_patterns, secret_env, patterns)"),
])
def test_a_bad_redaction_table_is_a_policy_error_naming_the_entry(toml: str, problem: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(f"[redaction]\n{toml}\n", source="policy file p.toml")
    assert problem in raised.value.message and raised.value.message.startswith("policy file p.toml")


def test_turning_the_builtin_patterns_off_is_a_loosening_and_turns_them_off() -> None:
    policy = parse_policy("[redaction]\nbuiltin_patterns = false\n")
    assert policy.loosened() == ["redaction.builtin_patterns = false: tool results keep cloud keys, tokens, "
                                 "private keys and JWTs (the default is true)"]
    redactor = Redactor.for_policy(policy.redaction, {}, {})
    assert not redactor.active
    assert redactor.redact(GITHUB) == (GITHUB, [])
    assert parse_policy("").loosened() == [] and Redactor.for_policy(parse_policy("").redaction, {}, {}).active


def test_structured_content_is_redacted_in_every_string_and_key() -> None:
    value = {"stdout": f"x {GITHUB}", "items": [1, None, {"token": jwt()}], GITHUB: True, "n": 3}
    redacted, findings = Redactor().redact_structured(value)
    assert redacted == {"stdout": "x [redacted: github_token]", "items": [1, None, {"token": "[redacted: jwt]"}],
                        "[redacted: github_token]": True, "n": 3}
    assert [(f.field, f.kind, f.start) for f in findings] == [
        ("structured.stdout", "github_token", 2), ("structured.items[2].token", "jwt", 0),
        ("structured key", "github_token", 0),
    ]


def test_the_summary_counts_every_finding_and_keeps_the_first_hundred() -> None:
    findings = [Finding("jwt", "text", i, i + 1, 1) for i in range(150)] + [Finding("env:X", "text", 200, 210, 2)]
    summary = redaction_summary(findings)
    assert (summary["count"], summary["kinds"], summary["findings_omitted"]) == (151, {"jwt": 150, "env:X": 1}, 51)
    assert len(summary["findings"]) == redaction.MAX_FINDINGS


# --- streams ------------------------------------------------------------------------------------


def _streamed(redactor: Redactor, data: bytes, sizes: random.Random | None = None,
              stream: str = "stdout") -> tuple[bytes, list[bytes]]:
    chunks: list[bytes] = []
    sink = redactor.stream(lambda name, chunk: chunks.append(chunk) if name == stream else None)
    i = 0
    while i < len(data):
        n = sizes.randint(1, 50) if sizes is not None else len(data)
        sink(stream, data[i:i + n])
        i += n
    sink.flush()
    return b"".join(chunks), chunks


def test_a_stream_split_anywhere_is_redacted_like_the_whole_text() -> None:
    value = "env-" + "secret-" + "42424242"
    redactor = Redactor(secrets=[("env:S", value)])
    text = "\n".join(f"{s}" if k == "private_key" else around.format(s) for k, s, around in POSITIVE)
    text += f"\nnot split: {value} ok \u00e9\u4e2d\n" + "\n".join(NEGATIVE) + "\nlast"
    whole, _ = redactor.redact(text)
    for seed in range(60):
        streamed, _ = _streamed(redactor, text.encode(), random.Random(seed))
        assert streamed.decode() == whole, seed


def test_a_stream_passes_ordinary_chunks_at_once_and_bytes_unchanged() -> None:
    chunks: list[bytes] = []
    sink = Redactor().stream(lambda _name, chunk: chunks.append(chunk))
    for chunk in (b"one", b"two\n", b"\xff\xfe binary \x00", b"progress 45%\r"):
        sink("stdout", chunk)
    assert chunks == [b"one", b"two\n", b"\xff\xfe binary \x00", b"progress 45%\r"]


def test_a_stream_holds_back_only_what_may_begin_a_secret() -> None:
    chunks: list[bytes] = []
    sink = Redactor().stream(lambda _name, chunk: chunks.append(chunk))
    sink("stdout", b"token: gh")
    sink("stdout", b"p_" + GITHUB[4:20].encode())
    assert b"".join(chunks) == b"token: "
    sink("stdout", GITHUB[20:].encode() + b" done")
    assert b"".join(chunks) == b"token: [redacted: github_token] done"


def test_a_private_key_never_streams_out_however_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "STREAM_MAX_PENDING", 200)
    body = "".join(f"{base64.b64encode(bytes([i]) * 48).decode()}\n" for i in range(40))
    text = f"before\n{pem('OPENSSH PRIVATE KEY', body)}\nafter\n"
    for seed in range(10):
        streamed, _ = _streamed(Redactor(), text.encode(), random.Random(seed))
        assert streamed == b"before\n[redacted: private_key]\nafter\n", seed


def test_streams_are_redacted_each_on_their_own() -> None:
    out: dict[str, list[bytes]] = {}
    sink = Redactor().stream(lambda name, chunk: out.setdefault(name, []).append(chunk))
    sink("stdout", GITHUB[:10].encode())
    sink("stderr", b"error: ")
    sink("stdout", GITHUB[10:].encode() + b"\n")
    sink.flush()
    assert b"".join(out["stdout"]) == b"[redacted: github_token]\n" and out["stderr"] == [b"error: "]


def test_the_readme_example_redacts_as_documented() -> None:
    from tests.doc_examples import block_with

    block = block_with("toml", "[redaction]", "DEPLOY_TOKEN").body
    policy = parse_policy(block)
    deploy = "dpl-7d1f00c2a9b84e6f"
    redactor = redaction.Redactor.for_policy(policy.redaction, {"DEPLOY_TOKEN": deploy, "OPENAI_API_KEY": "short"}, {})
    text, findings = redactor.redact(f"deploying with {deploy}; url?token=abcdefghijklmnopqrstuvwxyz0123 done")
    assert deploy not in text and "abcdefghijklmnopqrstuvwxyz0123" not in text
    assert text.endswith("url?token=[redacted: pattern:0] done"), text
    assert sorted(f.kind for f in findings) == ["env:DEPLOY_TOKEN", "pattern:0"]
    assert not any("redaction" in note for note in policy.loosened())  # builtin_patterns = true loosens nothing
