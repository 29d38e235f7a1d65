"""The ledger of room that concurrent branches book on a shared Ray cluster (no Ray needed)."""

from __future__ import annotations

import threading

import pytest

from michelangelo.uniflow.core._timeout import interrupt_thread
from michelangelo.uniflow.plugins.ray._capacity._bookings import Ledger
from michelangelo.uniflow.plugins.ray._capacity._shapes import ClusterShape, NodeShape

GIB = 1024.0 ** 3


def _two_cpu_ledger() -> Ledger:
    return Ledger(ClusterShape((NodeShape("worker", {"CPU": 2.0, "memory": 2.0 * GIB}),),
                               "declared"))


def test_a_branch_waits_for_room_and_books_it_once_the_holder_ends():
    ledger = _two_cpu_ledger()
    said: list[str] = []
    waiting, booked, release = threading.Event(), threading.Event(), threading.Event()

    def announce(message: str) -> None:
        said.append(message)
        waiting.set()

    def second() -> None:
        with ledger.hold("002-fit", 2, {"CPU": 1.0}, announce):
            booked.set()
            release.wait(30)

    with ledger.hold("001-fit", 2, {"CPU": 1.0}, said.append):
        assert ledger.free() == [{"CPU": 0.0, "memory": 2.0 * GIB}]
        waiter = threading.Thread(target=second, daemon=True)
        waiter.start()
        assert waiting.wait(30)  # it says once why it waits, and what holds the room
        assert not booked.is_set()
    assert booked.wait(30)
    assert said[0].startswith("002-fit waits for room on the shared Ray cluster")
    assert "held by 001-fit" in said[0]
    assert said[1] == "002-fit has room on the shared Ray cluster now; dispatching"
    assert ledger.free() == [{"CPU": 0.0, "memory": 2.0 * GIB}]
    release.set()
    waiter.join(30)
    assert ledger.free() == [{"CPU": 2.0, "memory": 2.0 * GIB}]


def _start_waiter(ledger: Ledger, name: str, announce) -> tuple[threading.Thread, list]:
    """A thread whose hold as ``name`` must end in an error before its block runs; the
    returned list gets that error."""
    raised: list[BaseException] = []

    def hold() -> None:
        try:
            with ledger.hold(name, 2, {"CPU": 1.0}, announce):
                raise AssertionError("the block must not run")
        except BaseException as error:  # noqa: BLE001 - the test reads what ended the hold
            raised.append(error)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread, raised


def test_a_ctrl_c_as_the_room_is_announced_gives_the_booking_back():
    """An error raised in a branch (its task's timeout, a run's stop) can land on any line:
    here, as the waiter says that it has room. Its booking is made by then; it must not
    outlive the hold, or every later fit waits for room that nobody holds."""
    ledger = _two_cpu_ledger()
    waiting = threading.Event()

    def announce(message: str) -> None:
        waiting.set()
        if "has room" in message:
            raise KeyboardInterrupt

    with ledger.hold("001-fit", 2, {"CPU": 1.0}, lambda message: None):
        waiter, raised = _start_waiter(ledger, "002-fit", announce)
        assert waiting.wait(30)  # it waits for room
    waiter.join(30)
    assert not waiter.is_alive()
    assert [type(e) for e in raised] == [KeyboardInterrupt]
    assert ledger.free() == [{"CPU": 2.0, "memory": 2.0 * GIB}]
    # ... so the next branch books at once, without waiting.
    said: list[str] = []
    with ledger.hold("003-fit", 2, {"CPU": 1.0}, said.append):
        assert said == []


@pytest.mark.parametrize(("name", "error"), [
    # A task's timeout reaches a branch thread as an error raised in it (interrupt_thread),
    # which Python raises only once the thread runs again: a branch waiting for room must
    # wake by itself, not only when the holder ends.
    ("002-fit", TimeoutError),
    # Two holds can share a name: a task that runs two fits in threads of its own (with its
    # context copied into them) books both under its call id. The second one, stopped while
    # it waits, must not give back the room that the first one still holds.
    ("001-fit", KeyboardInterrupt),
], ids=["a-timeout-ends-the-wait", "a-stopped-hold-of-the-same-name"])
def test_an_error_raised_in_a_waiting_branch_ends_its_wait_and_only_its_hold(name, error):
    ledger = _two_cpu_ledger()
    waiting = threading.Event()
    with ledger.hold("001-fit", 2, {"CPU": 1.0}, lambda message: None):
        waiter, raised = _start_waiter(ledger, name, lambda message: waiting.set())
        assert waiting.wait(30)
        assert interrupt_thread(waiter.ident, error)  # what a timeout or a stop does
        waiter.join(30)
        assert not waiter.is_alive(), "the waiter still waits for room while it is held"
        assert [type(e) for e in raised] == [error]
        assert ledger.free() == [{"CPU": 0.0, "memory": 2.0 * GIB}]  # only 001-fit's booking
    assert ledger.free() == [{"CPU": 2.0, "memory": 2.0 * GIB}]
