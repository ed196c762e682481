"""A burst of creates from unmodified ``AsyncSandbox`` clients against the default server
configuration: one key's burst of 20 is served in full (beyond what the host starts at once,
creates wait in line instead of being refused; past the default per-client share of 16 live
sandboxes, a client alone is not held back), and another key's create, sent during the burst,
is not starved behind it (it takes the next free start slot: :mod:`harness.doors.start_queue`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import AsyncSandbox

from tests.interop.e2b_server import E2bServer, sdk_environment, serve_e2b

pytestmark = [pytest.mark.interop, pytest.mark.docker]

BURST = 20
"""Creates of one key at once: above the host's start slots (at least 4) and above the default
per-client share (16), which is work-conserving: no other client waits when it is passed."""


@pytest.fixture(scope="module")
def burst_server(engine: Any) -> Iterator[E2bServer]:
    with serve_e2b(engine) as server:  # no --max-per-client: the default share, as a user starts it
        yield server


async def _create(api_key: str) -> tuple[float, AsyncSandbox | BaseException]:
    started = time.monotonic()
    try:
        sandbox = await AsyncSandbox.create(timeout=120, api_key=api_key, allow_internet_access=False)
    except Exception as error:
        return time.monotonic() - started, error
    return time.monotonic() - started, sandbox


async def _burst(server: E2bServer) -> tuple[list[tuple[float, Any]], tuple[float, Any]]:
    alice = [asyncio.create_task(_create(server.keys["alice"])) for _ in range(BURST)]
    await asyncio.sleep(0)  # alice's creates are sent first
    bob = asyncio.create_task(_create(server.keys["bob"]))
    return list(await asyncio.gather(*alice)), await bob


async def _kill(results: list[tuple[float, Any]]) -> None:
    await asyncio.gather(*(s.kill() for _, s in results if isinstance(s, AsyncSandbox)), return_exceptions=True)


def test_one_keys_burst_is_served_and_another_key_is_not_starved(burst_server: E2bServer) -> None:
    async def run() -> None:
        alice, bob = await _burst(burst_server)
        try:
            refused = [str(s) for _, s in [*alice, bob] if not isinstance(s, AsyncSandbox)]
            assert not refused, f"{refused}\n{burst_server.log()}"
            # bob waited for one start at most, not behind alice's whole burst
            assert bob[0] < max(t for t, _ in alice), (bob[0], sorted(t for t, _ in alice))
        finally:
            await _kill([*alice, bob])

    with sdk_environment(burst_server):
        asyncio.run(run())
