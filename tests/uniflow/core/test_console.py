"""The quiet console: task output goes to the task log, warnings once, failures explained."""

from __future__ import annotations

import io
import os
import sysconfig
import warnings

import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import PlainReporter, format_progress
from michelangelo.uniflow.core._records import RunStore
from michelangelo.uniflow.core._storage import Storage


@uniflow.task()
def chatty(x: int) -> int:
    print(f"python print {x}")
    os.write(2, b"native stderr line\n")  # like Ray's C++ core or a subprocess
    warnings.warn(f"user warning {x}", UserWarning, stacklevel=1)
    warnings.warn(f"user warning {x}", UserWarning, stacklevel=1)
    warnings.warn_explicit("library chatter", UserWarning,
                           os.path.join(sysconfig.get_paths()["purelib"], "lib", "m.py"), 1)
    uniflow.record_artifact("note", text="made by chatty", value=x)
    uniflow.record_artifact("note", text="made by chatty", value=x)  # the same: kept once
    return x + 1


@uniflow.task()
def explode(x: int) -> int:
    print("about to fail")
    raise ValueError(f"x={x} is not allowed")


@uniflow.workflow()
def talk(x: int = 1) -> int:
    return chatty(x)


@uniflow.workflow()
def talk_then_fail(x: int = 1) -> int:
    return explode(chatty(x))


def _attempt_log(run_id: str, call_id: str) -> str:
    store = RunStore(Storage())
    with open(store.log_path(run_id, call_id, 1), encoding="utf-8") as handle:
        return handle.read()


def test_quiet_console_keeps_output_in_the_task_log(capfd, monkeypatch):
    monkeypatch.delenv("UF_VERBOSE", raising=False)
    console = io.StringIO()
    context = uniflow.Context(reporter=PlainReporter(console))
    assert context.run(talk, 3) == 4
    shown = console.getvalue()
    out, err = capfd.readouterr()
    # Nothing the task printed reaches the console or the process's own stdout/stderr ...
    for text in ("python print 3", "native stderr line", "library chatter"):
        assert text not in shown and text not in out and text not in err
    # ... but all of it is in the task's log, and the user's warning is shown once.
    log = _attempt_log(context.last_run_id, "001-chatty")
    assert "python print 3" in log and "native stderr line" in log and "library chatter" in log
    assert shown.count("warning: UserWarning: user warning 3") == 1
    assert "task 001-chatty succeeded" in shown
    record = RunStore(Storage()).load_task(context.last_run_id, "001-chatty")
    assert [(a["kind"], a["value"]) for a in record.artifacts] == [("note", 3)]


def test_verbose_streams_output_as_it_happens(capfd, monkeypatch):
    monkeypatch.setenv("UF_VERBOSE", "1")
    console = io.StringIO()
    context = uniflow.Context(reporter=PlainReporter(console))
    assert context.run(talk, 5) == 6
    out, err = capfd.readouterr()
    assert "python print 5" in out
    assert "native stderr line" in err
    assert "python print 5" in _attempt_log(context.last_run_id, "001-chatty")


def test_failure_summary_names_the_task_error_and_log_command(monkeypatch):
    monkeypatch.delenv("UF_VERBOSE", raising=False)
    console = io.StringIO()
    context = uniflow.Context(reporter=PlainReporter(console))
    with pytest.raises(ValueError, match="x=2 is not allowed"):
        context.run(talk_then_fail, 1)
    shown = console.getvalue()
    run_id = context.last_run_id
    assert "task 002-explode failed: ValueError: x=2 is not allowed" in shown
    assert f"whole log: michelangelo runs logs {run_id} 002-explode" in shown
    assert "about to fail" not in shown  # the print is in the log, not on the console
    assert "about to fail" in _attempt_log(run_id, "002-explode")
    # The run-level log holds what was printed outside any task (nothing here but it exists).
    assert os.path.exists(os.path.join(RunStore(Storage()).run_dir(run_id), "logs",
                                       "driver.log"))


def test_plain_progress_lines_are_throttled():
    console = io.StringIO()
    reporter = PlainReporter(console, progress_every_s=10.0)
    state = {"epoch": 0, "max_epochs": 2, "step": 1, "total_steps": 10, "rows_per_s": 1234.0,
             "eta_s": 75, "metrics": {"train_loss": 0.5}}
    for step in range(1, 10):
        reporter.progress("002-train", dict(state, step=step))
    for _ in range(4):  # the driver polls the finished state until the task ends
        reporter.progress("002-train", dict(state, step=10, epoch=1, done=True))
    reporter.progress("002-train", None)
    lines = console.getvalue().splitlines()
    assert lines == [
        "[uniflow] 002-train: epoch 1/2  step 1/10  1,234 rows/s  ETA 1:15  train_loss 0.5",
        "[uniflow] 002-train: epoch 2/2  step 10/10  1,234 rows/s  train_loss 0.5  done",
    ]
    assert format_progress({"step": 3}) == "step 3"


def test_progress_removed_before_done_says_stopped():
    console = io.StringIO()
    reporter = PlainReporter(console, progress_every_s=10.0)
    reporter.progress("001-train", {"epoch": 0, "max_epochs": 1, "step": 2, "total_steps": 8,
                                    "eta_s": 30})
    reporter.progress("001-train", None)  # the fit raised on a worker
    assert console.getvalue().splitlines() == [
        "[uniflow] 001-train: epoch 1/1  step 2/8  ETA 0:30",
        "[uniflow] 001-train: epoch 1/1  step 2/8  stopped",
    ]


def test_cli_verbose_flag_streams_task_output(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from michelangelo.cli._main import cli

    # setenv, not delenv: when the variable is unset, delenv records nothing to undo, and
    # `--verbose` below sets it in this process for every later test (serving's quiet check).
    monkeypatch.setenv("UF_VERBOSE", "0")
    workflow = tmp_path / "wf.py"
    workflow.write_text(
        "import michelangelo.uniflow.core as uniflow\n\n"
        "@uniflow.task()\n"
        "def shout(x: int) -> int:\n"
        "    print(f'shouting {x}')\n"
        "    return x\n\n"
        "@uniflow.workflow()\n"
        "def main(x: int = 7) -> int:\n"
        "    return shout(x)\n"
    )
    quiet = CliRunner().invoke(cli, ["run", f"{workflow}:main"])
    assert quiet.exit_code == 0, quiet.output
    assert "shouting 7" not in quiet.output and "result: 7" in quiet.output
    loud = CliRunner().invoke(cli, ["--verbose", "run", f"{workflow}:main"])
    assert loud.exit_code == 0, loud.output
    assert "shouting 7" in loud.output


FAILING_SCRIPT = """
import michelangelo.uniflow.core as uniflow

@uniflow.task()
def parse(path: str) -> int:
    raise KeyError("column 'label' is missing")

@uniflow.workflow()
def wf() -> int:
    return parse("rows.csv")

if __name__ == "__main__":
    uniflow.create_context().run(wf)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_a_failed_script_ends_on_the_summary_not_a_traceback(tmp_path, debug):
    import subprocess
    import sys

    script = tmp_path / "wf.py"
    script.write_text(FAILING_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("UF_VERBOSE", "UF_DEBUG")}
    env["UF_STORAGE_URL"] = str(tmp_path / "uf")
    if debug:
        env["UF_DEBUG"] = "1"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert "column 'label' is missing" in done.stderr
    assert "michelangelo runs logs" in done.stderr  # the summary is there either way
    assert ("Traceback" in done.stderr) is debug
    assert ("run failed: KeyError" in done.stderr) is not debug
    if not debug:  # one line, however long the error's message
        assert done.stderr.strip().splitlines()[-1].startswith("(details above")
