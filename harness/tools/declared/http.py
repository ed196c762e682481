"""``kind = "http"``: one HTTP request made from inside the sandbox, through its egress proxy.

Rendering (:func:`render_url`, :func:`render_query`, :func:`render_body`) is pure and follows
:mod:`harness.core.declared_http`: a path argument is percent-encoded inside its segment
(``../admin`` becomes ``..%2Fadmin``), a segment that would be exactly ``.`` or ``..`` or an
empty path argument is refused, an absent optional argument drops its query parameter or
body key.

The request is made in the sandbox by ``python3 -I -c RUNNER`` (argv form, no shell;
``-I``: no user site directory, no ``PYTHON*`` variables, nothing the model may have written
is imported), a stdlib ``urllib`` script that sends it through the proxy named in the
sandbox's ``HTTP_PROXY``, so the allowlist and the egress log apply to it. A sandbox without
a proxy (network ``none`` or ``open``) is an error result: the request is never sent around
the egress policy. Redirects are not followed (a ``3xx`` is the result, its ``Location``
shown), so a secret header never goes on to another host.

Secrets: a ``{ env = "VAR" }`` header's value never enters the sandbox. The policy gives
the sandbox's egress proxy the value as an optional secret for the URL's host
(:func:`harness.core.declared_http.implied_secrets`); the runner sends the sandbox's
placeholder in that header, and the proxy puts ``PREFIX`` and the value in its place. A
variable not set (when the call runs, or when the sandbox started) is an error result
naming it, and no request is made. Wherever the value or the placeholder appears in the
response (a server echoing the header), it is replaced by ``[redacted: env:VAR]`` before
the result leaves this handler; the session's redaction then applies as to every tool.

Results: ``HTTP STATUS REASON``, the selected response headers (:data:`SHOWN_HEADERS`) and
the body text; structured ``{status, headers, json}`` when the body is JSON, else
``{status, headers, body}``. A status of 400 or more is ``tool_failed``; a refusal by the
egress proxy says the host is not allowed; a timeout is ``timed_out``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import BaseModel

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool, Placeholder, parse_template
from harness.core.declared_http import SecretHeader, implied_secret_name, split_url
from harness.core.redaction import replacement
from harness.core.registry import Tool
from harness.engine.exec_result import ExecResult
from harness.tools.declared.running import definition_for, run_argv
from harness.tools.shell import NotRan, agent_failure, agent_output_cap

__all__ = ["RUNNER", "SHOWN_HEADERS", "RequestProblem", "http_tool", "render_body", "render_query", "render_url"]

SHOWN_HEADERS = ("content-type", "content-length", "location", "etag", "last-modified", "retry-after", "link")
"""Response headers the result shows (and ``x-ratelimit-*``); cookies and the rest are left out."""
_PROXY_LINE = "callbox egress proxy "
_STDERR_TAIL = 2000

RUNNER = r"""
import json, sys, urllib.error, urllib.request
spec = json.loads(sys.stdin.buffer.read())
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": spec["proxy"], "https": spec["proxy"]}), NoRedirect)
body = None if spec["body"] is None else spec["body"].encode("utf-8")
request = urllib.request.Request(spec["url"], data=body, method=spec["method"], headers=dict(spec["headers"]))
limit = spec["limit"]
def answer(response, status, reason):
    data = response.read(limit + 1)
    return {"ok": True, "status": status, "reason": reason, "headers": list(response.headers.items()),
            "body": data[:limit].decode("utf-8", "replace"), "truncated": len(data) > limit}
try:
    try:
        with opener.open(request, timeout=spec["timeout"]) as response:
            out = answer(response, response.status, response.reason)
    except urllib.error.HTTPError as exc:
        out = answer(exc, exc.code, str(exc.reason))
except urllib.error.URLError as exc:
    out = {"ok": False, "error": str(exc.reason), "timeout": isinstance(exc.reason, TimeoutError)}
except TimeoutError as exc:
    out = {"ok": False, "error": "timed out: %s" % exc, "timeout": True}
except Exception as exc:
    out = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc), "timeout": False}
sys.stdout.write(json.dumps(out, ensure_ascii=False))
"""


class RequestProblem(ValueError):
    """A call whose request cannot be built; ``code``: the result's error code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENTS) -> None:
        super().__init__(message)
        self.code = code


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill(text: str, values: Mapping[str, Any]) -> str | None:
    out: list[str] = []
    for part in parse_template(text):
        if isinstance(part, Placeholder):
            if values.get(part.name) is None:
                return None
            out.append(_text(values[part.name]))
        else:
            out.append(part)
    return "".join(out)


def render_url(url: str, values: Mapping[str, Any]) -> str:
    """``url`` with each path argument percent-encoded inside its segment (no query)."""
    parts = split_url(url)
    path: list[str] = []
    for part in parse_template(parts.path):
        if not isinstance(part, Placeholder):
            path.append(part)
            continue
        value = values.get(part.name)
        if value is None or _text(value) == "":
            raise RequestProblem(f"argument {part.name!r} fills a URL path segment and cannot be empty")
        path.append(quote(_text(value), safe=""))
    rendered = "".join(path)
    if any(segment in (".", "..") for segment in rendered.split("/")):
        raise RequestProblem(f"the URL path {rendered!r} has a '.' or '..' segment; give a name, not a relative path")
    return parts.origin + rendered


def render_query(query: Mapping[str, str], values: Mapping[str, Any]) -> str:
    """The query string (without ``?``; empty when no parameter is left)."""
    pairs: list[tuple[str, str]] = []
    for key, template in query.items():
        parts = parse_template(template)
        if len(parts) == 1 and isinstance(parts[0], Placeholder) and isinstance(values.get(parts[0].name), list):
            pairs.extend((key, _text(item)) for item in values[parts[0].name])
            continue
        filled = _fill(template, values)
        if filled is not None:
            pairs.append((key, filled))
    return urlencode(pairs, quote_via=quote)


_ABSENT = object()


def _json_value(template: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        parts = parse_template(template)
        if len(parts) == 1 and isinstance(parts[0], Placeholder):
            value = values.get(parts[0].name)
            return _ABSENT if value is None else value
        filled = _fill(template, values)
        return _ABSENT if filled is None else filled
    if isinstance(template, dict):
        out = {key: _json_value(item, values) for key, item in template.items()}
        return {key: item for key, item in out.items() if item is not _ABSENT}
    if isinstance(template, list):
        return [item for item in (_json_value(t, values) for t in template) if item is not _ABSENT]
    return template


def render_body(declared: DeclaredTool, values: Mapping[str, Any]) -> tuple[str, str] | None:
    """The request body and its content type, or None for no body."""
    body = declared.body
    if body is None:
        return None
    if body.text is not None:
        text = _fill(body.text, values)
        return None if text is None else (text, "text/plain; charset=utf-8")
    return json.dumps(_json_value(body.json_template, values), ensure_ascii=False), "application/json"


def _headers(declared: DeclaredTool, environ: Mapping[str, str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The request headers and the secret values in them (value -> redaction kind)."""
    headers: list[tuple[str, str]] = []
    secrets: dict[str, str] = {}
    for name, value in (declared.headers or {}).items():
        if isinstance(value, SecretHeader):
            secret = environ.get(value.env)
            if secret is None or secret == "":
                raise RequestProblem(f"header {name} takes its value from the environment variable {value.env} "
                                     "of the harness, which is not set; set it where callbox runs",
                                     ErrorCode.TOOL_FAILED)
            if any(c in secret for c in "\r\n\0"):
                raise RequestProblem(f"the environment variable {value.env} (header {name}) holds a line break "
                                     "or NUL; a header value is one line", ErrorCode.TOOL_FAILED)
            secrets[secret] = f"env:{value.env}"
            headers.append((name, value.prefix + secret))  # the placeholder replaces it: _placeholders
        else:
            headers.append((name, value))
    return headers, secrets


def _placeholders(declared: DeclaredTool, headers: list[tuple[str, str]], secrets: dict[str, str],
                  sandbox_env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``headers`` with each secret header holding the sandbox's placeholder instead of the
    value (the egress proxy puts the value back); each placeholder is added to ``secrets``."""
    out: list[tuple[str, str]] = []
    for name, text in headers:
        value = (declared.headers or {}).get(name)
        if not isinstance(value, SecretHeader):
            out.append((name, text))
            continue
        placeholder = sandbox_env.get(implied_secret_name(declared.name, name))
        if not placeholder:
            raise RequestProblem(f"header {name} takes its value from the environment variable {value.env} of the "
                                 "harness, which was not set when the sandbox started (or the sandbox was started "
                                 "without the policy's secrets); set it and start a new sandbox",
                                 ErrorCode.TOOL_FAILED)
        secrets[placeholder] = f"env:{value.env}"
        out.append((name, placeholder))
    return out


def _redact(value: Any, secrets: Mapping[str, str], count: list[int]) -> Any:
    """``value`` (text or JSON-like) with every secret value replaced; ``count[0]`` counts them."""
    if isinstance(value, str):
        for secret, kind in sorted(secrets.items(), key=lambda item: -len(item[0])):
            if secret in value:
                count[0] += value.count(secret)
                value = value.replace(secret, replacement(kind))
        return value
    if isinstance(value, dict):
        return {_redact(k, secrets, count): _redact(v, secrets, count) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(item, secrets, count) for item in value]
    return value


def http_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``kind = "http"`` table."""
    method = declared.method or "GET"
    argv = ("python3", "-I", "-c", RUNNER)

    def handler(ctx: ToolContext, args: BaseModel) -> ToolOutput:
        values = args.model_dump(mode="json")
        try:
            url = render_url(declared.url or "", values)
            query = render_query(declared.query or {}, values)
            headers, secrets = _headers(declared, os.environ)
        except RequestProblem as problem:
            return ToolOutput(text=str(problem), is_error=True, error=problem.code)
        body = render_body(declared, values)
        if body is not None and not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("Content-Type", body[1]))
        runtime = ctx.runtime()
        try:
            headers = _placeholders(declared, headers, secrets, runtime.env)
        except RequestProblem as problem:
            return ToolOutput(text=str(problem), is_error=True, error=problem.code)
        proxy = runtime.env.get("HTTP_PROXY")
        if not proxy:
            return ToolOutput(text=f"{declared.name} makes its request through the sandbox's egress proxy, and this "
                              'sandbox has none: run it with network = "allowlist" and its host in allow_hosts',
                              is_error=True, error=ErrorCode.TOOL_FAILED)
        seconds = ctx.timeout_for(declared.timeout_s)
        spec = {"method": method, "url": url + (f"?{query}" if query else ""), "headers": headers,
                "body": None if body is None else body[0], "proxy": proxy,
                "timeout": max(0.5, seconds - 0.5), "limit": agent_output_cap(ctx.output_budget) // 8}
        ran = run_argv(ctx, argv, env={"NO_PROXY": "", "no_proxy": ""}, timeout_s=declared.timeout_s,
                       stdin=json.dumps(spec).encode(), streamed=())
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        output = _output(method, url + (f"?{query}" if query else ""), ran.result)
        count = [0]
        text = _redact(output.text, secrets, count)
        structured = _redact(output.structured, secrets, count)
        if count[0]:
            structured = {**(structured or {}), "secrets_redacted": count[0]}
        return ToolOutput(text=text, is_error=output.is_error, error=output.error, structured=structured,
                          raw_bytes=output.raw_bytes)

    return Tool(definition_for(declared), handler)


def _shown(headers: list[list[str]]) -> dict[str, str]:
    shown: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in SHOWN_HEADERS or key.startswith("x-ratelimit-"):
            shown[key] = f"{shown[key]}, {value}" if key in shown else value
    return shown


def _output(method: str, url: str, result: ExecResult) -> ToolOutput:
    raw = result.stdout.total_bytes
    if result.timed_out:
        return ToolOutput(text=f"{method} {url} timed out after {int(result.duration_ms)} milliseconds",
                          is_error=True, error=ErrorCode.TIMED_OUT, raw_bytes=raw)
    envelope = _envelope(result)
    if envelope is None:
        tail = result.stderr.data().decode("utf-8", errors="replace").strip()[-_STDERR_TAIL:]
        why = ("the response was larger than the sandbox's output cap" if result.stdout.truncated
               else f"the request runner exited with code {result.shell_exit_code} without a result")
        return ToolOutput(text=f"{method} {url} failed: {why}" + (f"\nstderr:\n{tail}" if tail else ""),
                          is_error=True, error=ErrorCode.TOOL_FAILED, raw_bytes=raw)
    if not envelope.get("ok"):
        error = str(envelope.get("error"))
        if error.startswith("Tunnel connection failed: 403"):
            error = "the egress proxy refused the connection: the host is not in this sandbox's allowlist " \
                    "(sandbox.allow_hosts)"
        code = ErrorCode.TIMED_OUT if envelope.get("timeout") else ErrorCode.TOOL_FAILED
        return ToolOutput(text=f"{method} {url} failed: {error}", is_error=True, error=code,
                          structured={"error": error}, raw_bytes=raw)
    status = int(envelope["status"])
    body = str(envelope.get("body") or "")
    headers = _shown(envelope.get("headers") or [])
    if status in (403, 502) and body.startswith(_PROXY_LINE):
        line = body.strip().splitlines()[0]
        allowed = " the host is not allowed: list it in sandbox.allow_hosts." if status == 403 else ""
        return ToolOutput(text=f"{method} {url} was not sent: {line}.{allowed}", is_error=True,
                          error=ErrorCode.TOOL_FAILED, structured={"status": status, "refused_by_proxy": True},
                          raw_bytes=raw)
    structured: dict[str, Any] = {"status": status, "headers": headers}
    parsed: Any = None
    if "json" in headers.get("content-type", "") and not envelope.get("truncated"):
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
    if parsed is not None:
        structured["json"] = parsed
    else:
        structured["body"] = body
    if envelope.get("truncated"):
        structured["truncated"] = True
    lines = [f"HTTP {status} {envelope.get('reason') or ''}".rstrip(), *(f"{k}: {v}" for k, v in headers.items())]
    text = "\n".join(lines) + ("\n\n" + body if body else "")
    failed = status >= 400
    return ToolOutput(text=text, is_error=failed, error=ErrorCode.TOOL_FAILED if failed else None,
                      structured=structured, raw_bytes=raw)


def _envelope(result: ExecResult) -> dict[str, Any] | None:
    if result.stdout.truncated or result.exit_code != 0:
        return None
    try:
        envelope = json.loads(result.stdout.data())
    except ValueError:
        return None
    return envelope if isinstance(envelope, dict) else None
