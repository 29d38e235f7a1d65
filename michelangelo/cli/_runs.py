"""``michelangelo runs``: list runs, show one, print its logs."""

from __future__ import annotations

import datetime
import os
import posixpath

import click
from rich.console import Console
from rich.table import Table

from michelangelo.cli._report import report
from michelangelo.uniflow.core import time_and_resources
from michelangelo.uniflow.core.errors import RunNotFoundError
from michelangelo.uniflow.core.plugin import RunStore, Storage

console = Console()


def _store(storage_url: str | None) -> RunStore:
    _reach_sandbox_bucket(storage_url or os.environ.get("UF_STORAGE_URL") or "")
    return RunStore(Storage(storage_url))


def _reach_sandbox_bucket(url: str) -> None:
    """Runs made with ``--sandbox`` keep their records in the sandbox's MinIO bucket: when the
    storage is that bucket, reach it with the endpoint and credentials ``sandbox create``
    wrote (what the shell sets itself wins), as the run itself did."""
    if not url.startswith("s3://"):
        return
    from michelangelo.sandbox import SandboxError, load_sandbox_settings, settings_path

    if not os.path.exists(settings_path()):
        return
    try:
        sandbox = load_sandbox_settings()
    except SandboxError:
        return
    root = sandbox.storage_url.rstrip("/")
    if url.rstrip("/") == root or url.startswith(root + "/"):
        sandbox.use_client_environment()


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _took(start: float | None, end: float | None) -> str:
    return f"{end - start:.2f}s" if start and end else ""


def _print_rows(headers: list[str], rows: list[list[str]], *, last_folds: bool = False) -> None:
    """A table: Rich's in a terminal, plain aligned lines when piped (nothing cut or wrapped).

    In a terminal, every column but the last keeps its values whole (ids, names, times);
    the last one folds when ``last_folds``, else it is kept whole too.
    """
    if not console.is_terminal:
        widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
        for line in [headers, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=True)]
            click.echo("  ".join(cells).rstrip())
        return
    table = Table(box=None, padding=(0, 2, 0, 0), header_style="bold")
    needed = 0
    for index, header in enumerate(headers):
        fold = last_folds and index == len(headers) - 1
        whole = max([len(header), *(len(row[index]) for row in rows)])
        needed += (20 if fold else whole) + 2
        table.add_column(header, no_wrap=not fold, overflow="fold",
                         min_width=None if fold else whole)
    for row in rows:
        table.add_row(*row)
    # Narrower than the rows: the terminal wraps the lines rather than Rich cutting values.
    console.print(table, width=max(console.width, needed), crop=False)


def _relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` when it lies under it (outputs live in the run's folder)."""
    prefix = base.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


@click.group("runs")
def runs() -> None:
    """Inspect runs kept in storage ($UF_STORAGE_URL)."""


@runs.command("list")
@click.option("--limit", default=20, show_default=True)
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
def list_runs(limit: int, storage_url: str | None) -> None:
    """The most recent runs."""
    rows = [[run.run_id, run.workflow, run.state.value, _when(run.started),
             _took(run.started, run.ended), str(len(run.tasks))]
            for run in _store(storage_url).list_runs()[:limit]]
    _print_rows(["run", "workflow", "state", "started", "took", "tasks"], rows)


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
                  f"state {run.state.value}  took {_took(run.started, run.ended)}",
                  soft_wrap=True)
    if run.resumed_from:
        console.print(f"resumed from {run.resumed_from}")
    if run.arguments:
        console.print("arguments: " + ", ".join(f"{k}={v}" for k, v in run.arguments.items()))
    run_dir = store.run_dir(run_id)
    rows = []
    for task in store.load_tasks(run_id):
        output = ""
        if task.output:
            summary = task.output["meta"].get("summary", "")
            output = f"{summary}  {_relative(task.output['folder'], run_dir)}".strip()
        rows.append([task.call_id, task.state.value, str(task.attempts),
                     _took(task.started, task.ended), task.source_run or "", output])
    _print_rows(["task", "state", "attempts", "took", "from run", "output"], rows,
                last_folds=True)
    if any(row[5] for row in rows):
        click.echo(f"outputs are relative to {run_dir}")
    _print_time_and_resources(store.load_tasks(run_id))
    if run.error:
        console.print(f"[red]error[/]: {run.error['type']}: {run.error['message']}")


def _print_time_and_resources(tasks: list) -> None:
    """Each task's phases and resource-hours, then the run's total (when any were recorded)."""
    rows, total = time_and_resources(tasks)
    if not rows:
        return
    click.echo("where the time went:")
    for task, phases, held in rows:
        click.echo(f"  {task.call_id}")
        if phases:
            click.echo("    " + " · ".join(f"{name} {seconds:.1f}s" for name, seconds in phases))
        if held:
            click.echo(f"    {held}")
    click.echo(f"run total: {total.describe()}")


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
