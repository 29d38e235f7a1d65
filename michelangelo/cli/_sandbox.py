"""``michelangelo sandbox``: a kind cluster with KubeRay and MinIO for ``--kuberay`` runs."""

from __future__ import annotations

import sys

import click


@click.group()
def sandbox() -> None:
    """A local KubeRay sandbox on kind (needs Docker): doctor, create, status, delete."""


@sandbox.command()
@click.option("--build-images", is_flag=True,
              help="check for 'create --build-images' (Go and debootstrap instead of helm)")
def doctor(build_images: bool) -> None:
    """Check docker, kind, kubectl and helm, the Docker engine's setup (drivers, cgroups,
    capabilities), and say how to fix what is missing."""
    from michelangelo.sandbox import doctor as run_doctor

    reports = run_doctor(build_images=build_images)
    for report in reports:
        mark = click.style("ok  ", fg="green") if report.ok else click.style("FAIL", fg="red")
        version = report.version or "-"
        click.echo(f"{mark} {report.name:<14} {version:<10} {report.path or ''}")
        if not report.ok:
            click.echo(f"     {report.problem}")
            click.echo(f"     fix: {report.fix}")
    if not all(r.ok for r in reports):
        sys.exit(1)
    flag = " --build-images" if build_images else ""
    click.echo(f"all set: run 'michelangelo sandbox create{flag}'")


@sandbox.command()
@click.option("--project-dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="source checkout the runtime image installs (default: the one this "
                   "package was installed from)")
@click.option("--wait", default="300s", show_default=True,
              help="how long to wait for each deployment and the bucket job")
@click.option("--build-images", is_flag=True,
              help="build every image on this machine from Debian's packages, the Go module "
                   "proxy and PyPI, pulling none (for machines that reach no image "
                   "registry); cached by version, so a second create builds nothing")
@click.option("--images-only", is_flag=True,
              help="with --build-images: build (or find) every image, and create no cluster "
                   "(to prepare a machine ahead of time)")
def create(project_dir: str | None, wait: str, build_images: bool, images_only: bool) -> None:
    """Create the sandbox, or complete it; running it again changes nothing."""
    from michelangelo.sandbox import CreateOptions, create_sandbox

    options = CreateOptions(project_root=project_dir, wait=wait, build_images=build_images,
                            images_only=images_only)
    settings = create_sandbox(options, click.echo)
    if settings is None:
        click.echo("images ready; 'michelangelo sandbox create --build-images' now builds none")
        return
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
