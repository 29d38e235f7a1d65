"""wait_awake: the waits that an error raised in their thread (a timeout, a stop) must end."""

import threading

import pytest

from michelangelo.uniflow.core.plugin import interrupt_thread, wait_awake


def test_it_returns_true_once_set_and_false_once_the_timeout_passes():
    event = threading.Event()
    assert wait_awake(event.wait, 0.3) is False
    threading.Timer(0.3, event.set).start()
    assert wait_awake(event.wait) is True


@pytest.mark.parametrize("kind", ["event", "condition"])
def test_an_error_raised_in_the_waiting_thread_ends_a_wait_without_timeout(kind):
    # Nothing ever sets the event or notifies the condition: only the raised error can end it.
    event, cond = threading.Event(), threading.Condition()
    started, ended = threading.Event(), []

    def waiter():
        try:
            started.set()
            if kind == "event":
                wait_awake(event.wait)
            else:
                with cond:
                    wait_awake(cond.wait)
        except TimeoutError as exc:
            ended.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert started.wait(10)
    assert interrupt_thread(thread.ident, TimeoutError)
    thread.join(10)
    assert not thread.is_alive(), "the error raised in the waiting thread did not end its wait"
    assert len(ended) == 1
    if kind == "condition":
        # The condition's lock was given back with the error.
        assert cond.acquire(timeout=1)
        cond.release()
