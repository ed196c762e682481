"""The E2B door's sandbox domain: what a configured one may be, and what the door answers."""

from __future__ import annotations

import pytest

from harness.doors.e2b.domains import UNROUTABLE, checked_domain, sandbox_domain


@pytest.mark.parametrize(("given", "kept"), [
    ("sandboxes.example.com", "sandboxes.example.com"),
    ("E2B.Test:8443", "e2b.test:8443"),
    (" e2b.test ", "e2b.test"),
    ("internal", "internal"),
])
def test_a_domain_with_an_optional_port_is_kept(given: str, kept: str) -> None:
    assert checked_domain(given) == kept


@pytest.mark.parametrize(("given", "problem"), [
    ("https://e2b.test", "it is a URL, not a host name"),
    ("e2b.test/sandboxes", "is not a host name"),
    ("*.e2b.test", "is not a host name"),
    ("", "is not a host name"),
    ("127.0.0.1:8443", "an IP address cannot have subdomains"),
    ("[::1]:8443", "an IP address cannot have subdomains"),
    ("e2b_test.example", "is not a DNS name"),
    ("-e2b.test", "is not a DNS name"),
    ("e2b..test", "is not a DNS name"),
    ("e2b.test.", "is not a DNS name"),
    ("e2b.test:0", "'0' is not a TCP port"),
    ("e2b.test:443x", "is not a TCP port"),
])
def test_anything_else_is_refused_naming_the_form(given: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"PORT-SANDBOXID\.DOMAIN") as refused:
        checked_domain(given)
    assert problem in str(refused.value)


def test_the_answered_domain_is_the_configured_one_else_the_api_host_else_unroutable() -> None:
    assert sandbox_domain({"host": "api.e2b.test:8443"}, "sandboxes.example.com") == "sandboxes.example.com"
    assert sandbox_domain({"host": "api.e2b.test:8443"}, None) == "e2b.test:8443"
    assert sandbox_domain({"host": "127.0.0.1:8443"}, None) == UNROUTABLE
