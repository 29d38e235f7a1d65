"""The run report from records alone: fast runs of local tasks (no Ray) and the SVG parts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

import michelangelo.uniflow.core as uniflow
from michelangelo.uniflow.core._console import Reporter
from michelangelo.uniflow.core._records import RunStore
from michelangelo.uniflow.core._storage import Storage
from michelangelo.uniflow.core.errors import RunNotFoundError
from michelangelo.uniflow.report import build_report, write_report
from michelangelo.uniflow.report._svg import line_chart, nice_ticks, timeline

from ._png import count_near, read_png


@uniflow.task()
def fake_training(steps: int) -> dict:
    call = uniflow.current_call()
    os.makedirs(os.path.join(call.call_dir, "metrics"), exist_ok=True)
    with open(os.path.join(call.call_dir, "metrics", "fit.jsonl"), "w") as handle:
        for step in range(steps):
            for name, value in (("train_loss", 1.0 / (step + 1)), ("lr", 0.1)):
                handle.write(json.dumps({"name": name, "value": value, "step": step,
                                         "epoch": step // 5, "time": 1.0}) + "\n")
    uniflow.record_artifact("metrics", name="fit", path="metrics/fit.jsonl")
    uniflow.record_artifact("registry_revision", model="demo-model", revision=3)
    uniflow.record_artifact("deployment", name="demo", url="http://127.0.0.1:8000/demo")
    uniflow.record_artifact("custom", anything="<goes>")
    uniflow.record_phases("the fake cluster", [("cluster start", 12.25), ("fit", 30.0)])
    # Held for two hours before the task ends: 2 h x 4 CPU, 2 h x 8 GiB.
    uniflow.record_resources(cpu=4, memory_bytes=8 * 2**30, held_from=time.time() - 7200,
                             where="RayTask(head: 4 CPU)")
    return {"steps": steps}


@uniflow.task()
def broken(previous: dict) -> int:
    print("the last words of the broken task")
    raise KeyError("label")


@uniflow.workflow()
def flow(steps: int = 10) -> int:
    return broken(fake_training(steps))


@pytest.fixture()
def report():
    context = uniflow.Context(reporter=Reporter())
    with pytest.raises(KeyError):
        context.run(flow, 10)
    return context.last_run_id, build_report(context.last_run_id)


def test_report_sections_from_a_run(report):
    run_id, html = report
    assert html.startswith("<!DOCTYPE html>") and f"Run {run_id}" in html
    assert html.count('class="bar"') == 2
    tasks = html[html.index('id="tasks"'):]
    assert "001-fake_training" in tasks and "002-broken" in tasks and "local process" in tasks
    training = html[html.index('id="training"'):html.index('id="registry"')]
    assert training.count("<polyline") == 2  # the loss chart and the lr chart
    assert "train_loss 0.1" in training  # the last value
    registry = html[html.index('id="registry"'):]
    assert "demo-model" in registry and "http://127.0.0.1:8000/demo" in registry
    assert "&lt;goes&gt;" in html  # other records, escaped
    failures = html[html.index('id="failures"'):]
    assert "KeyError" in failures and "the last words of the broken task" in failures
    assert f"michelangelo runs logs {run_id} 002-broken" in failures
    assert "<script" not in html


def test_report_and_runs_show_say_where_the_time_went(report):
    from click.testing import CliRunner

    from michelangelo.cli._main import cli

    run_id, html = report
    section = html[html.index('id="phases"'):html.index('id="training"')]
    assert "cluster start: 12.2 s" in section and "fit: 30.0 s" in section
    # 4 CPU and 8 GiB held for two hours (and the few ms the task took after it said so).
    assert re.search(r"held 4 CPU, 8.0 GiB \(RayTask\(head: 4 CPU\)\) for 720\d\.\ds: "
                     r"8\.00\d\d CPU-h, 16\.0\d\d\d GiB-h memory", section), section
    assert "run total: 8.00" in section
    assert "002-broken" not in section  # nothing recorded there, no row
    shown = CliRunner().invoke(cli, ["runs", "show", run_id]).output
    where = shown[shown.index("where the time went:"):]
    assert "001-fake_training" in where and "cluster start 12.2s · fit 30.0s" in where
    assert "run total: 8.00" in where and "GiB-h memory" in where


def test_report_of_an_unknown_run_is_a_clear_error():
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        build_report("nope", Storage())


def test_records_keep_artifacts_across_reload(report):
    run_id, _ = report
    record = RunStore(Storage()).load_task(run_id, "001-fake_training")
    assert [a["kind"] for a in record.artifacts] == [
        "metrics", "registry_revision", "deployment", "custom", "phases", "resources"]


def test_nice_ticks_and_chart_geometry():
    assert nice_ticks(0, 10) == [0, 2.5, 5, 7.5, 10]
    assert nice_ticks(0.013, 0.094)[0] <= 0.013 and nice_ticks(0.013, 0.094)[-1] >= 0.094
    svg = line_chart({"a": [(0, 1.0), (5, 0.5), (10, 0.25)]}, title="loss",
                     width=400, height=200)
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    xs = [float(p.split(",")[0]) for p in points]
    ys = [float(p.split(",")[1]) for p in points]
    assert xs == sorted(xs) and ys == sorted(ys)  # falling loss: y grows downwards in SVG
    assert all(64 <= x <= 400 - 16 for x in xs) and all(28 <= y <= 200 - 40 for y in ys)
    assert line_chart({}, title="empty") == ""
    bars = timeline([{"label": "a", "start": 0.0, "end": 5.0, "state": "succeeded"},
                     {"label": "b", "start": 5.0, "end": 10.0, "state": "failed"}],
                    start=0.0, end=10.0)
    assert bars.count('class="bar"') == 2 and "#d62728" in bars


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is missing: `make setup` installs the Debian chromium package"
    return found


def test_report_draws_in_a_headless_browser(report, tmp_path):
    run_id, _ = report
    page = write_report(run_id, str(tmp_path / "report.html"))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1100,1600", f"--screenshot={shot}", f"file://{page}"],
        check=True, capture_output=True, timeout=120,
    )
    width, height, rows = read_png(str(shot))
    assert (width, height) == (1100, 1600)
    # Each chart's first series is drawn in blue (#1f77b4), the succeeded task's timeline bar
    # in green (#2ca02c) and the failed one's in red (#d62728): the plots are really drawn.
    # (Two legend squares of 10 x 10 blue pixels are all the blue there is besides lines.)
    assert count_near(rows, (0x1F, 0x77, 0xB4)) > 1000
    assert count_near(rows, (0x2C, 0xA0, 0x2C)) > 40
    assert count_near(rows, (0xD6, 0x27, 0x28)) > 40
