"""Whether a sandbox created through the E2B door gets public ports: the creator's
``allowPublicTraffic`` (E2B's default: public) within the policy's ``sandbox.public_ports``."""

from __future__ import annotations

from typing import Any

import pytest

from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.rest_models import public_ports


@pytest.mark.parametrize(("network", "allowed", "public", "noted"), [
    (None, True, True, False),  # E2B's default, where the policy allows it
    ({}, True, True, False),
    ({"allowPublicTraffic": True}, True, True, False),
    ({"allowPublicTraffic": False}, True, False, False),  # the creator keeps them private
    (None, False, False, False),  # not asked for: the owner only, nothing to say
    ({"allowPublicTraffic": False}, False, False, False),
    ({"allowPublicTraffic": True}, False, False, True),  # asked for and not given: said so
])
def test_the_creator_narrows_what_the_policy_allows(network: dict[str, Any] | None, allowed: bool, public: bool,
                                                    noted: bool) -> None:
    body: dict[str, Any] = {} if network is None else {"network": network}
    got, note = public_ports(body, allowed)
    assert got is public
    assert (note is not None) is noted
    if note:
        assert "sandbox.public_ports" in note


def test_a_value_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(E2bError, match="allowPublicTraffic must be true or false"):
        public_ports({"network": {"allowPublicTraffic": "yes"}}, True)
