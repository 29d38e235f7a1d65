"""The michelangelo command and `python wf.py local-run`, run as a user would."""

import os
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from michelangelo.cli._main import cli

WORKFLOW = textwrap.dedent(
    """
    import os
    import michelangelo.uniflow.core as uniflow

    @uniflow.task()
    def double(x: int) -> int:
        print(f"doubling {x}")
        return 2 * x

    @uniflow.task()
    def check(y: int) -> int:
        if os.environ.get("FAIL_CHECK"):
            raise ValueError(f"y={y} rejected")
        return y + 1

    @uniflow.workflow()
    def main(x: int = 1) -> int:
        return check(double(x))

    if __name__ == "__main__":
        print("result", uniflow.create_context().run(main, 5))
    """
)


def _write(tmp_path):
    path = tmp_path / "wf.py"
    path.write_text(WORKFLOW)
    return path


def _run_id(output: str) -> str:
    return next(line.split(": ")[1] for line in output.splitlines() if line.startswith("run id"))


def test_run_show_list_and_logs(tmp_path, monkeypatch):
    path = _write(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["run", f"{path}:main", "--arg", "x=4"])
    assert result.exit_code == 0, result.output
    assert "result: 9" in result.output
    run_id = _run_id(result.output)

    shown = runner.invoke(cli, ["runs", "show", run_id])
    assert shown.exit_code == 0 and "001-double" in shown.output and "succeeded" in shown.output
    listed = runner.invoke(cli, ["runs", "list"])
    assert run_id in listed.output
    logs = runner.invoke(cli, ["runs", "logs", run_id, "double"])
    assert "doubling 4" in logs.output and "002-check" not in logs.output


def test_user_errors_are_one_line_and_non_zero(tmp_path, monkeypatch):
    path = _write(tmp_path)
    monkeypatch.setenv("FAIL_CHECK", "1")
    result = CliRunner().invoke(cli, ["run", f"{path}:main"])
    assert result.exit_code == 1
    assert "error: ValueError: task 'check' failed: y=2 rejected" in result.output
    assert "Traceback" not in result.output
    debug = CliRunner().invoke(cli, ["--debug", "run", f"{path}:main"])
    assert isinstance(debug.exception, ValueError)

    missing = CliRunner().invoke(cli, ["run", f"{path}:nope"])
    assert missing.exit_code == 1 and "no 'nope'" in missing.output
    bad_arg = CliRunner().invoke(cli, ["run", f"{path}:main", "--arg", "oops"])
    assert bad_arg.exit_code == 1 and "KEY=VALUE" in bad_arg.output


def test_resume_from_the_cli_reuses_succeeded_tasks(tmp_path, monkeypatch):
    path = _write(tmp_path)
    monkeypatch.setenv("FAIL_CHECK", "1")
    failed = CliRunner().invoke(cli, ["run", f"{path}:main"])
    assert failed.exit_code == 1
    run_id = CliRunner().invoke(cli, ["runs", "list"]).output
    from michelangelo.uniflow.core._records import RunStore
    from michelangelo.uniflow.core._storage import Storage

    first = RunStore(Storage()).list_runs()[0].run_id
    monkeypatch.delenv("FAIL_CHECK")
    resumed = CliRunner().invoke(cli, ["run", f"{path}:main", "--resume", first])
    assert resumed.exit_code == 0, resumed.output
    shown = CliRunner().invoke(cli, ["runs", "show", _run_id(resumed.output)])
    assert "reused" in shown.output and first in shown.output
    assert run_id


def test_python_file_local_run_and_remote_run(tmp_path):
    path = _write(tmp_path)
    env = dict(os.environ)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "result 11" in done.stdout
    local = subprocess.run([sys.executable, str(path), "local-run"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert "result 11" in local.stdout
    remote = subprocess.run([sys.executable, str(path), "remote-run"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert remote.returncode != 0 and "remote-run" in remote.stderr


LONG_NAMED = textwrap.dedent(
    """
    import michelangelo.uniflow.core as uniflow

    @uniflow.task()
    def make_table_of_numbers(n: int) -> list:
        return list(range(n))

    @uniflow.workflow()
    def quickstart_sweep_of_three_settings(n: int = 3) -> list:
        return make_table_of_numbers(n)
    """
)


def _list_and_show(monkeypatch, tmp_path, *, terminal: bool) -> tuple[str, str, str]:
    import io

    from rich.console import Console

    from michelangelo.cli import _runs

    path = tmp_path / "long.py"
    path.write_text(LONG_NAMED)
    ran = CliRunner().invoke(cli, ["run", f"{path}:quickstart_sweep_of_three_settings"])
    assert ran.exit_code == 0, ran.output
    run_id = _run_id(ran.output)
    screen = io.StringIO()
    if terminal:  # an 80-column terminal
        monkeypatch.setattr(_runs, "console", Console(file=screen, width=80,
                                                      force_terminal=True, no_color=True))
    listed = CliRunner().invoke(cli, ["runs", "list"])
    shown = CliRunner().invoke(cli, ["runs", "show", run_id])
    assert listed.exit_code == 0 and shown.exit_code == 0, listed.output + shown.output
    if terminal:
        text = screen.getvalue()
        return run_id, text, text
    return run_id, listed.output, shown.output


def test_runs_list_and_show_piped_are_plain_aligned_lines(monkeypatch, tmp_path):
    run_id, listed, shown = _list_and_show(monkeypatch, tmp_path, terminal=False)
    header, row = listed.splitlines()[:2]
    assert header.split() == ["run", "workflow", "state", "started", "took", "tasks"]
    # Values whole, each under its header.
    assert row.startswith(run_id)
    assert row.index("quickstart_sweep_of_three_settings") == header.index("workflow")
    started = row[header.index("started"):].split("  ")[0]
    assert len(started) == len("2026-12-01 06:40:07"), row
    assert "…" not in listed + shown
    task_row = next(line for line in shown.splitlines() if line.startswith("001-"))
    assert task_row.startswith("001-make_table_of_numbers  succeeded")
    # Output paths are relative to the run's folder, which is named once.
    assert "tasks/001-make_table_of_numbers" in task_row and "/runs/" not in task_row
    assert "outputs are relative to " in shown and shown.rstrip().endswith(run_id)


def test_runs_list_and_show_keep_values_whole_at_80_columns(monkeypatch, tmp_path):
    run_id, text, _ = _list_and_show(monkeypatch, tmp_path, terminal=True)
    assert run_id in text and "quickstart_sweep_of_three_settings" in text
    assert "001-make_table_of_numbers" in text and "…" not in text
    started = [line for line in text.splitlines() if line.startswith(run_id)][0]
    assert any(len(part) == len("2026-12-01 06:40:07") for part in started.split("  ")), started
