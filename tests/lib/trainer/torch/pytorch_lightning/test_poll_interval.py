"""While a fit runs, Ray Train's controller polls fast unless the user chose an interval."""

from __future__ import annotations

import os
import threading

from michelangelo.lib.trainer.torch.pytorch_lightning._poll_interval import (
    ENV_VAR,
    fast_polling,
)


def test_set_during_the_fit_and_removed_after(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with fast_polling():
        assert os.environ[ENV_VAR] == "0.25"
    assert ENV_VAR not in os.environ


def test_removed_after_a_failed_fit(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    try:
        with fast_polling():
            raise RuntimeError("worker failed")
    except RuntimeError:
        pass
    assert ENV_VAR not in os.environ


def test_the_users_own_interval_is_kept(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "5")
    with fast_polling():
        assert os.environ[ENV_VAR] == "5"
    assert os.environ[ENV_VAR] == "5"


def test_concurrent_fits_share_it_until_the_last_ends(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    first_in, first_may_leave = threading.Event(), threading.Event()
    seen = {}

    def first():
        with fast_polling():
            first_in.set()
            first_may_leave.wait(10)
        seen["after_first"] = os.environ.get(ENV_VAR)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with fast_polling():
        pass
    seen["after_second"] = os.environ.get(ENV_VAR)  # the first fit is still running
    first_may_leave.set()
    thread.join(10)
    assert seen == {"after_second": "0.25", "after_first": None}
    assert ENV_VAR not in os.environ
