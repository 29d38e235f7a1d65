"""``michelangelo models``: list registered models, show one revision, move an alias.

The registry (and with it torch) is imported inside each command, so ``michelangelo --help``
stays fast.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

console = Console()

_REGISTRY_OPTION = click.option(
    "--registry", "registry_url", default=None, metavar="URL",
    help="registry root; default $MA_MODEL_REGISTRY_URL, else <$UF_STORAGE_URL>/model_registry")


def _registry(url: str | None) -> Any:
    from michelangelo.lib.model_registry import ModelRegistry

    return ModelRegistry(url)


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _metrics(metrics: dict[str, Any], limit: int = 4) -> str:
    items = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in list(metrics.items())[:limit]]
    return ", ".join(items) + (" ..." if len(metrics) > limit else "")


@click.group("models")
def models() -> None:
    """Registered models: revisions, lineage, aliases."""


@models.command("list")
@click.argument("project", required=False)
@_REGISTRY_OPTION
def list_models(project: str | None, registry_url: str | None) -> None:
    """Revisions of PROJECT (newest last), or every project's models."""
    registry = _registry(registry_url)
    if project is None:
        table = Table("project", "model", "revisions", "latest", "aliases", "updated")
        for name in registry.projects():
            by_model: dict[str, list[Any]] = {}
            for revision in registry.list(name):
                by_model.setdefault(revision.model_name, []).append(revision)
            for model, revisions in sorted(by_model.items()):
                latest = max(revisions, key=lambda r: r.revision_id)
                aliases = sorted(f"@{a}:{r.revision_id}" for r in revisions for a in r.aliases)
                table.add_row(name, model, str(len(revisions)), str(latest.revision_id),
                              " ".join(aliases), _when(max(r.created_at for r in revisions)))
        console.print(f"registry {registry.url}")
        console.print(table)
        return
    table = Table("model", "rev", "created", "aliases", "metrics", "source", "sha256")
    for revision in registry.list(project):
        table.add_row(revision.model_name, str(revision.revision_id),
                      _when(revision.created_at), " ".join(f"@{a}" for a in revision.aliases),
                      _metrics(revision.metrics), revision.lineage.get("source", ""),
                      revision.weights_sha256[:12])
    console.print(table)


@models.command("show")
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True, help="print the revision as JSON")
@_REGISTRY_OPTION
def show(spec: str, as_json: bool, registry_url: str | None) -> None:
    """One revision: PROJECT/MODEL (latest), PROJECT/MODEL:REV or PROJECT/MODEL@ALIAS."""
    registry = _registry(registry_url)
    revision = registry.get(spec)
    history = [h for h in registry.alias_history(revision.project_name, revision.model_name)]
    if as_json:
        click.echo(json.dumps({**revision.to_dict(), "alias_history": history}, indent=1))
        return
    console.print(f"[bold]{revision.name}[/]  created {_when(revision.created_at)}"
                  f"{' by ' + revision.created_by if revision.created_by else ''}")
    if revision.description:
        console.print(revision.description)
    console.print(f"weights: {revision.num_tensors} tensors, {revision.weights_bytes:,} bytes, "
                  f"sha256 {revision.weights_sha256}")
    if revision.optimizer_state:
        state = revision.optimizer_state
        console.print(f"optimizer state: kept (epoch {state['epoch']}, global step "
                      f"{state['global_step']})")
    factory = revision.factory
    if factory:
        where = factory.get("script_path") or factory.get("module")
        console.print(f"factory: {where}:{factory.get('qualname')}({factory.get('kwargs')})")
    else:
        console.print("factory: none recorded (load_model needs create_model_fn=)")
    _pairs("metrics", revision.metrics)
    _pairs("tags", revision.tags)
    _pairs("lineage", revision.lineage)
    _pairs("versions", revision.versions)
    if revision.signature:
        for side in ("inputs", "outputs"):
            console.print(f"{side}: " + ", ".join(
                f"{e['name']} {e['datatype']}{e['shape']}" for e in revision.signature[side]))
    console.print("aliases here: " + (" ".join(f"@{a}" for a in revision.aliases) or "none"))
    if history:
        table = Table("when", "alias", "from", "to", "who", title="alias history")
        for move in history:
            table.add_row(_when(move["when"]), move["alias"], str(move["from"] or "-"),
                          str(move["to"] or "removed"), move.get("who") or "")
        console.print(table)


def _pairs(title: str, values: dict[str, Any]) -> None:
    if not values:
        return
    console.print(f"{title}:")
    for key, value in values.items():
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        console.print(f"  {key}: {text}", soft_wrap=True)


@models.command("alias")
@click.argument("model")
@click.argument("alias")
@click.argument("revision")
@_REGISTRY_OPTION
def alias(model: str, alias: str, revision: str, registry_url: str | None) -> None:
    """Point ALIAS of PROJECT/MODEL at REVISION (a number, or another @alias)."""
    from michelangelo.lib.model_registry import parse_model_spec

    parsed = parse_model_spec(model)
    if parsed.revision_id is not None:
        raise click.BadParameter(f"{model!r} names a revision; give PROJECT/MODEL only.",
                                 param_hint="MODEL")
    registry = _registry(registry_url)
    registry.set_alias(parsed.project_name, parsed.model_name, alias,
                       int(revision) if revision.isdigit() else revision)
    target = registry.get(f"{parsed.project_name}/{parsed.model_name}@{alias.lstrip('@')}")
    click.echo(f"{parsed.project_name}/{parsed.model_name}@{alias.lstrip('@')} -> "
               f"{target.revision_id}")
