"""Entry point of the ``michelangelo`` command."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from michelangelo.cli._clusters import clusters
from michelangelo.cli._loading import load_target, parse_args
from michelangelo.cli._models import models
from michelangelo.cli._runs import runs
from michelangelo.cli._sandbox import sandbox
from michelangelo.cli._serving import cluster, deployments, serve_cmd


class _Group(click.Group):
    """Turns any error into one line (and a non-zero exit) unless ``--debug`` is given."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(click.style("error: ", fg="red", bold=True)
                       + f"{type(exc).__name__}: {exc}", err=True)
            click.echo("(run again with --debug for the traceback)", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="show full tracebacks")
@click.option("--verbose", is_flag=True,
              help="stream task and Ray output to the console (same as UF_VERBOSE=1)")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """Michelangelo: uniflow workflows on Ray, from a laptop to KubeRay."""
    ctx.obj = {"debug": debug}
    if verbose:
        import os

        os.environ["UF_VERBOSE"] = "1"  # read by uniflow when a run starts


@cli.command()
@click.argument("target")
@click.option("--arg", "args", multiple=True, metavar="KEY=VALUE",
              help="workflow argument (JSON values are parsed); repeatable")
@click.option("--resume", default=None, metavar="RUN_ID",
              help="reuse the succeeded tasks of an earlier run")
@click.option("--storage-url", default=None, help="overrides $UF_STORAGE_URL")
@click.option("--ray-address", default=None, metavar="URL",
              help="run each RayTask as a Ray job on this cluster (its dashboard URL, "
                   "e.g. http://HOST:8265): remote-run")
@click.option("--kuberay", is_flag=True,
              help="remote-run on Kubernetes: a KubeRay RayCluster per RayTask")
@click.option("--namespace", default=None, help="--kuberay: namespace of the RayClusters")
@click.option("--image", default=None, help="--kuberay: Ray image of every node")
@click.option("--kube-context", default=None, help="--kuberay: kubeconfig context")
@click.option("--sandbox", is_flag=True, help="--kuberay: the `michelangelo sandbox` cluster")
@click.option("--head-access", type=click.Choice(["auto", "pod", "port-forward"]), default=None,
              help="--kuberay: reach each head by its pod address, through the API server's "
                   "port-forward, or auto (the address when it answers, else port-forward)")
def run(target: str, args: tuple[str, ...], resume: str | None, storage_url: str | None,
        ray_address: str | None, kuberay: bool, namespace: str | None, image: str | None,
        kube_context: str | None, sandbox: bool, head_access: str | None) -> None:
    """Run FILE:WORKFLOW locally, or remotely with --ray-address or --kuberay."""
    from michelangelo.uniflow.core import Context

    given = {"ray_address": ray_address, "kuberay": kuberay or None, "namespace": namespace,
             "image": image, "kube_context": kube_context, "sandbox": sandbox or None,
             "head_access": head_access}
    options = {key: value for key, value in given.items() if value}
    if options:
        import michelangelo.uniflow.plugins.ray  # noqa: F401  (registers these options)
    mode = "remote-run" if ray_address or kuberay else "local-run"
    Context(mode, options=options)  # bad options fail here, before the file is even imported
    workflow = load_target(target)
    kwargs = parse_args(args)
    context = Context(mode, resume=resume, storage_url=storage_url, options=options)
    value = context.run(workflow, **kwargs)
    click.echo(f"run id: {context.last_run_id}")
    click.echo(f"result: {value!r}")


cli.add_command(runs)
cli.add_command(cluster)
cli.add_command(serve_cmd)
cli.add_command(deployments)
cli.add_command(clusters)
cli.add_command(models)
cli.add_command(sandbox)


def main() -> None:
    # SIGTERM unwinds like Ctrl-C so that clusters are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    cli()
