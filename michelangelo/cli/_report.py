"""``michelangelo runs report``: write a run's report as one HTML file."""

from __future__ import annotations

import click

from michelangelo.uniflow.core.plugin import Storage


@click.command("report")
@click.argument("run_id")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="where to write the page (default: report-RUN_ID.html)")
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
def report(run_id: str, output: str | None, storage_url: str | None) -> None:
    """Write RUN_ID's report: timeline, tasks, training curves, capacity, failures.

    The page is self-contained (inline SVG, no scripts), so it opens offline.
    """
    from michelangelo.uniflow.report import write_report

    path = write_report(run_id, output or f"report-{run_id}.html", Storage(storage_url))
    click.echo(f"report written to {path}")
