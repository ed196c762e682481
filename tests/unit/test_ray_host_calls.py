"""How the harness asks a node's host: a method that only reads, or that may be asked twice
(destroy), waits out a host that is restarting; any other is never repeated (its outcome is
unknown, and reported so)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.engine.ray import hosts
from harness.engine.ray.hosts import Host, HostRestarting, ask


class _Method:
    def __init__(self, name: str, log: list[tuple[str, tuple[Any, ...]]]) -> None:
        self.name, self.log = name, log

    def remote(self, *args: Any) -> tuple[str, tuple[Any, ...]]:
        self.log.append((self.name, args))
        return (self.name, args)


class _Handle:
    """Stands for an actor handle: records each method submitted."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(name, self.submitted)


def _host() -> Host:
    return Host(node_id="n" * 56, address="10.0.0.2", capacity=4, handle=_Handle())


def _restarting_for(attempts: int, answer: Any) -> Any:
    """A ``call`` that finds the host restarting ``attempts`` times, then answers."""
    seen = {"n": 0}

    def fake_call(ref: Any, *, timeout: float, node: str) -> Any:
        seen["n"] += 1
        if seen["n"] <= attempts:
            raise HostRestarting(f"the host of node {node} is unavailable")
        return answer

    return fake_call


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "RESTART_POLL_S", 0.001)


def test_a_read_waits_out_a_restarting_host(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _host()
    monkeypatch.setattr(hosts, "call", _restarting_for(3, "the info"))
    assert ask(host, "info") == "the info"
    assert host.handle.submitted == [("info", ())] * 4


def test_a_change_is_never_asked_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _host()
    monkeypatch.setattr(hosts, "call", _restarting_for(1, None))
    with pytest.raises(HostRestarting, match="unavailable"):
        ask(host, "remove", "sb-1")
    assert host.handle.submitted == [("remove", ("sb-1",))]


def test_a_destroy_waits_out_a_restarting_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second destroy finds nothing left and is no error: a restart never fails a destroy."""
    host = _host()
    monkeypatch.setattr(hosts, "call", _restarting_for(2, None))
    assert ask(host, "destroy", "sb-1", None) is None
    assert host.handle.submitted == [("destroy", ("sb-1", None))] * 3


def test_a_read_stops_waiting_when_the_node_is_declared_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _host()
    calls = {"n": 0}

    def dies_meanwhile(ref: Any, *, timeout: float, node: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            host.alive = False  # the node watcher saw the node die
        raise HostRestarting("unavailable")

    monkeypatch.setattr(hosts, "call", dies_meanwhile)
    with pytest.raises(HostRestarting):
        ask(host, "stats", "sb-1")
    assert calls["n"] == 2


def test_a_read_waits_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "RESTART_WAIT_S", 0.05)
    host = _host()
    monkeypatch.setattr(hosts, "call", _restarting_for(10**9, None))
    with pytest.raises(HostRestarting):
        ask(host, "list_sandboxes", False)
    assert 1 < len(host.handle.submitted) < 10**9


def test_every_read_is_a_host_method() -> None:
    from harness.engine.ray.host import SandboxHost

    assert all(callable(getattr(SandboxHost, name, None)) for name in hosts.READS)
    assert all(callable(getattr(SandboxHost, name, None)) for name in hosts.REPEATABLE)
    assert not hosts.REPEATABLE & {"create", "remove", "keep", "pause", "resume", "snapshot", "fork",
                              "restore", "image_begin", "image_chunk", "image_finish", "gc", "close", "drain"}
