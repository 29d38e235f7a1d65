"""One self-contained HTML page about a run: timeline, tasks, training curves, decisions.

Everything comes from what the run left in storage: ``run.json``, each call's
``record.json`` (state, attempts, times, outputs, error, ``artifacts``), the metric records
the trainer wrote, and the logs of failed attempts. Plots are inline SVG; the page loads
nothing from anywhere.
"""

from __future__ import annotations

import contextlib
import datetime
import html
import json
import posixpath
from collections import defaultdict
from typing import Any

from michelangelo.uniflow.core import time_and_resources
from michelangelo.uniflow.core.errors import RunNotFoundError
from michelangelo.uniflow.core.plugin import RunRecord, RunStore, Storage, TaskRecord
from michelangelo.uniflow.report._svg import line_chart, timeline

LOG_TAIL_LINES = 40
_REGISTRY_KINDS = ("registry_revision", "model_revision", "registration", "revision")
_DEPLOY_KINDS = ("deployment", "deploy", "serving", "rayservice")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1100px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px}table{border-collapse:collapse;margin:6px 0 12px}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.state-succeeded{color:#2ca02c}.state-failed{color:#d62728;font-weight:600}
.state-cached,.state-reused{color:#17becf}.muted{color:#777}
pre{background:#f6f6f6;border:1px solid #e2e2e2;padding:8px;overflow-x:auto;font-size:12px}
svg text{font-family:system-ui,Helvetica,Arial,sans-serif}svg .tick{font-size:11px;fill:#555}
svg .title{font-size:13px;font-weight:600}svg .legend,svg .note,svg .rowlabel{font-size:12px}
svg .axis{font-size:12px;fill:#555}.charts{display:flex;flex-wrap:wrap;gap:12px}
"""


def build_report(run_id: str, storage: Storage | None = None) -> str:
    """The HTML text of the report on ``run_id``.

    Raises:
        RunNotFoundError: No such run under the storage root.
    """
    storage = storage or Storage()
    store = RunStore(storage)
    run = store.load_run(run_id)
    if run is None:
        raise RunNotFoundError(f"no run {run_id!r} under {storage.url}. "
                               "List runs with `michelangelo runs list`.")
    tasks = store.load_tasks(run_id)
    parts = [_header(run, tasks),
             _timeline_section(run, tasks),
             _tasks_section(tasks),
             _time_and_resources_section(tasks),
             _training_section(store, run_id, tasks),
             _capacity_section(tasks),
             _registry_section(tasks),
             _other_artifacts_section(tasks),
             _failures_section(store, run_id, tasks)]
    body = "\n".join(p for p in parts if p)
    title = f"run {run.run_id} of {run.workflow}"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")


def write_report(run_id: str, path: str, storage: Storage | None = None) -> str:
    """Write the report of ``run_id`` to the local file ``path``; returns ``path``."""
    text = build_report(run_id, storage)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


# -- sections ------------------------------------------------------------------------------
def _header(run: RunRecord, tasks: list[TaskRecord]) -> str:
    took = _took(run.started, run.ended)
    rows = [("state", f'<span class="state-{_e(run.state.value)}">{_e(run.state.value)}</span>'),
            ("started", _e(_when(run.started))), ("took", _e(took)),
            ("tasks", str(len(tasks))), ("storage", _e(run.storage_url))]
    if run.resumed_from:
        rows.append(("resumed from", _e(run.resumed_from)))
    if run.arguments:
        rows.append(("arguments", _e(", ".join(f"{k}={v}" for k, v in run.arguments.items()))))
    if run.error:
        rows.append(("error", _e(f"{run.error.get('type')}: {run.error.get('message')}")))
    for batch in run.batches:  # how each concurrent batch was placed, and why
        rows.append((f"batch {_e(batch.get('batch'))}",
                     _e(f"{batch.get('branches')} branch(es) of "
                        f"{', '.join(batch.get('tasks') or [])}, {batch.get('at_once')} at once "
                        f"({'; '.join(batch.get('why') or [])})")))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f"<h1>Run {_e(run.run_id)}</h1><div class=\"muted\">workflow "
            f"<b>{_e(run.workflow)}</b></div><table>{table}</table>")


def _timeline_section(run: RunRecord, tasks: list[TaskRecord]) -> str:
    starts = [t.started for t in tasks if t.started] + [run.started]
    ends = [t.ended for t in tasks if t.ended] + [run.ended or run.started]
    rows = []
    for task in tasks:
        note = f"{task.state.value}"
        if task.started and task.ended:
            note += f", {task.ended - task.started:.1f}s"
        if task.attempts > 1:
            note += f", {task.attempts} attempts"
        rows.append({"label": task.call_id, "start": task.started, "end": task.ended,
                     "state": task.state.value, "note": note})
    svg = timeline(rows, start=min(starts), end=max(ends))
    return f'<h2>Timeline</h2><div id="timeline">{svg}</div>' if svg else ""


def _tasks_section(tasks: list[TaskRecord]) -> str:
    head = ("<tr><th>task</th><th>state</th><th>attempts</th><th>took</th><th>cluster</th>"
            "<th>output</th></tr>")
    rows = []
    for task in tasks:
        output = ""
        if task.output:
            summary = (task.output.get("meta") or {}).get("summary", "")
            output = f"{_e(summary)}<br><span class=\"muted\">{_e(task.output['folder'])}</span>"
        if task.source_run:
            output += f"<br><span class=\"muted\">from run {_e(task.source_run)}</span>"
        rows.append(
            f"<tr><td>{_e(task.call_id)}</td>"
            f'<td class="state-{_e(task.state.value)}">{_e(task.state.value)}</td>'
            f"<td>{task.attempts}</td><td>{_e(_took(task.started, task.ended))}</td>"
            f"<td>{_e(task.config or 'local process')}</td><td>{output}</td></tr>")
    return f"<h2>Tasks</h2><table id=\"tasks\">{head}{''.join(rows)}</table>"


def _time_and_resources_section(tasks: list[TaskRecord]) -> str:
    """Each task's phases (seconds) and the resource-hours it held; the run's total."""
    rows, total = time_and_resources(tasks)
    if not rows:
        return ""
    cells = []
    for task, phases, held in rows:
        steps = "".join(f"<li>{_e(name)}: {seconds:.1f} s</li>" for name, seconds in phases)
        cells.append(f"<tr><td>{_e(task.call_id)}</td><td><ul>{steps}</ul></td>"
                     f"<td>{_e(held)}</td></tr>")
    head = "<tr><th>task</th><th>phases</th><th>resources held</th></tr>"
    return (f"<h2>Where the time went</h2><table id=\"phases\">{head}{''.join(cells)}</table>"
            f"<div class=\"muted\">run total: {_e(total.describe())}</div>")


def _training_section(store: RunStore, run_id: str, tasks: list[TaskRecord]) -> str:
    blocks = []
    for task in tasks:
        for artifact in _of_kind(task, ("metrics",)):
            rows = _read_metrics(store, run_id, task, artifact)
            if not rows:
                continue
            charts = _charts(rows)
            last = _last_values(rows)
            summary = ", ".join(f"{k} {v:.4g}" for k, v in sorted(last.items()))
            blocks.append(
                f"<h3>{_e(task.call_id)}: {_e(artifact.get('name', 'training'))}</h3>"
                f"<div class=\"muted\">{len(rows)} logged values; last: {_e(summary)}</div>"
                f"<div class=\"charts\">{''.join(charts)}</div>")
    if not blocks:
        return ""
    return "<h2>Training</h2><div id=\"training\">" + "".join(blocks) + "</div>"


def _charts(rows: list[dict]) -> list[str]:
    by_name: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        if row.get("name") in ("epoch", "step") or row.get("value") is None:
            continue
        by_name[row["name"]].append((float(row.get("step", 0)), float(row["value"])))
    losses = {k: v for k, v in by_name.items() if "loss" in k.lower()}
    others = {k: v for k, v in by_name.items() if k not in losses}
    charts = []
    if losses:
        charts.append(line_chart(losses, title="loss"))
    for name, values in sorted(others.items()):
        charts.append(line_chart({name: values}, title=name))
    return [c for c in charts if c]


def _capacity_section(tasks: list[TaskRecord]) -> str:
    rows = []
    for task in tasks:
        for entry in _of_kind(task, ("capacity",)):
            verdict = "fits" if entry.get("fits") else "does not fit"
            rows.append(
                f"<tr><td>{_e(task.call_id)}</td><td>{_e(entry.get('scaling_config'))}</td>"
                f"<td>{_e(entry.get('workers'))} x {_e(entry.get('per_worker'))}</td>"
                f"<td>{_e(entry.get('cluster'))}</td><td>{_e(entry.get('placeable'))}</td>"
                f'<td class="state-{"succeeded" if entry.get("fits") else "failed"}">'
                f"{verdict}</td></tr>")
    if not rows:
        return ""
    head = ("<tr><th>task</th><th>ScalingConfig</th><th>workers</th><th>cluster</th>"
            "<th>placeable</th><th>decision</th></tr>")
    return f"<h2>Capacity decisions</h2><table id=\"capacity\">{head}{''.join(rows)}</table>"


def _registry_section(tasks: list[TaskRecord]) -> str:
    parts = []
    for title, kinds in (("Registry revisions", _REGISTRY_KINDS), ("Deployments", _DEPLOY_KINDS)):
        table = _generic_table(tasks, kinds)
        if table:
            parts.append(f"<h3>{title}</h3>{table}")
    if not parts:
        return ""
    return "<h2>Registry and deployments</h2><div id=\"registry\">" + "".join(parts) + "</div>"


def _other_artifacts_section(tasks: list[TaskRecord]) -> str:
    known = ("metrics", "capacity", "phases", "resources", *_REGISTRY_KINDS, *_DEPLOY_KINDS)
    kinds = sorted({a.get("kind", "") for t in tasks for a in t.artifacts} - set(known))
    table = _generic_table(tasks, tuple(kinds)) if kinds else ""
    return f"<h2>Other records</h2>{table}" if table else ""


def _failures_section(store: RunStore, run_id: str, tasks: list[TaskRecord]) -> str:
    blocks = []
    for task in tasks:
        if task.state.value != "failed" or not task.error:
            continue
        error = task.error
        text = [f"<h3>{_e(task.call_id)}: {_e(error.get('type'))}</h3>",
                f"<pre>{_e(str(error.get('message', ''))[:4000])}</pre>"]
        detail = error.get("detail") or {}
        if detail.get("lines"):
            text.append(f"<div>last lines of {_e(detail.get('worker', 'the worker'))}</div>"
                        f"<pre>{_e(''.join(line + chr(10) for line in detail['lines']))}</pre>")
        log = _log_tail(store, run_id, task)
        if log:
            text.append(f"<div>end of the task log (attempt {task.attempts})</div>"
                        f"<pre>{_e(log)}</pre>")
        if error.get("logs_command"):
            text.append(f"<div class=\"muted\">whole log: <code>{_e(error['logs_command'])}"
                        "</code></div>")
        blocks.append("".join(text))
    if not blocks:
        return ""
    return "<h2>Failures</h2><div id=\"failures\">" + "".join(blocks) + "</div>"


# -- helpers -------------------------------------------------------------------------------
def _generic_table(tasks: list[TaskRecord], kinds: tuple[str, ...]) -> str:
    entries = [(t, a) for t in tasks for a in t.artifacts if a.get("kind") in kinds]
    if not entries:
        return ""
    fields: list[str] = []
    for _, artifact in entries:
        # A field named with a leading underscore is for programs, not for the report.
        fields += [k for k in artifact if k not in ("kind", "time") and not k.startswith("_")
                   and k not in fields]
    head = "<tr><th>task</th><th>kind</th>" + "".join(f"<th>{_e(f)}</th>" for f in fields)
    rows = []
    for task, artifact in entries:
        cells = "".join(f"<td>{_e(_text(artifact.get(f, '')))}</td>" for f in fields)
        rows.append(f"<tr><td>{_e(task.call_id)}</td><td>{_e(artifact.get('kind'))}</td>"
                    f"{cells}</tr>")
    return f"<table>{head}</tr>{''.join(rows)}</table>"


def _of_kind(task: TaskRecord, kinds: tuple[str, ...]) -> list[dict]:
    return [a for a in task.artifacts if a.get("kind") in kinds]


def _read_metrics(store: RunStore, run_id: str, task: TaskRecord, artifact: dict) -> list[dict]:
    relative = artifact.get("path")
    if not relative:
        return []
    path = posixpath.join(store.call_dir(run_id, task.call_id), relative)
    try:
        text = store.storage.read_bytes(path).decode(errors="replace")
    except (FileNotFoundError, OSError):
        return []
    rows = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def _last_values(rows: list[dict]) -> dict[str, float]:
    last: dict[str, float] = {}
    for row in rows:
        if row.get("name") not in ("epoch", "step") and row.get("value") is not None:
            last[row["name"]] = float(row["value"])
    return last


def _log_tail(store: RunStore, run_id: str, task: TaskRecord) -> str:
    path = store.log_path(run_id, task.call_id, max(task.attempts, 1))
    try:
        text = store.storage.read_bytes(path).decode(errors="replace")
    except (FileNotFoundError, OSError):
        return ""
    # Progress bars redraw with carriage returns: keep each line's final state.
    lines = [part.split("\r")[-1] for part in text.splitlines()]
    return "\n".join([line for line in lines if line.strip()][-LOG_TAIL_LINES:])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _e(value: Any) -> str:
    return html.escape(str(value) if value is not None else "")


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _took(start: float | None, end: float | None) -> str:
    return f"{end - start:.1f}s" if start and end else ""
