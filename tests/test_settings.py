"""The SDK's environment settings: one parser per kind, and a bad value refused when a run
starts, before any task (and so any cluster or worker) does."""

from __future__ import annotations

import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.settings import (
    DRIVER_READ_MAX_BYTES,
    DRIVER_WRITE_MAX_BYTES,
    TRAINER_INMEMORY,
    TRAINER_INMEMORY_MAX_BYTES,
    ByteSetting,
    check_environment,
)
from michelangelo.uniflow.core.errors import UserError

NAME = "MA_TEST_SETTING_BYTES"


@pytest.mark.parametrize("raw, expected", [
    ("2000000000", 2_000_000_000), ("2e9", 2_000_000_000), ("0", 0),
    ("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("500M", 500_000_000), (" 64Mi ", 64 * 2**20),
    ("", None), ("  ", None),
])
def test_byte_counts_take_numbers_and_the_quantities_a_ray_task_takes(monkeypatch, raw,
                                                                     expected):
    monkeypatch.setenv(NAME, raw)
    assert ByteSetting(NAME, fix="unset it.").read() == expected


def test_an_unset_byte_count_is_its_default(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert ByteSetting(NAME, fix="unset it.").read() is None
    assert ByteSetting(NAME, fix="unset it.", default=7).read() == 7
    monkeypatch.setenv(NAME, " ")
    assert ByteSetting(NAME, fix="unset it.", default=7).read() == 7
    monkeypatch.setenv(NAME, "0")
    assert ByteSetting(NAME, fix="unset it.", default=7).read() == 0
    assert DRIVER_READ_MAX_BYTES.default == 32 * 2**20


@pytest.mark.parametrize("raw", ["-1", "two gigs", "8GB", "2 Gi B", "1e"])
def test_a_bad_byte_count_names_the_variable_the_value_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError) as info:
        ByteSetting(NAME, fix="set it to 2Gi.").read()
    assert str(info.value) == f"{NAME}={raw!r} is not a byte count. Fix: set it to 2Gi."


def test_a_choice_takes_its_aliases_and_refuses_the_rest(monkeypatch):
    monkeypatch.setenv(TRAINER_INMEMORY.name, " Yes ")
    assert TRAINER_INMEMORY.read() == "1"
    monkeypatch.setenv(TRAINER_INMEMORY.name, "")
    assert TRAINER_INMEMORY.read() == "auto"
    monkeypatch.setenv(TRAINER_INMEMORY.name, "sometimes")
    with pytest.raises(ValueError, match=r"MA_TRAINER_INMEMORY='sometimes' is not a valid "
                                         r"setting. Fix: set it to 'auto'"):
        TRAINER_INMEMORY.read()


@pytest.mark.parametrize("setting, bad", [
    (DRIVER_READ_MAX_BYTES, "lots"), (DRIVER_WRITE_MAX_BYTES, "-3"),
    (TRAINER_INMEMORY, "maybe"), (TRAINER_INMEMORY_MAX_BYTES, "2 gigs"),
])
def test_a_run_refuses_a_bad_setting_before_any_task_starts(monkeypatch, tmp_path, setting,
                                                            bad):
    ran = []

    @uniflow.task()
    def touch():
        ran.append(1)

    @uniflow.workflow()
    def flow():
        touch()

    monkeypatch.setenv(setting.name, bad)
    with pytest.raises(ValueError):
        check_environment()
    with pytest.raises(UserError) as info:
        uniflow.Context(storage_url=str(tmp_path)).run(flow)
    assert f"{setting.name}={bad!r}" in str(info.value) and "Fix:" in str(info.value)
    assert ran == []
    monkeypatch.setenv(setting.name, {"maybe": "auto"}.get(bad, "2Gi"))
    check_environment()
    uniflow.Context(storage_url=str(tmp_path)).run(flow)
    assert ran == [1]


def test_the_settings_set_here_are_what_a_remote_job_is_given(monkeypatch):
    from michelangelo.settings import set_in_environment

    for setting in (DRIVER_READ_MAX_BYTES, DRIVER_WRITE_MAX_BYTES, TRAINER_INMEMORY,
                    TRAINER_INMEMORY_MAX_BYTES):
        monkeypatch.delenv(setting.name, raising=False)
    assert set_in_environment() == {}
    monkeypatch.setenv(TRAINER_INMEMORY.name, "0")
    monkeypatch.setenv(TRAINER_INMEMORY_MAX_BYTES.name, " ")  # blank: unset
    monkeypatch.setenv("MA_SOMETHING_ELSE", "1")  # not a declared setting
    assert set_in_environment() == {TRAINER_INMEMORY.name: "0"}
