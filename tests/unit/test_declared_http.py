"""``kind = "http"`` declared tools: the model, load errors, URL, query and body rendering."""

from __future__ import annotations

import json

import pytest

from harness.core.calls import ErrorCode
from harness.core.declared_http import split_url
from harness.core.policy import Policy
from harness.tools import registry_for
from harness.tools.declared.http import RequestProblem, render_body, render_query, render_url
from tests.support.declared_policies import load, problem

SANDBOX = '[sandbox]\nnetwork = "allowlist"\nallow_hosts = ["api.example.com:443"]\n'
ISSUES = """
[[tool]]
name = "create_issue"
kind = "http"
method = "POST"
url = "https://api.example.com/repos/{owner}/{repo}/issues"
headers = { Accept = "application/json", Authorization = { env = "GITHUB_TOKEN", prefix = "Bearer " } }
query = { state = "{state}", per_page = "50" }
body = { json = { title = "{title}", labels = "{labels}", meta = { by = "callbox {owner}" } } }
[tool.arguments.owner]
required = true
[tool.arguments.repo]
required = true
[tool.arguments.title]
required = true
[tool.arguments.state]
enum = ["open", "closed"]
[tool.arguments.labels]
type = "array"
"""


def test_an_http_tool_loads_and_is_registered_with_its_arguments() -> None:
    policy = load(SANDBOX + ISSUES)
    [declared] = policy.tool
    assert declared.method == "POST" and declared.body is not None
    tool = registry_for(policy).get("create_issue")
    assert tool is not None
    schema = tool.definition.input_model.model_json_schema()
    assert set(schema["properties"]) == {"owner", "repo", "title", "state", "labels"}
    assert "GITHUB_TOKEN" not in json.dumps(schema)  # the secret header is no argument
    assert "POST https://api.example.com/repos/{owner}/{repo}/issues" in tool.definition.description


@pytest.mark.parametrize(("value", "encoded"), [
    ("../admin", "..%2Fadmin"),
    ("a/b", "a%2Fb"),
    ("x?admin=1", "x%3Fadmin%3D1"),
    ("x#frag", "x%23frag"),
    ("100%", "100%25"),
    ("café ☕", "caf%C3%A9%20%E2%98%95"),
    ("a b+c", "a%20b%2Bc"),
])
def test_a_path_argument_is_encoded_inside_its_segment(value: str, encoded: str) -> None:
    url = render_url("https://api.example.com/repos/{owner}/x", {"owner": value})
    assert url == f"https://api.example.com/repos/{encoded}/x"
    assert split_url(url).path.count("/") == 3  # no segment was added


@pytest.mark.parametrize("value", ["..", ".", ""])
def test_a_path_argument_that_would_be_a_relative_or_empty_segment_is_refused(value: str) -> None:
    with pytest.raises(RequestProblem) as info:
        render_url("https://api.example.com/repos/{owner}/x", {"owner": value})
    assert info.value.code is ErrorCode.INVALID_ARGUMENTS


def test_query_parameters_are_encoded_and_omitted_when_their_argument_is_absent() -> None:
    query = {"state": "{state}", "per_page": "50", "q": "is:{kind} x", "label": "{labels}"}
    assert render_query(query, {"state": None, "kind": "a&b=c", "labels": ["x", "y z"]}) == \
        "per_page=50&q=is%3Aa%26b%3Dc%20x&label=x&label=y%20z"
    assert render_query(query, {"state": "open", "kind": None, "labels": None}) == "state=open&per_page=50"


def test_the_json_body_keeps_argument_types_and_drops_absent_optional_ones() -> None:
    [declared] = load(SANDBOX + ISSUES).tool
    body = render_body(declared, {"owner": "o", "repo": "r", "title": "t \"1\"", "state": None, "labels": None})
    assert body is not None
    text, content_type = body
    assert content_type == "application/json"
    assert json.loads(text) == {"title": 't "1"', "meta": {"by": "callbox o"}}
    body = render_body(declared, {"owner": "o", "repo": "r", "title": "t", "state": None, "labels": ["a"]})
    assert body is not None and json.loads(body[0])["labels"] == ["a"]


def test_a_text_body_is_the_argument_as_it_is() -> None:
    [declared] = load(SANDBOX + '[[tool]]\nname = "put"\nkind = "http"\nmethod = "PUT"\n'
                      'url = "https://api.example.com/notes"\nbody = { text = "{note}" }\n'
                      '[tool.arguments.note]\nrequired = true\n').tool
    text = "line 1\n{x} ünïcode"
    assert render_body(declared, {"note": text}) == (text, "text/plain; charset=utf-8")


def tool(extra: str, url: str = "https://api.example.com/x") -> str:
    return SANDBOX + f'[[tool]]\nname = "t"\nkind = "http"\nurl = "{url}"\n{extra}\n'


@pytest.mark.parametrize(("text", "expected"), [
    (tool("", url="https://{host}/x"), "the scheme and host must be literal"),
    (tool("", url="https://api.{domain}.com/x"), "the scheme and host must be literal"),
    (tool("", url="ftp://api.example.com/x"), 'is not "http(s)://HOST[:PORT]/PATH"'),
    (tool("", url="https://api.example.com/x?y={y}"), "put query parameters in [tool.query]"),
    (tool("", url="https://api.example.com/x#top"), "a fragment is never sent"),
    (tool("", url="https://api.example.com/{owner}"), "uses {owner}, which is not an argument"),
    (tool('query = { q = "{q}" }'), "key 'tool[0]': query.q uses {q}, which is not an argument"),
    (tool("[tool.arguments.a]\nrequired = true"), "argument 'a' is used nowhere: put {a} in url, query or body"),
    (tool("[tool.arguments.a]", url="https://api.example.com/{a}"), "must be given: set required = true"),
    (tool('[tool.arguments.a]\ntype = "array"\nrequired = true', url="https://api.example.com/{a}"),
     "cannot fill a path segment"),
    (tool('body = { json = { a = "{a}" } }\n[tool.arguments.a]\nrequired = true'),
     'a GET request has no body; set method = "POST"'),
    (tool('method = "POST"\nbody = { text = "x {a}" }\n[tool.arguments.a]\nrequired = true'),
     'body.text must be exactly "{ARG}"'),
    (tool('method = "POST"\nbody = { json = {}, text = "{a}" }\n[tool.arguments.a]\nrequired = true'),
     "body takes exactly one of json"),
    (tool('headers = { Authorization = "Bearer {token}" }'), "header values are literal, never arguments"),
    (tool('headers = { Host = "evil.example" }'), "headers.Host: callbox sets this header itself"),
    (tool('headers = { Proxy-Authorization = "x" }'), "callbox sets this header itself"),
    (tool('headers = { "Bad Name" = "x" }'), "is not a header name"),
    (tool('headers = { X = { env = "1BAD" } }'), "is not an environment variable name"),
    (tool('headers = { X = { variable = "TOKEN" } }'), "variable"),
    (tool('env = { A = "b" }'), "an http tool starts no program of its own"),
    (tool('argv = ["curl"]'), "key 'argv' is for kind = \"command\" tools"),
    (tool('method = "TRACE"'), "tool[0].method"),
    (tool("timeout = 3"), "timeout"),
])
def test_load_errors_name_the_key_and_the_fix(text: str, expected: str) -> None:
    assert expected in problem(text)


def test_the_sandbox_must_be_in_allowlist_mode() -> None:
    for network in ("none", "open"):
        message = problem(f'[sandbox]\nnetwork = "{network}"\n' + ISSUES)
        assert "key 'tool[0].url'" in message and f'it is "{network}"' in message
        assert 'allow_hosts = ["api.example.com:443"]' in message


@pytest.mark.parametrize("hosts", ['["api.example.com:8443"]', '["other.example.com"]', '["*.example.org"]'])
def test_the_tool_host_must_be_in_the_allowlist(hosts: str) -> None:
    message = problem(f'[sandbox]\nnetwork = "allowlist"\nallow_hosts = {hosts}\n' + ISSUES)
    assert "key 'sandbox.allow_hosts'" in message
    assert 'add "api.example.com:443" to sandbox.allow_hosts' in message


@pytest.mark.parametrize("hosts", ['["api.example.com"]', '["*.example.com:443"]', '["API.example.com.:443"]'])
def test_an_allowlist_entry_covering_the_host_is_enough(hosts: str) -> None:
    registry_for(load(f'[sandbox]\nnetwork = "allowlist"\nallow_hosts = {hosts}\n' + ISSUES))


def test_a_port_in_the_url_is_checked_against_the_allowlist() -> None:
    text = tool("", url="http://dest.callbox.test:8080/echo").replace("api.example.com:443", "dest.callbox.test:8080")
    registry_for(load(text))
    assert "dest.callbox.test:8080" in problem(text.replace("dest.callbox.test:8080\"]", "dest.callbox.test\"]"))


def test_an_http_tool_round_trips_through_json() -> None:
    # A paused run's checkpoint keeps its policy as JSON and rebuilds it from there.
    policy = load(SANDBOX + ISSUES)
    again = Policy.model_validate(policy.model_dump(mode="json"))
    assert again.tool == policy.tool


def test_the_readme_http_example_loads_as_documented() -> None:
    from tests.doc_examples import block_with

    block = block_with("toml", 'kind = "http"', 'name = "create_issue"').body
    policy = load("\n".join(line.removeprefix("  ") for line in block.splitlines()))
    tool = registry_for(policy).get("create_issue")
    assert tool is not None
    assert set(tool.definition.input_schema("plain")["required"]) == {"owner", "repo", "title"}
    [declared] = policy.tool
    assert render_url(declared.url or "", {"owner": "me", "repo": "x/y"}) == \
        "https://api.github.com/repos/me/x%2Fy/issues"
    assert "allow_hosts" in problem("\n".join(line.removeprefix("  ") for line in block.splitlines()
                                              if "allow_hosts" not in line and "network" not in line))
