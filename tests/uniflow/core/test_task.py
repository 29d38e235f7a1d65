import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter


def _ctx(**kwargs):
    return uniflow.Context(reporter=Reporter(), **kwargs)


@uniflow.task()
def add(a: int, b: int) -> int:
    return a + b


@uniflow.workflow()
def chain(n: int) -> int:
    return add(n, add(n, 1))


def test_direct_calls_run_locally_and_return_values():
    assert add(1, 2) == 3
    assert chain(2) == 5


def test_context_run_returns_the_workflow_value_and_records_tasks():
    ctx = _ctx()
    assert ctx.run(chain, 3) == 7
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    store = RunStore(Storage())
    run = store.load_run(ctx.last_run_id)
    assert run.state == uniflow.RunState.SUCCEEDED
    tasks = store.load_tasks(ctx.last_run_id)
    assert [t.call_id for t in tasks] == ["001-add", "002-add"]
    assert all(t.state == uniflow.TaskState.SUCCEEDED for t in tasks)
    assert tasks[1].output["meta"]["summary"] == "7"


@uniflow.task()
def train_like(folder: str) -> dict:
    return {"checkpoint_path": f"{folder}/checkpoint_000002", "path": folder,
            "metrics": {"val_loss": 0.01}}


@uniflow.task()
def many(n: int) -> list:
    return list(range(n))


def test_summaries_stay_whole_a_dict_by_its_keys_a_list_by_its_length():
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    ctx = _ctx()
    folder = "/data/.michelangelo/uniflow/runs/" + "x" * 120  # a repr would be cut mid-path
    ctx.run(train_like, folder)
    ctx2 = _ctx()
    ctx2.run(many, 1000)
    store = RunStore(Storage())
    summary = store.load_tasks(ctx.last_run_id)[0].output["meta"]["summary"]
    assert summary == "dict: checkpoint_path, path, metrics"
    assert store.load_tasks(ctx2.last_run_id)[0].output["meta"]["summary"] == "list of 1000"


class DataError(Exception):
    pass


@uniflow.task()
def explode(x: int) -> int:
    raise DataError(f"row {x} is corrupt")


def test_failed_task_reraises_the_users_type_with_the_task_name():
    with pytest.raises(DataError, match=r"task 'explode' failed: row 4 is corrupt"):
        _ctx().run(explode, 4)


def test_retries_rerun_the_body(tmp_path):
    marker = tmp_path / "count"

    @uniflow.task(retries=2)
    def flaky() -> str:
        n = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(n + 1))
        if n < 2:
            raise RuntimeError("transient")
        return "ok"

    assert _ctx().run(flaky) == "ok"
    assert marker.read_text() == "3"


def test_timeout_stops_a_slow_task():
    import time

    @uniflow.task(timeout=0.3)
    def slow() -> None:
        time.sleep(300)

    start = time.monotonic()
    with pytest.raises(uniflow.TaskTimeoutError, match="timeout of 0.3s"):
        _ctx().run(slow)
    # Stopped, not waited for: far below the body's 300 s whatever the machine's load.
    assert time.monotonic() - start < 150


@pytest.mark.parametrize(
    "kwargs, field",
    [({"retries": -1}, "retries"), ({"timeout": 0}, "timeout"), ({"cache_version": 3}, "cache_version")],
)
def test_bad_task_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        uniflow.task(**kwargs)(lambda: None)


def test_unknown_config_type_is_rejected_at_declaration():
    with pytest.raises(uniflow.UserError, match="no uniflow plugin"):
        uniflow.task(config=object())(lambda: None)


def test_with_overrides_copies_options():
    slow = add.with_overrides(retries=3)
    assert slow.retries == 3 and add.retries == 0
    assert slow(2, 2) == 4
    with pytest.raises(ValueError, match="unknown option"):
        add.with_overrides(colour="red")


def test_remote_run_without_a_cluster_address_is_refused_clearly():
    # The Ray plugin is what asks for the address (other test modules may register plugins
    # that run elsewhere without one). Refused when the context is made, before any run.
    import michelangelo.uniflow.plugins.ray  # noqa: F401
    with pytest.raises(uniflow.UserError, match="remote-run"):
        uniflow.create_context(["remote-run"])


def test_create_context_parses_local_run_resume():
    ctx = uniflow.create_context(["local-run", "--resume", "abc"])
    assert ctx.mode == "local-run" and ctx.resume == "abc"
    assert uniflow.create_context(["--some-pytest-flag"]).mode == "local-run"
