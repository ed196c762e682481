"""Secrets out of tool results, before the model, a door or the audit store sees them.

A :class:`Redactor` is built once per session (:meth:`Redactor.for_policy`) from the
policy's ``[redaction]`` table (:class:`RedactionSettings`) and replaces every secret it
finds with ``[redacted: KIND]``:

* the built-in token formats (on unless ``builtin_patterns = false``, a loosening that is
  logged): ``aws_access_key`` (``AKIA``/``ASIA`` key ids), ``aws_secret_key`` (the 40
  characters after ``aws_secret_access_key =``, ``AWS_SECRET_ACCESS_KEY=``,
  ``"SecretAccessKey": ...``), ``google_api_key`` (``AIza...``), ``github_token``
  (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), ``slack_token``
  (``xoxa-``/``xoxb-``/``xoxp-``/``xoxr-``/``xoxs-``/``xoxo-``, ``xapp-``),
  ``slack_webhook`` (the path of a ``hooks.slack.com`` URL), ``private_key`` (a whole PEM
  or PGP private key block, ``-----BEGIN ... PRIVATE KEY-----`` to its ``END`` line; a
  block with no END line is redacted through the key lines that follow it), ``jwt``
  (three base64url segments whose header starts ``eyJ``). A token must not be glued to a
  letter or digit on its left, nor run on into its own alphabet on its right, so hex
  digests, git SHAs, UUIDs and base64 blobs are left alone.
* ``env:NAME``: the value of each variable named in ``secret_env``, read from the harness
  process's environment when the session starts, and from the sandbox's own ``env`` (the
  spec's) under the same name. Values shorter than 8 characters are ignored (with a
  warning naming the variable, never the value): they would match ordinary words.
* ``secret:NAME`` and ``secret:NAME:placeholder``: the value of each ``[[secret]]`` (and each
  declared http tool's secret header), read when the session starts, and the placeholder
  the sandbox holds for it, known once the sandbox starts (:meth:`Redactor.add_literals`).
* ``pattern:N``: the ``N``-th regular expression of ``patterns`` (from 0). The whole match
  is redacted, or only its group named ``secret`` when it has one. A pattern that does
  not compile, or that matches the empty string, is a policy error naming the entry.

Overlapping finds merge into one redaction named after the first. Each find is a
:class:`Finding`: its kind, the field (``text``, or ``structured.KEY[INDEX]...`` for a
string inside the structured content), character offsets ``start``/``end`` into that
field's text as the tool produced it (for ``text``: after terminal control codes are
removed, before the output budget cuts head and tail) and the 1-based ``line`` of
``start``. A finding never holds the secret.

Streams (:class:`StreamRedactor`, for the chunks a tool emits while it runs). Each stream
(stdout, stderr) is redacted on its own. A chunk goes out at once, redacted, except for
its end when that could be the beginning of a secret the next chunk completes: a token
prefix (``gh``, ``eyJ``, ``AKIA``, ...) or a token in progress, an ``aws_secret_access_key``
keyword on the unfinished line, a BEGIN line of a private key, the start of a secret env
value, and, when the policy has its own patterns, the whole unfinished line. That end is
held back until more output shows what it is (at most :data:`STREAM_HOLD` characters of
it), or until the tool returns. So:

* guaranteed, however the chunks split the output: every built-in token and every secret
  env value at most :data:`STREAM_HOLD` characters long is redacted, when it begins a
  line or follows a character other than a letter or digit (as tokens do); a private
  key block never streams out, however long: from its BEGIN line on nothing but
  ``[redacted: private_key]`` is released until its END line has passed (a block still
  open after :data:`STREAM_MAX_PENDING` characters is swallowed up to its END line);
  a policy pattern is redacted when its match lies within one line of at most
  :data:`STREAM_HOLD` characters;
* not guaranteed: a secret longer than :data:`STREAM_HOLD`, a policy pattern match that
  spans lines, a secret that terminal control codes break up (the result's text has
  them removed before it is redacted; the stream passes them on);
* the cost: a held end comes out with the next chunk (or when the tool returns), so the
  live view can lag by a few characters, and stdout and stderr pieces by as much.

The result's own text and structured content are redacted in full, whatever the stream
did: the stream is the live view, the result is the record.
"""

from __future__ import annotations

import codecs
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = [
    "BUILTIN_KINDS",
    "MAX_FINDINGS",
    "MIN_SECRET_LENGTH",
    "STREAM_HOLD",
    "STREAM_MAX_PENDING",
    "Finding",
    "RedactionSettings",
    "Redactor",
    "StreamRedactor",
    "redaction_summary",
    "replacement",
]

log = logging.getLogger("callbox.policy")

MIN_SECRET_LENGTH = 8
"""Secret env values shorter than this are not redacted (they would match ordinary text)."""
MAX_FINDINGS = 100
"""Findings kept per result in ``meta["redactions"]`` (the count covers them all)."""
STREAM_HOLD = 4096
"""Characters of an unfinished line a stream holds back, so a secret split across chunks is whole."""
STREAM_MAX_PENDING = 1 << 20
"""Characters a stream holds at most while it waits for a line, or a private key block, to end."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def replacement(kind: str) -> str:
    """The text that stands in for a secret of ``kind``."""
    return f"[redacted: {kind}]"


# --- the policy's [redaction] table --------------------------------------------------------------


def _check_pattern(pattern: str) -> str:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.fullmatch("") is not None:
        raise ValueError(f"{pattern!r} matches the empty string; a redaction pattern must match some text")
    return pattern


def _check_env_name(name: str) -> str:
    if _ENV_NAME.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not an environment variable name")
    return name


class RedactionSettings(BaseModel):
    """``[redaction]``: which secrets are taken out of every tool result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    builtin_patterns: bool = True
    """Redact the built-in token formats (cloud keys, GitHub and Slack tokens, private key
    blocks, JWTs); ``false`` loosens a hardened default and is logged."""
    secret_env: tuple[Annotated[str, AfterValidator(_check_env_name)], ...] = ()
    """Names of environment variables whose values are redacted: the harness's own (read when
    a session starts) and the sandbox's ``env`` entries of the same name. Values shorter than
    8 characters are ignored."""
    patterns: tuple[Annotated[str, AfterValidator(_check_pattern)], ...] = ()
    """Python regular expressions whose matches are redacted (only the group named ``secret``,
    if the pattern has one); kind ``pattern:N``."""


# --- finding secrets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """Where a secret was taken out; never the secret itself."""

    kind: str
    """``github_token``, ``env:NAME``, ``pattern:0``, ..."""
    field: str
    """``text``, or the path of a string in the structured content (``structured.stdout``)."""
    start: int
    """Character offset of the secret in that field as the tool produced it."""
    end: int
    """Character offset just past the secret."""
    line: int
    """1-based line of ``start``."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "field": self.field, "start": self.start, "end": self.end, "line": self.line}


class _Span(NamedTuple):
    start: int
    end: int
    kind: str
    open: bool = False
    """A private key block whose END line was not (yet) seen."""


@dataclass(frozen=True)
class _Pattern:
    kind: str
    regex: re.Pattern[str]
    group: int | str = 0
    left_edge: bool = False
    """The character before a match must not be a letter or digit."""


def _builtin(kind: str, pattern: str, *, group: int | str = 0, left_edge: bool = True) -> _Pattern:
    return _Pattern(kind, re.compile(pattern), group, left_edge)


# Each pattern starts with a literal, so the regex engine skips to its candidates quickly;
# a leading alternation or look-behind would make it try every position (10x slower).
_AFTER_AWS_KEYWORD = r"""["']?[ \t]*[:=][ \t]*["']?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"""
BUILTIN: tuple[_Pattern, ...] = (
    _builtin("aws_access_key", r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"),
    _builtin("aws_secret_key", r"ecret[_-]?[Aa]ccess[_-]?[Kk]ey" + _AFTER_AWS_KEYWORD, group="secret", left_edge=False),
    _builtin("aws_secret_key", r"ECRET[_-]?ACCESS[_-]?KEY" + _AFTER_AWS_KEYWORD, group="secret", left_edge=False),
    _builtin("google_api_key", r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
    _builtin("github_token", r"gh[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])"),
    _builtin("github_token", r"github_pat_[A-Za-z0-9_]{22,244}(?![A-Za-z0-9_])"),
    _builtin("slack_token", r"(?:xox[aboprs]|xapp)-[A-Za-z0-9-]{10,250}(?![A-Za-z0-9-])"),
    _builtin("slack_webhook", r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/-]{8,})",
             group="secret", left_edge=False),
    _builtin("jwt", r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*(?![A-Za-z0-9_=-])"),
)
BUILTIN_KINDS: tuple[str, ...] = (*dict.fromkeys(p.kind for p in BUILTIN), "private_key")
"""The kinds of the built-in patterns."""

# How the built-in secrets begin, for a stream to hold back a chunk's end that may be one's
# start: the literal prefixes of the tokens above, the keywords of the AWS secret key and
# the BEGIN of a private key block.
_TOKEN_STARTS = (
    "AKIA", "ASIA", "AIza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xoxa-", "xoxb-", "xoxo-",
    "xoxp-", "xoxr-", "xoxs-", "xapp-", "eyJ", "hooks.slack.com/", "-----BEGIN ",
    "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", "SecretAccessKey", "secretAccessKey", "secret_access_key",
    "SECRET_ACCESS_KEY", "secret-access-key",
)
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./+=")
_AWS_KEYWORD = re.compile(r"(?:ecret[_-]?[Aa]ccess[_-]?[Kk]ey|ECRET[_-]?ACCESS[_-]?KEY|-----BEGIN )")
_KEY_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# What follows a BEGIN line whose END line is missing: lines of base64 or of PEM headers
# (``Proc-Type: 4,ENCRYPTED``), also with ``\n`` written as two characters (a key in JSON).
_KEY_BODY = re.compile(
    r"(?:(?:\r?\n|\\r?\\n)(?:[A-Za-z][A-Za-z-]*: [^\r\n\\]*|[A-Za-z0-9+/=]+)(?=[\r\n\\]|$))*(?:\r?\n|\\n)?"
)


def _private_keys(text: str) -> list[_Span]:
    spans: list[_Span] = []
    pos = 0
    while (begin := _KEY_BEGIN.search(text, pos)) is not None:
        end = _KEY_END.search(text, begin.end())
        if end is not None:
            spans.append(_Span(begin.start(), end.end(), "private_key"))
        else:
            body = _KEY_BODY.match(text, begin.end())
            spans.append(_Span(begin.start(), body.end() if body else begin.end(), "private_key", open=True))
        pos = spans[-1].end
    return spans


def _left_edge_ok(text: str, start: int, after: str = "") -> bool:
    """Whether ``start`` follows no ASCII letter or digit (``after``: the character before ``text``)."""
    before = text[start - 1] if start > 0 else after
    return not (before.isascii() and before.isalnum())


def _merged(spans: list[_Span]) -> list[_Span]:
    """Sorted, without overlaps: overlapping spans become one, named after the first."""
    if len(spans) < 2:
        return spans
    spans.sort(key=lambda s: (s.start, -s.end))
    out = [spans[0]]
    for span in spans[1:]:
        last = out[-1]
        if span.start < last.end:
            if span.end > last.end:
                out[-1] = _Span(last.start, span.end, last.kind, span.open)
        else:
            out.append(span)
    return out


def _apply(text: str, spans: Iterable[_Span]) -> str:
    parts: list[str] = []
    pos = 0
    for span in spans:
        parts.append(text[pos:span.start])
        parts.append(replacement(span.kind))
        pos = span.end
    parts.append(text[pos:])
    return "".join(parts)


class Redactor:
    """The compiled secrets of one session; ``redact`` is safe to call from any thread."""

    def __init__(
        self,
        *,
        builtin_patterns: bool = True,
        secrets: Iterable[tuple[str, str]] = (),
        patterns: Iterable[str] = (),
    ) -> None:
        """``secrets`` are ``(kind, value)`` pairs (``("env:NAME", value)``) of literal values
        to redact (values shorter than :data:`MIN_SECRET_LENGTH` are skipped); ``patterns``
        are the policy's regexes, ``builtin_patterns`` the built-in token formats."""
        compiled = [re.compile(p) for p in patterns]
        self._patterns: tuple[_Pattern, ...] = (BUILTIN if builtin_patterns else ()) + tuple(
            _Pattern(f"pattern:{i}", regex, "secret" if "secret" in regex.groupindex else 0)
            for i, regex in enumerate(compiled)
        )
        self._keys = builtin_patterns
        literals: dict[str, str] = {}
        for kind, value in secrets:
            if len(value) >= MIN_SECRET_LENGTH and value not in literals:
                literals[value] = kind
        # Longest first, so a value that contains another is named by its own kind.
        self._literals = tuple(sorted(literals.items(), key=lambda item: -len(item[0])))

    @classmethod
    def for_policy(
        cls, settings: RedactionSettings, host_env: Mapping[str, str], sandbox_env: Mapping[str, str]
    ) -> Redactor:
        """The redactor of a session: ``settings`` from its policy, the values of
        ``secret_env`` from ``host_env`` (the harness's ``os.environ``) and ``sandbox_env``
        (the sandbox spec's ``env``)."""
        secrets: list[tuple[str, str]] = []
        for name in settings.secret_env:
            for where, env in (("the harness environment", host_env), ("sandbox.env", sandbox_env)):
                value = env.get(name)
                if value is None:
                    continue
                if len(value) < MIN_SECRET_LENGTH:
                    log.warning("redaction.secret_env: %s in %s is shorter than %d characters and is not redacted",
                                name, where, MIN_SECRET_LENGTH)
                    continue
                secrets.append((f"env:{name}", value))
        return cls(builtin_patterns=settings.builtin_patterns, secrets=secrets, patterns=settings.patterns)

    def add_literals(self, secrets: Iterable[tuple[str, str]]) -> None:
        """Also redact these ``(kind, value)`` pairs from now on (a sandbox's secrets and
        their placeholders, known once it starts); the tuple is replaced whole, so a
        ``redact`` running meanwhile sees the old or the new list."""
        literals = dict(self._literals)
        for kind, value in secrets:
            if len(value) >= MIN_SECRET_LENGTH and value not in literals:
                literals[value] = kind
        self._literals = tuple(sorted(literals.items(), key=lambda item: -len(item[0])))

    @property
    def builtin(self) -> bool:
        """Whether the built-in token formats are redacted."""
        return self._keys

    @property
    def has_own_patterns(self) -> bool:
        """Whether the policy added patterns of its own."""
        return any(p.kind.startswith("pattern:") for p in self._patterns)

    @property
    def literal_values(self) -> tuple[str, ...]:
        """The secret values redacted wherever they appear."""
        return tuple(value for value, _kind in self._literals)

    @property
    def active(self) -> bool:
        """Whether there is anything to redact at all."""
        return bool(self._patterns or self._literals)

    def spans(self, text: str, after: str = "") -> list[_Span]:
        """Where the secrets in ``text`` are: sorted, merged where they overlap. ``after`` is
        the character before ``text``, if any (a token must not follow a letter or digit)."""
        spans: list[_Span] = []
        for pattern in self._patterns:
            for match in pattern.regex.finditer(text):
                start, end = match.span(pattern.group)
                if start == end or start < 0:
                    continue
                if pattern.left_edge and not _left_edge_ok(text, match.start(), after):
                    continue
                spans.append(_Span(start, end, pattern.kind))
        for value, kind in self._literals:
            pos = text.find(value)
            while pos >= 0:
                spans.append(_Span(pos, pos + len(value), kind))
                pos = text.find(value, pos + len(value))
        if self._keys and "PRIVATE KEY" in text:
            spans.extend(_private_keys(text))
        return _merged(spans)

    def redact(self, text: str, field: str = "text") -> tuple[str, list[Finding]]:
        """``text`` with its secrets replaced, and where they were (offsets into ``text``)."""
        spans = self.spans(text)
        if not spans:
            return text, []
        findings: list[Finding] = []
        line, counted = 1, 0
        for span in spans:
            line += text.count("\n", counted, span.start)
            counted = span.start
            findings.append(Finding(span.kind, field, span.start, span.end, line))
        return _apply(text, spans), findings

    def redact_structured(self, value: Any, field: str = "structured") -> tuple[Any, list[Finding]]:
        """A copy of a JSON-like value with secrets replaced in every string (keys too)."""
        findings: list[Finding] = []
        return self._walk(value, field, findings), findings

    def _walk(self, value: Any, path: str, findings: list[Finding]) -> Any:
        if isinstance(value, str):
            text, found = self.redact(value, path)
            findings.extend(found)
            return text
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                name = key
                if isinstance(key, str):
                    name, found = self.redact(key, f"{path} key")
                    findings.extend(found)
                out[name] = self._walk(item, f"{path}.{name}", findings)
            return out
        if isinstance(value, list | tuple):
            items = [self._walk(item, f"{path}[{i}]", findings) for i, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    def stream(self, sink: Callable[[str, bytes], None]) -> StreamRedactor:
        """A sink that redacts each stream of output chunks before ``sink`` sees them."""
        return StreamRedactor(self, sink)


def redaction_summary(findings: list[Finding]) -> dict[str, Any]:
    """What a result's ``meta["redactions"]`` says: how many, of which kinds, and where (the
    first :data:`MAX_FINDINGS`)."""
    kinds: dict[str, int] = {}
    for finding in findings:
        kinds[finding.kind] = kinds.get(finding.kind, 0) + 1
    summary: dict[str, Any] = {
        "count": len(findings), "kinds": kinds, "findings": [f.to_dict() for f in findings[:MAX_FINDINGS]],
    }
    if len(findings) > MAX_FINDINGS:
        summary["findings_omitted"] = len(findings) - MAX_FINDINGS
    return summary


# --- streams --------------------------------------------------------------------------------------


class _StreamState:
    def __init__(self) -> None:
        # surrogateescape: bytes that are not UTF-8 pass through unchanged.
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.pending = ""
        self.before = ""
        """The last character released: what a secret at the start of ``pending`` follows."""
        self.in_key = False
        """Inside a private key block whose BEGIN line went out as its replacement."""


class StreamRedactor:
    """An output sink that redacts what it passes on (see the module's notes on streams);
    ``flush`` releases what it still holds, once the tool has returned."""

    def __init__(self, redactor: Redactor, sink: Callable[[str, bytes], None]) -> None:
        self._redactor = redactor
        self._sink = sink
        self._streams: dict[str, _StreamState] = {}
        self._lock = threading.Lock()

    def __call__(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            state = self._streams.setdefault(stream, _StreamState())
            out = self._release(state, state.pending + state.decoder.decode(chunk), final=False)
        if out:
            self._sink(stream, out.encode("utf-8", "surrogateescape"))

    def flush(self) -> None:
        """Release everything held (redacted), as at the end of each stream."""
        with self._lock:
            released = [(name, self._release(state, state.pending + state.decoder.decode(b"", final=True),
                                             final=True)) for name, state in self._streams.items()]
        for name, out in released:
            if out:
                self._sink(name, out.encode("utf-8", "surrogateescape"))

    def _release(self, state: _StreamState, text: str, *, final: bool) -> str:
        """The part of ``text`` that can go out now, redacted; the rest stays pending."""
        if state.in_key:
            end = _KEY_END.search(text)
            if end is None:  # still inside the key: nothing goes out; keep what may start END
                state.pending = "" if final else text[-64:]
                return ""
            state.in_key = False
            text = text[end.end():]
        out = self._cut(state, text, self._redactor.spans(text, after=state.before), final=final)
        if out:
            state.before = out[-1]
        return out

    def _cut(self, state: _StreamState, text: str, spans: list[_Span], *, final: bool) -> str:
        cut = len(text) if final else self._held_from(text)
        too_long = len(text) > STREAM_MAX_PENDING
        for span in spans:
            if span.open and not final:
                if not too_long:
                    cut = min(cut, span.start)  # wait for its END line
                    break
                # Too long to wait for: say it once, then swallow the block up to its END line.
                state.in_key = True
                state.pending = ""
                return _apply(text[:span.start], (s for s in spans if s.end <= span.start)) + replacement(span.kind)
            if span.start < cut < span.end:
                # Hold the secret back until it is whole; past the limit, take it as it is.
                cut = span.end if too_long else span.start
                break
        state.pending = text[cut:]
        return _apply(text[:cut], (s for s in spans if s.end <= cut))

    def _held_from(self, text: str) -> int:
        """Where the end of ``text`` that could begin a secret starts (``len(text)``: none)."""
        size = len(text)
        floor = max(0, size - STREAM_HOLD)
        held = size
        line = max(text.rfind("\n") + 1, floor)
        if self._redactor.has_own_patterns:
            return line
        if self._redactor.builtin:
            run = size
            while run > floor and text[run - 1] in _TOKEN_CHARS:
                run -= 1
            for start in _TOKEN_STARTS:
                found = text.find(start, run)  # a token in progress
                while found >= 0 and not _left_edge_ok(text, found):
                    found = text.find(start, found + 1)
                if found >= 0:
                    held = min(held, found)
                for k in range(1, min(len(start), size - floor + 1)):  # a token's first characters
                    if text.endswith(start[:k]) and _left_edge_ok(text, size - k):
                        held = min(held, size - k)
            keyword = _AWS_KEYWORD.search(text, line)
            if keyword is not None:
                held = min(held, keyword.start())
        for value in self._redactor.literal_values:  # the first characters of a secret value
            found = text.find(value[0], max(floor, size - len(value) + 1))
            while found >= 0 and not value.startswith(text[found:]):
                found = text.find(value[0], found + 1)
            if found >= 0:
                held = min(held, found)
        return max(held, floor)
