"""What a person sees while a run goes: task states live, spinners, one-line notices."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from michelangelo.uniflow.core._records import RunRecord, TaskRecord, TaskState

_STYLE = {
    TaskState.PENDING: "dim",
    TaskState.RUNNING: "yellow",
    TaskState.SUCCEEDED: "green",
    TaskState.FAILED: "bold red",
    TaskState.CACHED: "cyan",
    TaskState.REUSED: "cyan",
}


class Reporter:
    """Receives run events; the base class stays silent (used by benchmarks and tests)."""

    def run_started(self, run: RunRecord) -> None: ...

    def task_changed(self, record: TaskRecord) -> None: ...

    def run_finished(self, run: RunRecord) -> None: ...

    def info(self, message: str) -> None: ...

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        yield


class PlainReporter(Reporter):
    """One line per event on stderr; right for logs and CI."""

    def __init__(self, stream=None) -> None:
        self._stream = stream

    @property
    def stream(self):
        return self._stream or sys.__stderr__

    def _print(self, text: str) -> None:
        print(f"[uniflow] {text}", file=self.stream, flush=True)

    def run_started(self, run: RunRecord) -> None:
        extra = f" (resuming {run.resumed_from})" if run.resumed_from else ""
        self._print(f"run {run.run_id} of {run.workflow} started{extra}")

    def task_changed(self, record: TaskRecord) -> None:
        if record.state == TaskState.PENDING:
            return
        text = f"task {record.call_id} {record.state.value}"
        if record.state != TaskState.RUNNING and record.duration_s is not None:
            text += f" in {record.duration_s:.2f}s"
        if record.source_run:
            text += f" (from run {record.source_run})"
        if record.error:
            text += f": {record.error['type']}: {record.error['message']}"
        self._print(text)

    def run_finished(self, run: RunRecord) -> None:
        took = (run.ended or time.time()) - run.started
        self._print(f"run {run.run_id} {run.state.value} in {took:.1f}s")

    def info(self, message: str) -> None:
        self._print(message)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        self._print(message)
        yield


class RichReporter(Reporter):
    """A live table of task states and a spinner for slow steps, for terminals."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self._records: dict[str, TaskRecord] = {}
        self._live = None
        self._status_text: str | None = None
        self._run: RunRecord | None = None

    def _render(self):
        from rich.console import Group
        from rich.spinner import Spinner
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("task")
        table.add_column("state")
        table.add_column("time", justify="right")
        for record in self._records.values():
            style = _STYLE[record.state]
            took = f"{record.duration_s:.1f}s" if record.duration_s is not None else ""
            table.add_row(record.call_id, f"[{style}]{record.state.value}[/]", took)
        parts = [table]
        if self._status_text:
            parts.append(Spinner("dots", text=self._status_text))
        return Group(*parts)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def run_started(self, run: RunRecord) -> None:
        from rich.live import Live

        self._run = run
        extra = f" (resuming {run.resumed_from})" if run.resumed_from else ""
        self.console.print(f"[bold]run[/] {run.run_id} of [bold]{run.workflow}[/]{extra}")
        self._live = Live(self._render(), console=self.console, refresh_per_second=8,
                          transient=False, redirect_stdout=False, redirect_stderr=False)
        self._live.start()

    def task_changed(self, record: TaskRecord) -> None:
        self._records[record.call_id] = record
        self._refresh()

    def run_finished(self, run: RunRecord) -> None:
        self._status_text = None
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None
        took = (run.ended or time.time()) - run.started
        style = "green" if run.state.value == "succeeded" else "red"
        self.console.print(f"run {run.run_id} [{style}]{run.state.value}[/] in {took:.1f}s")

    def info(self, message: str) -> None:
        self.console.print(message)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        self._status_text = message
        self._refresh()
        try:
            yield
        finally:
            self._status_text = None
            self._refresh()


def default_reporter() -> Reporter:
    stream = sys.__stderr__
    if stream is not None and stream.isatty():
        return RichReporter()
    return PlainReporter()
