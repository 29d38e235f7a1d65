"""What a person sees while a run goes: task states live, spinners, one-line notices."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from michelangelo.uniflow.core._logs import ConsoleFile, console_stream, verbose
from michelangelo.uniflow.core._records import RunRecord, TaskRecord, TaskState

_STYLE = {
    TaskState.PENDING: "dim",
    TaskState.RUNNING: "yellow",
    TaskState.SUCCEEDED: "green",
    TaskState.FAILED: "bold red",
    TaskState.CACHED: "cyan",
    TaskState.REUSED: "cyan",
}


PLAIN_PROGRESS_EVERY_S = 10.0  # without a terminal, one progress line per training this often


def format_progress(state: dict[str, Any]) -> str:
    """``epoch 2/3  step 150/300  1,234 rows/s  ETA 0:12  train_loss 0.123`` from a state."""
    parts = []
    if state.get("max_epochs"):
        parts.append(f"epoch {state.get('epoch', 0) + 1}/{state['max_epochs']}")
    if state.get("step") is not None:
        total = state.get("total_steps")
        parts.append(f"step {state['step']}/{total}" if total else f"step {state['step']}")
    if state.get("rows_per_s"):
        parts.append(f"{state['rows_per_s']:,.0f} rows/s")
    if state.get("eta_s") is not None and not (state.get("done") or state.get("stopped")):
        parts.append(f"ETA {_clock(state['eta_s'])}")
    for name, value in sorted((state.get("metrics") or {}).items()):
        parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}")
    if state.get("done"):
        parts.append("done")
    elif state.get("stopped"):
        parts.append("stopped")
    return "  ".join(parts)


def in_flight(records: dict[str, TaskRecord]) -> str:
    """``in flight: 002-train[0], 002-train[2]`` while branches of a batch run, else ``""``."""
    running = [r.call_id for r in records.values()
               if r.state == TaskState.RUNNING and "[" in r.call_id]
    return f"in flight: {', '.join(running)}" if running else ""


def _clock(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def failure_lines(record: TaskRecord) -> list[str]:
    """What a failed task tells the person at the console, one entry per line."""
    error = record.error or {}
    attempts = f" after {record.attempts} attempts" if record.attempts > 1 else ""
    lines = [f"task {record.call_id} failed{attempts}: {error.get('type')}: "
             f"{_first_lines(error.get('message', ''), 6)}"]
    detail = error.get("detail") or {}
    if detail.get("lines"):
        where = detail.get("worker") or "worker"
        lines.append(f"last {len(detail['lines'])} log lines of {where}"
                     + (f" ({detail['source']})" if detail.get("source") else "") + ":")
        lines += ["  | " + line.rstrip("\n")[:300] for line in detail["lines"]]
    if error.get("logs_command"):
        lines.append(f"whole log: {error['logs_command']}")
    return lines


def _first_lines(text: str, count: int) -> str:
    """The start and the end of a long message (a traceback's last line says the most)."""
    lines = str(text).splitlines()
    if len(lines) <= count:
        return str(text)
    head, tail = lines[:2], lines[-(count - 2):]
    return "\n".join([*head, f"... ({len(lines) - len(head) - len(tail)} lines)", *tail])


class Reporter:
    """Receives run events; the base class stays silent (used by benchmarks and tests).

    ``quiet`` tells the run to keep task output off the console (into the task logs):
    reporters that draw the console say yes unless ``UF_VERBOSE`` is set.
    """

    quiet = False

    def run_started(self, run: RunRecord) -> None: ...

    def task_changed(self, record: TaskRecord) -> None: ...

    def run_finished(self, run: RunRecord) -> None: ...

    def info(self, message: str) -> None: ...

    def warning(self, message: str) -> None:
        """A warning the user should see (the run shows each text once)."""

    def progress(self, key: str, state: dict[str, Any] | None) -> None:
        """Live progress of a long step (a training); ``None`` removes it."""

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        yield


class PlainReporter(Reporter):
    """One line per event on stderr; right for logs and CI."""

    def __init__(self, stream=None, *, quiet: bool | None = None,
                 progress_every_s: float = PLAIN_PROGRESS_EVERY_S) -> None:
        self._stream = stream
        self.quiet = (not verbose()) if quiet is None else quiet
        self._progress_every_s = progress_every_s
        self._progress_printed: dict[str, float] = {}
        self._last_progress: dict[str, dict] = {}
        self._finished: dict[str, dict] = {}
        self._branches: dict[str, TaskRecord] = {}
        self._lock = threading.Lock()

    @property
    def stream(self):
        return self._stream or console_stream()

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
        # One lock around the reckoning and the printing: a branch's event line and the
        # in-flight line that follows it stay together, and in the order the branches ended,
        # when two branches end at the same moment.
        with self._lock:
            flying = ""
            if "[" in record.call_id:  # a branch of a batch: say which branches now run
                self._branches[record.call_id] = record
                flying = in_flight(self._branches)
                if record.state != TaskState.RUNNING and not flying:
                    self._branches.clear()
            if record.state == TaskState.FAILED and record.error:
                for line in failure_lines(record):
                    self._print(line)
            else:
                self._print(text)
            if flying and record.state != TaskState.RUNNING:
                self._print(f"  {flying}")

    def run_finished(self, run: RunRecord) -> None:
        took = (run.ended or time.time()) - run.started
        self._print(f"run {run.run_id} {run.state.value} in {took:.1f}s")

    def info(self, message: str) -> None:
        self._print(message)

    def warning(self, message: str) -> None:
        self._print(f"warning: {message}")

    def progress(self, key: str, state: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if state is None:
            last = self._last_progress.pop(key, None)
            self._progress_printed.pop(key, None)
            self._finished.pop(key, None)
            if last is not None and not last.get("done"):
                # Removed before the workers said done: the training failed or was stopped.
                self._print(f"{key}: {format_progress(dict(last, stopped=True))}")
            return
        if state.get("done"):
            # The driver keeps polling until the task ends: say "done" once, not per poll.
            if self._finished.get(key) == state:
                return
            self._finished[key] = state
        self._last_progress[key] = state
        printed = self._progress_printed.get(key)
        if state.get("done") or printed is None or now - printed >= self._progress_every_s:
            self._progress_printed[key] = now
            self._print(f"{key}: {format_progress(state)}")
            if state.get("done"):
                self._last_progress.pop(key, None)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        self._print(message)
        yield


class RichReporter(Reporter):
    """A live table of task states, progress bars and a spinner for slow steps (terminals)."""

    def __init__(self, *, quiet: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = Console(file=ConsoleFile(), stderr=True)
        self.quiet = (not verbose()) if quiet is None else quiet
        self._records: dict[str, TaskRecord] = {}
        self._live = None
        self._status_text: str | None = None
        self._run: RunRecord | None = None
        self._lock = threading.Lock()
        self._bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                              TextColumn("{task.fields[info]}"), console=self.console,
                              auto_refresh=False)
        self._bar_ids: dict[str, Any] = {}

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
        flying = in_flight(self._records)
        if flying:
            parts.append(flying)
        if self._bar_ids:
            parts.append(self._bars)
        if self._status_text:
            parts.append(Spinner("dots", text=self._status_text))
        return Group(*parts)

    def _refresh(self) -> None:
        with self._lock:
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
        with self._lock:  # concurrent branches report from their own threads
            self._records[record.call_id] = record
        self._refresh()
        if record.state == TaskState.FAILED and record.error:
            from rich.markup import escape

            lines = failure_lines(record)
            self.console.print(f"[bold red]{escape(lines[0])}[/]")
            for line in lines[1:]:
                self.console.print(escape(line), highlight=False)

    def progress(self, key: str, state: dict[str, Any] | None) -> None:
        with self._lock:
            bar = self._bar_ids.get(key)
            if state is None:
                if bar is not None:
                    self._bars.remove_task(bar)
                    del self._bar_ids[key]
            else:
                total = state.get("total_steps") or None
                info = format_progress(state)
                if bar is None:
                    self._bar_ids[key] = self._bars.add_task(key, total=total, info=info)
                    bar = self._bar_ids[key]
                self._bars.update(bar, total=total, completed=state.get("step") or 0, info=info)
        self._refresh()

    def warning(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"[yellow]warning[/]: {escape(message)}")

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
