"""``michelangelo clusters``: the KubeRay clusters uniflow made, and their removal."""

from __future__ import annotations

import datetime

import click
from rich.console import Console
from rich.table import Table

console = Console()


def _api(kube_context: str | None):
    from michelangelo.uniflow.plugins.ray.kuberay import KubeApi, KubeTarget

    return KubeApi(KubeTarget(context=kube_context))


def _store(storage_url: str | None):
    from michelangelo.uniflow.core.plugin import RunStore, Storage

    return RunStore(Storage(storage_url))


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


_COMMON = [
    click.option("--kube-context", default=None, help="kubeconfig context (default: current)"),
    click.option("--namespace", "-n", default=None, help="one namespace (default: all)"),
    click.option("--storage-url", default=None,
                 help="where the runs are kept (overrides $UF_STORAGE_URL)"),
]


def _common(fn):
    for option in reversed(_COMMON):
        fn = option(fn)
    return fn


@click.group("clusters")
def clusters() -> None:
    """KubeRay RayClusters made by uniflow runs (labelled with their run and task)."""


@clusters.command("list")
@_common
def list_clusters(kube_context: str | None, namespace: str | None,
                  storage_url: str | None) -> None:
    """Show each cluster, its run and task, and whether `clusters gc` would remove it."""
    from michelangelo.uniflow.plugins.ray.kuberay import managed_clusters

    found = managed_clusters(_api(kube_context), _store(storage_url), namespace=namespace)
    if not found:
        click.echo("no uniflow RayClusters")
        return
    table = Table("namespace", "name", "run", "task", "ready", "expires", "gc")
    for c in found:
        table.add_row(c.namespace, c.name, c.run_id, c.task, "yes" if c.ready else "no",
                      _when(c.expires_at), ("remove: " if c.garbage else "keep: ") + c.reason)
    console.print(table)


@clusters.command("gc")
@_common
@click.option("--dry-run", is_flag=True, help="only say what would be removed")
def gc_clusters(kube_context: str | None, namespace: str | None, storage_url: str | None,
                dry_run: bool) -> None:
    """Delete clusters whose run has ended, is gone from storage, or that expired."""
    from michelangelo.uniflow.plugins.ray.kuberay import collect_garbage

    removed = collect_garbage(_api(kube_context), _store(storage_url), namespace=namespace,
                              dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for c in removed:
        click.echo(f"{verb} {c.namespace}/{c.name} (run {c.run_id or '?'}: {c.reason})")
    click.echo(f"{len(removed)} cluster(s) {verb}")
