"""``michelangelo runs``: list runs, show one, print its logs."""

from __future__ import annotations

import datetime
import posixpath

import click
from rich.console import Console
from rich.table import Table

from michelangelo.cli._report import report
from michelangelo.uniflow.core.errors import RunNotFoundError
from michelangelo.uniflow.core.plugin import RunStore, Storage

console = Console()


def _store(storage_url: str | None) -> RunStore:
    return RunStore(Storage(storage_url))


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _took(start: float | None, end: float | None) -> str:
    return f"{end - start:.2f}s" if start and end else ""


@click.group("runs")
def runs() -> None:
    """Inspect runs kept in storage ($UF_STORAGE_URL)."""


@runs.command("list")
@click.option("--limit", default=20, show_default=True)
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
def list_runs(limit: int, storage_url: str | None) -> None:
    """The most recent runs."""
    table = Table("workflow", "state", "started", "took", "tasks")
    table.add_column("run", no_wrap=True)
    for run in _store(storage_url).list_runs()[:limit]:
        table.add_row(run.workflow, run.state.value, _when(run.started),
                      _took(run.started, run.ended), str(len(run.tasks)), run.run_id)
    console.print(table)


@runs.command("show")
@click.argument("run_id")
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
def show(run_id: str, storage_url: str | None) -> None:
    """A run's tasks: state, duration, reuse, outputs."""
    store = _store(storage_url)
    run = store.load_run(run_id)
    if run is None:
        raise RunNotFoundError(f"no run {run_id!r} under {store.storage.url}")
    console.print(f"[bold]run[/] {run.run_id}  workflow [bold]{run.workflow}[/]  "
                  f"state {run.state.value}  took {_took(run.started, run.ended)}")
    if run.resumed_from:
        console.print(f"resumed from {run.resumed_from}")
    if run.arguments:
        console.print("arguments: " + ", ".join(f"{k}={v}" for k, v in run.arguments.items()))
    table = Table("task", "state", "attempts", "took", "from run")
    table.add_column("output", overflow="fold")
    for task in store.load_tasks(run_id):
        output = ""
        if task.output:
            output = task.output["meta"].get("summary", "") + "  " + task.output["folder"]
        table.add_row(task.call_id, task.state.value, str(task.attempts),
                      _took(task.started, task.ended), task.source_run or "", output)
    console.print(table)
    if run.error:
        console.print(f"[red]error[/]: {run.error['type']}: {run.error['message']}")


@runs.command("logs")
@click.argument("run_id")
@click.argument("task", required=False)
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
def logs(run_id: str, task: str | None, storage_url: str | None) -> None:
    """Print each task's output (its own and its Ray workers'); TASK narrows to one task."""
    store = _store(storage_url)
    if store.load_run(run_id) is None:
        raise RunNotFoundError(f"no run {run_id!r} under {store.storage.url}")
    records = store.load_tasks(run_id)
    if task:
        records = [r for r in records if task in (r.call_id, r.task_name)]
        if not records:
            raise RunNotFoundError(f"run {run_id} has no task {task!r}")
    for record in records:
        folder = posixpath.join(store.call_dir(run_id, record.call_id), "logs")
        if not store.storage.exists(folder):
            continue
        # The task's own output first (attempt-N.log), then its Ray workers' files.
        files = sorted(store.storage.fs.find(folder), key=lambda p: ("/ray-" in p, p))
        for path in files:
            name = posixpath.relpath(path, folder)
            click.echo(click.style(f"==> {record.call_id} {name} <==", bold=True))
            click.echo(store.storage.read_bytes(path).decode(errors="replace"), nl=False)
    # What the run printed outside its tasks (the workflow body, cluster teardown).
    driver = posixpath.join(store.run_dir(run_id), "logs", "driver.log")
    if not task and store.storage.exists(driver):
        text = store.storage.read_bytes(driver).decode(errors="replace")
        if text.strip():
            click.echo(click.style("==> driver.log <==", bold=True))
            click.echo(text, nl=False)


runs.add_command(report)
