"""The host's start line (harness.doors.start_queue) and the doors' work-conserving shares
(QuotaKeeper.enter with a capacity): a client alone is never held back, a burst waits in line
instead of being refused, another client's create is not starved behind a burst, and a wait
past its bound is a refusal naming the bound."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from harness.doors.quota_ledger import QuotaExceeded, QuotaKeeper
from harness.doors.quotas import Quotas
from harness.doors.start_queue import StartQueue, default_slots

WAIT_S = 10.0
"""How long a test waits for the line to reach a state (an event with a deadline)."""


class Starter:
    """A create in its own thread: it takes a slot, records its admission, and holds the slot
    until ``finish`` is set."""

    def __init__(self, queue: StartQueue, client: str, admitted: list[str]) -> None:
        self.queue = queue
        self.client = client
        self.finish = threading.Event()
        self.entered = threading.Event()
        self.error: BaseException | None = None
        self._admitted = admitted
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.queue.slot(self.client, door="e2b"):
                self._admitted.append(self.client)
                self.entered.set()
                self.finish.wait(WAIT_S)
        except BaseException as error:
            self.error = error


@contextlib.contextmanager
def starters() -> Iterator[list[Starter]]:
    made: list[Starter] = []
    try:
        yield made
    finally:
        for starter in made:
            starter.finish.set()
        for starter in made:
            starter.thread.join(WAIT_S)


def test_a_client_alone_uses_every_slot_and_the_rest_wait_instead_of_being_refused() -> None:
    queue = StartQueue(lambda: 2)
    admitted: list[str] = []
    with starters() as made:
        made.extend(Starter(queue, "alice", admitted) for _ in range(5))
        assert queue.wait_until(lambda q: q.starting("alice") == 2 and q.waiting("alice") == 3, WAIT_S)
        for starter in made:
            starter.finish.set()
        for starter in made:
            starter.thread.join(WAIT_S)
    assert admitted == ["alice"] * 5 and all(s.error is None for s in made)
    assert queue.starting() == 0 and queue.waiting() == 0


def test_another_clients_create_is_served_next_not_behind_the_whole_burst() -> None:
    queue = StartQueue(lambda: 1)
    admitted: list[str] = []
    with starters() as made:
        made.append(Starter(queue, "alice", admitted))
        assert queue.wait_until(lambda q: q.starting("alice") == 1, WAIT_S)
        made.extend(Starter(queue, "alice", admitted) for _ in range(3))
        assert queue.wait_until(lambda q: q.waiting("alice") == 3, WAIT_S)
        made.append(Starter(queue, "bob", admitted))
        assert queue.wait_until(lambda q: q.waiting("bob") == 1, WAIT_S)
        made[0].finish.set()  # alice's first start ends: the slot goes to bob, who waited least long
        assert made[-1].entered.wait(WAIT_S)
        assert admitted == ["alice", "bob"] and queue.waiting("alice") == 3


def test_a_client_past_its_share_alone_is_never_held_back() -> None:
    queue = StartQueue(lambda: 2, over_share=lambda client, starting: True)
    admitted: list[str] = []
    with starters() as made:
        made.extend(Starter(queue, "alice", admitted) for _ in range(4))
        assert queue.wait_until(lambda q: q.starting("alice") == 2 and q.waiting("alice") == 2, WAIT_S)
        made[0].finish.set()
        made[1].finish.set()  # both slots free up: with nobody else waiting, alice takes them again
        assert made[2].entered.wait(WAIT_S) and made[3].entered.wait(WAIT_S)
    assert admitted == ["alice"] * 4 and all(s.error is None for s in made)


def test_a_client_past_its_share_waits_behind_a_client_within_its_share() -> None:
    over = {"alice"}
    asked: list[tuple[str, int]] = []

    def over_share(client: str, starting: int) -> bool:
        asked.append((client, starting))
        return client in over

    queue = StartQueue(lambda: 2, over_share=over_share)
    admitted: list[str] = []
    with starters() as made:
        made.append(Starter(queue, "bob", admitted))
        made.append(Starter(queue, "carol", admitted))
        assert queue.wait_until(lambda q: q.starting() == 2, WAIT_S)
        alice = Starter(queue, "alice", admitted)
        made.append(alice)
        assert queue.wait_until(lambda q: q.waiting("alice") == 1, WAIT_S)
        bob = Starter(queue, "bob", admitted)
        made.append(bob)
        assert queue.wait_until(lambda q: q.waiting("bob") == 1, WAIT_S)
        # carol's start ends: alice starts nothing now and came first, but she is past her
        # share and bob is within his, so the slot is bob's; alice waits.
        made[1].finish.set()
        assert bob.entered.wait(WAIT_S)
        assert admitted[2:] == ["bob"] and queue.waiting("alice") == 1
        # Nobody within a share waits any more: the next free slot is alice's.
        made[0].finish.set()
        assert alice.entered.wait(WAIT_S)
    assert admitted[2:] == ["bob", "alice"]
    assert ("alice", 0) in asked  # the share is judged with the client's starts in progress


def test_a_wait_past_its_bound_is_refused_naming_the_slots_and_the_bound() -> None:
    queue = StartQueue(lambda: 1, max_wait_s=0.2)
    admitted: list[str] = []
    with starters() as made:
        made.append(Starter(queue, "alice", admitted))
        assert queue.wait_until(lambda q: q.starting() == 1, WAIT_S)
        with pytest.raises(QuotaExceeded) as refused, queue.slot("bob", door="grpc"):
            pass
    error = refused.value
    assert error.quota == "start_queue" and error.retryable and error.retry_after >= 1
    assert "starts at most 1 sandboxes at once" in error.message and "bound of 0.2 s" in error.message
    assert queue.waiting() == 0


def test_a_create_whose_client_left_leaves_the_line() -> None:
    queue = StartQueue(lambda: 1)
    gone = threading.Event()
    admitted: list[str] = []
    with starters() as made:
        made.append(Starter(queue, "alice", admitted))
        assert queue.wait_until(lambda q: q.starting() == 1, WAIT_S)
        outcome: list[BaseException] = []

        def leave_later() -> None:
            try:
                with queue.slot("bob", door="e2b", still_wanted=lambda: not gone.is_set()):
                    pass
            except QuotaExceeded as error:
                outcome.append(error)

        waiter = threading.Thread(target=leave_later, daemon=True)
        waiter.start()
        assert queue.wait_until(lambda q: q.waiting("bob") == 1, WAIT_S)
        gone.set()
        waiter.join(WAIT_S)
        assert len(outcome) == 1 and queue.waiting() == 0


def test_default_slots_are_at_least_four() -> None:
    assert default_slots() >= 4


def test_a_client_past_its_share_is_served_while_the_door_keeps_a_share_free() -> None:
    keeper = QuotaKeeper()
    for _ in range(12):  # a share of 4, a door of 16 threads: alice alone may hold 12
        keeper.enter("alice", door="e2b", share=4, capacity=16)
    with pytest.raises(QuotaExceeded) as refused:
        keeper.enter("alice", door="e2b", share=4, capacity=16)
    assert refused.value.quota == "concurrent_calls"
    for _ in range(4):  # the share kept free is bob's
        keeper.enter("bob", door="e2b", share=4, capacity=16)
    keeper.leave("alice", door="e2b")
    with pytest.raises(QuotaExceeded):  # the door is full: alice is past her share
        keeper.enter("alice", door="e2b", share=4, capacity=16)


def test_a_concurrent_calls_quota_stays_a_hard_limit() -> None:
    keeper = QuotaKeeper(lambda _client: Quotas(concurrent_calls=2))
    keeper.enter("alice", door="e2b", share=4, capacity=64)
    keeper.enter("alice", door="e2b", share=4, capacity=64)
    with pytest.raises(QuotaExceeded) as refused:
        keeper.enter("alice", door="e2b", share=4, capacity=64)
    assert refused.value.limit == 2
