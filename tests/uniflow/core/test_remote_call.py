"""The core's run-elsewhere path, with a plugin whose "elsewhere" is a fresh Python process.

No Ray here: the plugin below starts ``python -c`` with uniflow's ``execute_remote_call``, the
same function the Ray job entrypoint calls, so retries, timeouts, caching and error types are
checked on the core alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@dataclass(frozen=True)
class InAnotherProcess:
    """Test plugin config: run the body in a new Python process."""

    label: str = "child"


class AnotherProcessPlugin(uniflow.TaskPlugin):
    calls: list = []

    def runs_elsewhere(self, config, run) -> bool:
        return run.mode == "remote-run"

    def run_elsewhere(self, config, run, call) -> None:
        self.calls.append(call)
        code = ("import sys; from michelangelo.uniflow.core.plugin import RemoteCall, "
                "Storage, execute_remote_call; "
                "sys.exit(0 if execute_remote_call(RemoteCall.load(Storage(sys.argv[1]), "
                "sys.argv[2])) else 1)")
        subprocess.run([sys.executable, "-c", code, call.storage_url, call.spec_path],
                       cwd=REPO, timeout=120, check=False)


uniflow.register_plugin(InAnotherProcess, AnotherProcessPlugin())


@pytest.fixture(autouse=True)
def _ray_address_if_the_ray_plugin_is_loaded(monkeypatch):
    # When another test module has imported the Ray plugin, remote-run asks for a Ray
    # address; these workflows have no RayTask, so an unused one satisfies it.
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")


@uniflow.task(config=InAnotherProcess(), cache=True)
def where(x: int) -> dict:
    return {"x": x, "pid": os.getpid()}


@uniflow.task(config=InAnotherProcess(), retries=2)
def fails_twice(marker: str) -> int:
    count = 0
    if os.path.exists(marker):
        with open(marker) as handle:
            count = int(handle.read())
    with open(marker, "w") as handle:
        handle.write(str(count + 1))
    if count < 2:
        raise KeyError(f"attempt {count + 1}")
    return count


@uniflow.task(config=InAnotherProcess(), timeout=1, retries=1)
def too_slow() -> str:
    time.sleep(30)
    return "never"


@uniflow.task(config=InAnotherProcess())
def notes(fail: bool) -> int:
    uniflow.record_artifact("note", text="from the other process", pid=os.getpid())
    uniflow.record_artifact("odd", value={1, 2})  # not JSON: kept as its text
    if fail:
        raise ValueError("after the notes")
    return 1


@uniflow.workflow()
def cached_twice(x: int) -> list:
    return [where(x), where(x)]


def _context():
    return uniflow.Context("remote-run", reporter=Reporter())


def test_value_inputs_and_cache_cross_the_process_boundary():
    ctx = _context()
    first, second = ctx.run(cached_twice, 3)
    assert first == second and first["x"] == 3 and first["pid"] != os.getpid()
    tasks = RunStore(Storage()).load_tasks(ctx.last_run_id)
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED, TaskState.CACHED]


def test_retries_rerun_the_attempt_elsewhere_and_keep_the_error_type(tmp_path):
    marker = str(tmp_path / "count")
    assert _context().run(fails_twice, marker) == 2
    with open(marker) as handle:
        assert handle.read() == "3"
    os.remove(marker)
    with pytest.raises(KeyError, match="task 'fails_twice' failed") as caught:
        _context().run(fails_twice.with_overrides(retries=1), marker)
    assert any("remote traceback" in note for note in caught.value.__notes__)


def test_timeout_is_enforced_where_the_body_runs():
    start = time.monotonic()
    with pytest.raises(uniflow.TaskTimeoutError, match="exceeded its timeout of 1s"):
        _context().run(too_slow)
    assert time.monotonic() - start < 60  # two 1 s attempts, not two 30 s sleeps


def test_local_run_keeps_the_body_in_this_process():
    AnotherProcessPlugin.calls.clear()
    assert where(5)["pid"] == os.getpid()
    assert AnotherProcessPlugin.calls == []


@pytest.mark.parametrize("fail", [False, True])
def test_artifacts_recorded_elsewhere_reach_the_task_record(fail):
    ctx = _context()
    if fail:
        with pytest.raises(ValueError, match="after the notes"):
            ctx.run(notes.with_overrides(retries=0), True)
    else:
        assert ctx.run(notes, False) == 1
    run_id = ctx.last_run_id
    (record,) = RunStore(Storage()).load_tasks(run_id)
    kinds = {a["kind"]: a for a in record.artifacts}
    assert kinds["note"]["text"] == "from the other process"
    assert kinds["note"]["pid"] != os.getpid() and kinds["note"]["time"] > 0
    assert kinds["odd"]["value"] == "{1, 2}"
