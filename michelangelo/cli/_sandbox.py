"""``michelangelo sandbox``: a kind cluster with KubeRay and MinIO for ``--kuberay`` runs."""

from __future__ import annotations

import sys

import click


@click.group()
def sandbox() -> None:
    """A local KubeRay sandbox on kind (needs Docker): doctor, create, status, delete."""


@sandbox.command()
def doctor() -> None:
    """Check docker, kind, kubectl and helm (and say how to get what is missing)."""
    from michelangelo.sandbox import doctor as run_doctor

    reports = run_doctor()
    for report in reports:
        mark = click.style("ok  ", fg="green") if report.ok else click.style("FAIL", fg="red")
        version = report.version or "-"
        click.echo(f"{mark} {report.name:<14} {version:<10} {report.path or ''}")
        if not report.ok:
            click.echo(f"     {report.problem}")
            click.echo(f"     fix: {report.fix}")
    if not all(r.ok for r in reports):
        sys.exit(1)
    click.echo("all set: run 'michelangelo sandbox create'")


@sandbox.command()
@click.option("--project-dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="source checkout the runtime image installs (default: the one this "
                   "package was installed from)")
@click.option("--wait", default="300s", show_default=True,
              help="how long to wait for each deployment and the bucket job")
def create(project_dir: str | None, wait: str) -> None:
    """Create the sandbox, or complete it; running it again changes nothing."""
    from michelangelo.sandbox import CreateOptions, create_sandbox

    settings = create_sandbox(CreateOptions(project_root=project_dir, wait=wait), click.echo)
    click.echo("sandbox ready:")
    click.echo(f"  kube context  {settings.kube_context} (namespace {settings.namespace})")
    click.echo(f"  image         {settings.image}")
    click.echo(f"  storage       {settings.storage_url} at {settings.s3_endpoint}")
    click.echo("run a workflow there with: michelangelo run FILE:WORKFLOW --kuberay --sandbox")


@sandbox.command()
def status() -> None:
    """Show each part of the sandbox; exits 1 when a part is missing or not ready."""
    from michelangelo.sandbox import sandbox_status

    parts = sandbox_status()
    for part in parts:
        mark = click.style("ok  ", fg="green") if part.ok else click.style("--  ", fg="yellow")
        click.echo(f"{mark} {part.name:<16} {part.detail}")
    if not all(part.ok for part in parts):
        sys.exit(1)


@sandbox.command()
def delete() -> None:
    """Delete the kind cluster and the settings file (the image stays in Docker)."""
    from michelangelo.sandbox import delete_sandbox

    if not delete_sandbox(click.echo):
        click.echo("nothing to delete")
