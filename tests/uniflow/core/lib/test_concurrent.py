"""concurrent.run / batch_run: real overlap, bounds, failures, resume and Ctrl-C.

Overlap is shown from timestamps the bodies record, with bodies that wait for each other
(barrier files), so a run that did not overlap fails on the barrier instead of passing by luck.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import PlainReporter, Reporter
from michelangelo.uniflow.core._records import RunStore, TaskState
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.lib import concurrent

BARRIER_S = 60.0  # far beyond any scheduling delay; only reached when branches do not overlap


class RecordingReporter(Reporter):
    """Keeps the info lines a run prints (the batch placement line)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def _ctx(**kwargs):
    return uniflow.Context(reporter=kwargs.pop("reporter", Reporter()), **kwargs)


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + BARRIER_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"barrier: {what} never happened")
        time.sleep(0.01)


def _mark(folder: str, name: str) -> float:
    now = time.time()
    with open(os.path.join(folder, name), "w") as handle:
        handle.write(repr(now))
    return now


def _read(folder: str, name: str) -> float:
    with open(os.path.join(folder, name)) as handle:
        return float(handle.read())


@uniflow.task()
def meet(folder: str, me: int, others: list[int]) -> dict:
    """Starts, waits until every other branch has started, ends: overlap or a failed barrier."""
    start = _mark(folder, f"start-{me}")
    print(f"branch {me} says hello")
    _wait_for(lambda: all(os.path.exists(os.path.join(folder, f"start-{o}")) for o in others),
              f"branches {others} starting while {me} runs")
    return {"me": me, "start": start, "end": _mark(folder, f"end-{me}")}


@uniflow.workflow()
def two_meeting(folder: str) -> list[dict]:
    batch = concurrent.batch_run([concurrent.new_callable(meet, folder, 0, [1]),
                                  concurrent.new_callable(meet, folder, 1, [0])])
    return batch.get()


def test_plain_task_branches_overlap_and_are_recorded_apart(tmp_path):
    reporter = RecordingReporter()
    ctx = _ctx(reporter=reporter)
    a, b = ctx.run(two_meeting, str(tmp_path))
    # Each started before the other ended: they ran at the same time.
    assert b["start"] < a["end"] and a["start"] < b["end"]
    store = RunStore(Storage())
    records = {r.call_id: r for r in store.load_tasks(ctx.last_run_id)}
    assert set(records) == {"001-meet[0]", "001-meet[1]"}
    assert all(r.state == TaskState.SUCCEEDED and r.attempts == 1 for r in records.values())
    # Each branch's prints are in its own log, not in the other's.
    for me in (0, 1):
        log = store.log_path(ctx.last_run_id, f"001-meet[{me}]", 1)
        with open(log) as handle:
            text = handle.read()
        assert f"branch {me} says hello" in text
        assert f"branch {1 - me} says hello" not in text
    run = store.load_run(ctx.last_run_id)
    assert run.tasks == ["001-meet[0]", "001-meet[1]"]
    assert run.batches[0]["at_once"] == 2 and run.batches[0]["branches"] == 2
    assert any(line.startswith("batch 001: 2 branch(es) of meet, 2 at once") for line in
               reporter.lines)


@uniflow.task()
def occupy(folder: str, me: int) -> tuple[float, float]:
    start = _mark(folder, f"start-{me}")
    # The pairs (0, 1) and (2, 3) meet: each waits until its partner has started too.
    partner_started = 2 * (me // 2) + 2
    _wait_for(lambda: len([n for n in os.listdir(folder) if n.startswith("start-")])
              >= partner_started, f"{partner_started} branches started while {me} runs")
    return start, _mark(folder, f"end-{me}")


@uniflow.workflow()
def bounded(folder: str, limit: int) -> list[tuple[float, float]]:
    return concurrent.batch_run([concurrent.new_callable(occupy, folder, i) for i in range(4)],
                                max_concurrency=limit).get()


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


class SlowStream(io.StringIO):
    """A console that takes a moment per write (a slow terminal or a full pipe)."""

    def write(self, text: str) -> int:
        time.sleep(0.005)
        return super().write(text)


def test_the_plain_console_names_the_branches_still_in_flight(tmp_path):
    # A slow console lets the other branch's end land between a line and the one after it
    # if the reporter does not keep them together (it failed CI once on a plain StringIO).
    stream = SlowStream()
    _ctx(reporter=PlainReporter(stream, quiet=True)).run(two_meeting, str(tmp_path))
    lines = stream.getvalue().splitlines()
    # Both branches ran together (they met), so when the first ended, the other was named
    # as still in flight; after the last one, no such line.
    ended = [i for i, line in enumerate(lines) if " task 001-meet[" in line
             and " succeeded in " in line]
    assert len(ended) == 2, lines
    first, last = ended
    still = "001-meet[1]" if "001-meet[0]" in lines[first] else "001-meet[0]"
    assert lines[first + 1] == f"[uniflow]   in flight: {still}", lines
    assert last + 1 == len(lines) or "in flight" not in lines[last + 1], lines


def test_max_concurrency_bounds_the_branches_in_flight(tmp_path):
    reporter = RecordingReporter()
    spans = _ctx(reporter=reporter).run(bounded, str(tmp_path), 2)
    # Two at once (the pairs met), never three: a branch starts only after one has ended.
    assert _most_at_once(spans) == 2
    assert "4 branch(es) of occupy, 2 at once (max_concurrency=2)" in "\n".join(reporter.lines)


@uniflow.task()
def square(x: int) -> int:
    return x * x


@uniflow.task()
def plus(a: int, b: int) -> int:
    return a + b


@uniflow.workflow()
def chained(x: int) -> int:
    future = concurrent.run(square, x)
    return plus(future, [concurrent.run(square, 2)][0])


def test_a_future_passed_to_a_task_is_waited_for_first():
    ctx = _ctx()
    assert ctx.run(chained, 3) == 13
    records = RunStore(Storage()).load_tasks(ctx.last_run_id)
    assert [r.call_id for r in records] == ["001-square", "002-square", "003-plus"]
    assert all(r.state == TaskState.SUCCEEDED for r in records)


CALLS: list[int] = []


@uniflow.task()
def flaky(folder: str, me: int) -> int:
    CALLS.append(me)
    if me == 1:
        # The other branches finish only after this one has failed: get() must wait for them.
        if not os.path.exists(os.path.join(folder, "fixed")):
            _mark(folder, "failing")
            raise KeyError(f"branch {me} has no setting")
    else:
        _wait_for(lambda: os.path.exists(os.path.join(folder, "failing"))
                  or os.path.exists(os.path.join(folder, "fixed")), "branch 1 failing")
    return me * 10


@uniflow.workflow()
def sweep(folder: str) -> list[int]:
    return concurrent.batch_run([concurrent.new_callable(flaky, folder, i)
                                 for i in range(3)]).get()


def test_a_failed_branch_raises_its_own_type_after_the_others_settle_and_resume_reruns_it(
        tmp_path):
    CALLS.clear()
    first = _ctx()
    with pytest.raises(KeyError) as caught:
        first.run(sweep, str(tmp_path))
    assert "task 'flaky[1]' failed: branch 1 has no setting" in str(caught.value)
    store = RunStore(Storage())
    states = {r.call_id: r.state for r in store.load_tasks(first.last_run_id)}
    assert states == {"001-flaky[0]": TaskState.SUCCEEDED, "001-flaky[1]": TaskState.FAILED,
                      "001-flaky[2]": TaskState.SUCCEEDED}

    CALLS.clear()
    _mark(str(tmp_path), "fixed")
    second = _ctx(resume=first.last_run_id)
    assert second.run(sweep, str(tmp_path)) == [0, 10, 20]
    assert CALLS == [1]  # only the failed branch ran again
    states = {r.call_id: r.state for r in store.load_tasks(second.last_run_id)}
    assert states == {"001-flaky[0]": TaskState.REUSED, "001-flaky[1]": TaskState.SUCCEEDED,
                      "001-flaky[2]": TaskState.REUSED}


@uniflow.task()
def fails_first(me: int) -> int:
    CALLS.append(me)
    if me == 0:
        raise RuntimeError("no good")
    return me


@uniflow.workflow()
def fast_failing() -> list:
    batch = concurrent.batch_run([concurrent.new_callable(fails_first, i) for i in range(3)],
                                 max_concurrency=1, fail_fast=True)
    with pytest.raises(RuntimeError, match=r"task 'fails_first\[0\]' failed: no good"):
        batch.get()
    return [f.cancelled() for f in batch.get_futures()]


def test_fail_fast_cancels_the_branches_not_started():
    CALLS.clear()
    ctx = _ctx()
    assert ctx.run(fast_failing) == [False, True, True]
    assert CALLS == [0]
    states = {r.call_id: r.state for r in RunStore(Storage()).load_tasks(ctx.last_run_id)}
    assert states == {"001-fails_first[0]": TaskState.FAILED,
                      "001-fails_first[1]": TaskState.PENDING,
                      "001-fails_first[2]": TaskState.PENDING}


@uniflow.task(retries=1)
def retried(folder: str) -> str:
    if not os.path.exists(os.path.join(folder, "tried")):
        _mark(folder, "tried")
        raise OSError("transient")
    return "ok"


@uniflow.task(timeout=0.5)
def too_slow() -> None:
    while True:  # Python code, so the branch's time limit can interrupt it
        time.sleep(0.02)


@uniflow.workflow()
def retries_and_timeouts(folder: str) -> list:
    batch = concurrent.batch_run([concurrent.new_callable(retried, folder),
                                  concurrent.new_callable(too_slow)])
    futures = batch.get_futures()
    return [futures[0].result(), type(futures[1].exception()).__name__,
            str(futures[1].exception())]


def test_branches_keep_their_retries_and_timeouts(tmp_path):
    ctx = _ctx()
    ok, kind, message = ctx.run(retries_and_timeouts, str(tmp_path))
    assert ok == "ok"
    assert kind == "TaskTimeoutError"
    assert "too_slow[1]" in message and "timeout of 0.5s" in message
    records = {r.call_id: r for r in RunStore(Storage()).load_tasks(ctx.last_run_id)}
    assert records["001-retried[0]"].attempts == 2
    assert records["001-too_slow[1]"].state == TaskState.FAILED


@uniflow.workflow()
def nested(folder: str) -> list:
    def pair(x: int) -> int:
        return plus(square(x), 1)  # two task calls inside one branch

    return concurrent.batch_run([concurrent.new_callable(pair, x) for x in (1, 2)]).get()


def test_calls_inside_a_branch_are_numbered_under_it():
    ctx = _ctx()
    assert ctx.run(nested, "unused") == [2, 5]
    ids = sorted(r.call_id for r in RunStore(Storage()).load_tasks(ctx.last_run_id))
    assert ids == ["001[0].001-square", "001[0].002-plus", "001[1].001-square", "001[1].002-plus"]


def test_bad_arguments_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"max_concurrency=0"):
        concurrent.batch_run([concurrent.new_callable(square, 1)], max_concurrency=0)
    with pytest.raises(TypeError, match=r"item 1 is 3"):
        concurrent.batch_run([concurrent.new_callable(square, 1), 3])


def _run_two_spinning_branches(folder, spin_body: str, poke=None, timeout: float = 60):
    """Runs, in a fresh Python, a workflow whose two branches ``spin(me)`` run ``spin_body``
    (which may use ``FOLDER``, ``me``, ``os``, ``signal``, ``threading`` and ``time``); calls
    ``poke(proc)`` while it runs; returns its exit code, its stderr and the run's id."""
    script = folder / "wf.py"
    header = textwrap.dedent(f"""\
        import os, signal, threading, time
        import michelangelo.uniflow.core as uniflow
        from michelangelo.uniflow.core._console import Reporter
        from michelangelo.uniflow.core.lib import concurrent

        FOLDER = {str(folder)!r}

        @uniflow.task()
        def spin(me: int) -> None:
    """)
    footer = textwrap.dedent("""
        @uniflow.workflow()
        def wf():
            return concurrent.batch_run([concurrent.new_callable(spin, i) for i in range(2)]).get()

        ctx = uniflow.Context(reporter=Reporter())
        try:
            ctx.run(wf)
        finally:
            with open(os.path.join(FOLDER, "run_id"), "w") as f:
                f.write(ctx.last_run_id)
    """)
    body = textwrap.indent(textwrap.dedent(spin_body).strip("\n"), "    ")
    script.write_text(header + body + "\n\n" + footer)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        if poke is not None:
            poke(proc)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, (folder / "run_id").read_text()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_every_branch_and_records_the_run_interrupted(tmp_path, stop):
    """Ctrl-C, and SIGTERM in a plain ``python wf.py`` (no handler of its own), unwind."""
    def once_both_beat(proc):
        # Each branch has written its first heartbeat (not only started: on a busy machine
        # the signal could land before a branch's first write, leaving nothing to compare).
        _wait_for(lambda: all((tmp_path / f"alive-{i}").exists() for i in range(2)),
                  "both branches beating")
        proc.send_signal(stop)

    returncode, err, run_id = _run_two_spinning_branches(tmp_path, """
        beat = os.path.join(FOLDER, f"alive-{me}")
        while True:  # each heartbeat whole (written aside, then renamed into place)
            with open(beat + ".part", "w") as f:
                f.write(repr(time.time()))
            os.replace(beat + ".part", beat)
            time.sleep(0.05)
    """, poke=once_both_beat)
    assert returncode != 0
    assert b"KeyboardInterrupt" in err
    # Nothing keeps running: the process is gone, and no branch writes after it ended.
    last = [_read(str(tmp_path), f"alive-{i}") for i in range(2)]
    time.sleep(0.3)
    assert [_read(str(tmp_path), f"alive-{i}") for i in range(2)] == last
    store = RunStore(Storage())
    assert store.load_run(run_id).state.value == "interrupted"
    states = {r.call_id: r.state for r in store.load_tasks(run_id)}
    assert states == {"001-spin[0]": TaskState.FAILED, "001-spin[1]": TaskState.FAILED}


def test_a_ctrl_c_that_the_kernel_hands_to_a_branch_thread_still_stops_the_run(tmp_path):
    """The kernel may deliver a Ctrl-C to any thread that does not block it (CI once saw a run
    wait forever). Here a branch thread takes the signal itself: Python only marks it, and
    the workflow's thread, waiting on the batch, must still notice and unwind."""
    returncode, err, run_id = _run_two_spinning_branches(tmp_path, """
        if me == 1:
            time.sleep(0.5)  # the workflow's thread is waiting on the batch by now
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        while True:
            time.sleep(0.05)
    """, timeout=120)
    assert returncode != 0
    assert b"KeyboardInterrupt" in err
    assert RunStore(Storage()).load_run(run_id).state.value == "interrupted"


def test_run_record_keeps_the_batch_line():
    ctx = _ctx()
    ctx.run(nested, "unused")
    run = RunStore(Storage()).load_run(ctx.last_run_id)
    assert json.dumps(run.batches)  # JSON-able, for the report
    assert run.batches[0]["batch"] == "001" and run.batches[0]["why"] == ["max_concurrency=None"]
    from michelangelo.uniflow.report import build_report

    html = build_report(ctx.last_run_id)
    assert "2 branch(es) of pair, 2 at once (max_concurrency=None)" in html


class Warnings(Reporter):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str) -> None:
        self.warnings.append(message)


@uniflow.workflow()
def forgets(folder: str) -> str:
    concurrent.run(fails_first, 0)  # never asked for: the run waits for it, and warns
    return "returned"


def test_branches_nobody_waited_for_are_settled_and_their_failures_shown():
    CALLS.clear()
    reporter = Warnings()
    ctx = _ctx(reporter=reporter)
    assert ctx.run(forgets, "unused") == "returned"
    assert CALLS == [0]
    assert any("task 'fails_first' failed and the workflow never asked" in w
               for w in reporter.warnings)
    states = {r.call_id: r.state for r in RunStore(Storage()).load_tasks(ctx.last_run_id)}
    assert states == {"001-fails_first": TaskState.FAILED}
