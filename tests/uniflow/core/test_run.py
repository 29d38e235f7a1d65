"""Persistence, resume and cache."""

import pandas as pd
import pytest
import torch

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage

CALLS: list[str] = []


def _ctx(**kwargs):
    return uniflow.Context(reporter=Reporter(), **kwargs)


@uniflow.task()
def make_frame(n: int) -> pd.DataFrame:
    CALLS.append("make_frame")
    return pd.DataFrame({"x": range(n)})


@uniflow.task()
def make_tensor(df: pd.DataFrame) -> torch.Tensor:
    CALLS.append("make_tensor")
    return torch.tensor(df["x"].to_numpy(), dtype=torch.float32)


@uniflow.task()
def fail_once(t: torch.Tensor, marker: str) -> float:
    import os

    CALLS.append("fail_once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first run fails")
    return float(t.sum())


@uniflow.workflow()
def pipeline(n: int, marker: str) -> float:
    return fail_once(make_tensor(make_frame(n)), marker)


def test_resume_reuses_succeeded_tasks_and_says_so(tmp_path):
    CALLS.clear()
    marker = str(tmp_path / "marker")
    first = _ctx()
    with pytest.raises(RuntimeError, match="first run fails"):
        first.run(pipeline, 10, marker)
    assert CALLS == ["make_frame", "make_tensor", "fail_once"]

    CALLS.clear()
    second = _ctx(resume=first.last_run_id)
    assert second.run(pipeline, 10, marker) == 45.0
    assert CALLS == ["fail_once"]
    store = RunStore(Storage())
    states = {t.call_id: (t.state, t.source_run) for t in store.load_tasks(second.last_run_id)}
    assert states["001-make_frame"] == (TaskState.REUSED, first.last_run_id)
    assert states["002-make_tensor"] == (TaskState.REUSED, first.last_run_id)
    assert states["003-fail_once"][0] == TaskState.SUCCEEDED
    assert store.load_run(second.last_run_id).resumed_from == first.last_run_id


def test_resume_reruns_tasks_whose_inputs_changed(tmp_path):
    CALLS.clear()
    marker = str(tmp_path / "marker")
    first = _ctx()
    with pytest.raises(RuntimeError):
        first.run(pipeline, 10, marker)
    CALLS.clear()
    assert _ctx(resume=first.last_run_id).run(pipeline, 11, marker) == 55.0
    assert CALLS == ["make_frame", "make_tensor", "fail_once"]


def test_resume_of_unknown_run_is_a_clear_error():
    with pytest.raises(uniflow.RunNotFoundError, match="nope"):
        _ctx(resume="nope").run(pipeline, 1, "x")


def test_cache_is_opt_in_and_keyed_on_inputs_and_version():
    runs = []

    @uniflow.task(cache=True, cache_version="1")
    def square(x: int) -> int:
        runs.append(x)
        return x * x

    assert _ctx().run(square, 3) == 9
    assert _ctx().run(square, 3) == 9
    assert _ctx().run(square, 4) == 16
    assert runs == [3, 4]
    assert _ctx().run(square.with_overrides(cache_version="2"), 3) == 9
    assert runs == [3, 4, 3]


def test_a_crashed_write_leaves_nothing_a_resume_would_trust(tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot persist")

    @uniflow.task()
    def produce() -> object:
        return Unpicklable()

    ctx = _ctx()
    with pytest.raises(RuntimeError, match="cannot persist"):
        ctx.run(produce)
    store = RunStore(Storage())
    record = store.load_tasks(ctx.last_run_id)[0]
    assert record.state == TaskState.FAILED and record.output is None
    call_dir = store.call_dir(ctx.last_run_id, record.call_id)
    leftovers = [n for n in store.storage.listdir(call_dir) if n.startswith("output")]
    assert leftovers == []


def test_task_output_is_kept_with_the_run():
    @uniflow.task()
    def chatty() -> int:
        print("hello from the task body")
        return 1

    ctx = _ctx()
    ctx.run(chatty)
    store = RunStore(Storage())
    text = store.storage.read_bytes(store.log_path(ctx.last_run_id, "001-chatty", 1)).decode()
    assert "hello from the task body" in text


def test_values_round_trip_through_every_builtin_io():
    from michelangelo.uniflow.core._io import io_for

    storage = Storage()
    values = [
        {"a": [1, 2.5, None, "x"]},
        pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}),
        torch.arange(6).reshape(2, 3),
        {"w": torch.ones(2)},
        {1, 2, 3},
    ]
    for i, value in enumerate(values):
        io = io_for(value)
        folder = storage.join("io", str(i))
        storage.makedirs(folder)
        meta = io.write(value, storage, folder)
        back = io.read(storage, folder, meta)
        assert meta["fingerprint"] == io.fingerprint(value) or io.name == "pickle"
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(back, value)
        elif isinstance(value, torch.Tensor):
            assert torch.equal(back, value)
        elif isinstance(value, dict) and io.name == "torch":
            assert torch.equal(back["w"], value["w"])
        else:
            assert back == value


def test_storage_works_on_any_fsspec_url(monkeypatch):
    monkeypatch.setenv("UF_STORAGE_URL", "memory://uniflow-test")
    ctx = _ctx()
    assert ctx.run(make_frame, 3).shape == (3, 1)
    store = RunStore(Storage())
    assert store.storage.url == "memory://uniflow-test"
    assert store.load_tasks(ctx.last_run_id)[0].state == TaskState.SUCCEEDED


def test_task_states_follow_one_lifecycle():
    pending, running = TaskState.PENDING, TaskState.RUNNING
    assert {s for s in TaskState if pending.can_become(s)} == {
        running, TaskState.CACHED, TaskState.REUSED}
    assert {s for s in TaskState if running.can_become(s)} == {
        running, TaskState.SUCCEEDED, TaskState.FAILED}  # running again: the next attempt
    for final in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CACHED, TaskState.REUSED):
        assert final.is_final and not any(final.can_become(s) for s in TaskState)


class _Transitions(Reporter):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def task_changed(self, record) -> None:
        self.seen.append((record.call_id, record.state.value, record.attempts))


_FLAKY_CALLS: list[int] = []


@uniflow.task(retries=1, cache=True)
def _fails_once(x: int) -> int:
    _FLAKY_CALLS.append(x)
    if len(_FLAKY_CALLS) == 1:
        raise RuntimeError("first attempt fails")
    return x + 1


@uniflow.workflow()
def _twice(x: int) -> int:
    return _fails_once(x) + _fails_once(x)


def test_each_state_change_is_saved_and_announced_in_lifecycle_order():
    _FLAKY_CALLS.clear()
    reporter = _Transitions()
    context = uniflow.Context(reporter=reporter)
    assert context.run(_twice, 4) == 10
    # A retry runs again, the second call is served from the cache the first one filled.
    assert reporter.seen == [("001-_fails_once", "running", 1), ("001-_fails_once", "running", 2),
                             ("001-_fails_once", "succeeded", 2),
                             ("002-_fails_once", "cached", 0)]
    saved = {r.call_id: r for r in RunStore(Storage()).load_tasks(context.last_run_id)}
    assert saved["001-_fails_once"].state == TaskState.SUCCEEDED
    assert saved["002-_fails_once"].state == TaskState.CACHED
    assert all(r.started and r.ended and r.ended >= r.started for r in saved.values())
