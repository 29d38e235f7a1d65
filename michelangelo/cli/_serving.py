"""``michelangelo cluster up|status|down``, ``serve``, ``deployments list|status|canary|promote|rollback|delete``."""

from __future__ import annotations

import os
import tempfile
import time

import click


@click.group("cluster")
def cluster() -> None:
    """A long-lived local Ray cluster that runs and deployments attach to."""


@cluster.command("up")
@click.option("--cpus", default=2.0, show_default=True, help="logical CPUs per node")
@click.option("--workers", default=2, show_default=True, help="worker nodes besides the head")
@click.option("--memory", default="4Gi", show_default=True, help="logical memory per node")
def cluster_up(cpus: float, workers: int, memory: str) -> None:
    """Start the cluster and record where runs find it."""
    from michelangelo.uniflow.plugins.ray import RayTask
    from michelangelo.uniflow.plugins.ray import standing as _standing

    task = RayTask(head_cpu=cpus, head_memory=memory, worker_cpu=cpus, worker_memory=memory,
                   worker_instances=workers)
    click.echo(f"starting {task.describe()} ...")
    standing = _standing.up(task)
    click.echo(f"cluster up at {standing.address} (recorded in {_standing.state_file()})")
    click.echo(f"dashboard: {standing.dashboard_url}")
    click.echo("runs and deployments now use it; stop it with `michelangelo cluster down`")


@cluster.command("status")
def cluster_status() -> None:
    """Whether the cluster is up, where, and what it serves."""
    from michelangelo.uniflow.plugins.ray import standing as _standing

    standing = _standing.read()
    if standing is None:
        click.echo("no cluster is up (start one with `michelangelo cluster up`)")
        return
    if not standing.alive():
        click.echo(f"the cluster recorded in {_standing.state_file()} is gone; "
                   "`michelangelo cluster down` clears the record")
        raise SystemExit(1)
    up_for = time.time() - standing.started_at
    click.echo(f"cluster up at {standing.address} for {up_for:.0f}s, "
               f"{len(standing.node_pids)} node(s): {standing.ray_task().describe()}")
    click.echo(f"dashboard: {standing.dashboard_url}")


@cluster.command("down")
def cluster_down() -> None:
    """Stop the cluster's processes (only its own) and clear the record."""
    from michelangelo.uniflow.plugins.ray import standing as _standing

    stopped = _standing.down()
    if stopped is None:
        click.echo("no cluster is up")
        return
    click.echo(f"stopped the cluster at {stopped.address} ({len(stopped.node_pids)} node(s))")


@click.command("serve")
@click.argument("spec")
@click.option("--port", default=8000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--name", default=None, help="deployment name (default PROJECT-MODEL)")
@click.option("--replicas", default=1, show_default=True)
@click.option("--registry", default=None, help="registry root URL (default: $MA_MODEL_REGISTRY_URL)")
def serve_cmd(spec: str, port: int, host: str, name: str | None, replicas: int,
              registry: str | None) -> None:
    """Serve PROJECT/MODEL[:REV|@ALIAS] in the foreground until Ctrl-C."""
    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.lib.serving import deploy
    from michelangelo.uniflow.core import capture_output
    from michelangelo.uniflow.plugins.ray import LocalRayCluster, RayTask

    reg = ModelRegistry(registry)
    revision = reg.get(spec)  # a bad spec fails here, before any process starts
    cpus = max(1, replicas)
    log_dir = tempfile.mkdtemp(prefix="ma-serve-logs-")
    own = LocalRayCluster(RayTask(head_cpu=cpus, head_memory="2Gi"), log_dir)
    previous = os.environ.pop("RAY_ADDRESS", None)
    log = os.path.join(log_dir, "serve.log")
    say = _console_echo()
    say(f"starting a Ray cluster for {revision.name} (logs: {log}) ...")
    try:
        # Ray's and Serve's own lines go to the log, as in a run; --verbose shows them too.
        # Errors reach the console once the block has put stdout and stderr back.
        with capture_output(log, on_warning=lambda text: say(f"warning: {text}")):
            try:
                own.start()
                endpoint = deploy(revision.spec, name=name, num_replicas=replicas, host=host,
                                  port=port, registry=reg)
                say(f"serving {revision.name} at {endpoint.url}")
                say(f"  Open Inference Protocol: {endpoint.base_url}/v2/models/"
                    f"{endpoint.name} (also under {endpoint.url})")
                say("  try: " + endpoint.curl(_first_row(revision)))
                say("Ctrl-C to stop")
                while True:
                    time.sleep(1)
            finally:
                say("stopping ...")
                own.shutdown()
    finally:
        if previous is not None:
            os.environ["RAY_ADDRESS"] = previous


def _console_echo():
    """``echo`` to the terminal even while stdout and stderr point at the log file."""
    from michelangelo.uniflow.core import console_stream

    def say(text: str) -> None:
        click.echo(text, file=console_stream())

    return say


def _first_row(revision) -> object:
    example = (revision.input_example or {}).get("inputs") or {}
    rows = {n: t["data"][:1] for n, t in example.items()}
    return rows["input"] if list(rows) == ["input"] else rows


@click.group("deployments")
def deployments() -> None:
    """Endpoints on the connected cluster (RAY_ADDRESS or `cluster up`)."""


@deployments.command("list")
def deployments_list() -> None:
    """Every endpoint, its model revision and URL."""
    from michelangelo.lib.serving import list_deployments

    found = list_deployments()
    if not found:
        click.echo("no deployments")
        return
    for d in found:
        spec = f"{d.spec.project_name}/{d.spec.model_name}:{d.spec.revision_id}"
        line = f"{d.name}\t{spec}\t{d.description.num_replicas} replica(s)\t{d.url}"
        if d.rollout is not None:
            line += f"\t{d.rollout.describe()}"
        click.echo(line)


@deployments.command("status")
@click.argument("name")
def deployments_status(name: str) -> None:
    """The endpoint NAME: its revision, URL and canary rollout (or why it was rolled back)."""
    from michelangelo.lib.serving import get_deployment

    d = get_deployment(name)
    click.echo(f"{d.name}: {d.spec.project_name}/{d.spec.model_name}:{d.spec.revision_id}, "
               f"{d.description.num_replicas} replica(s) at {d.url}")
    click.echo(f"  rollout: {d.rollout.describe() if d.rollout else 'none'}")


@deployments.command("canary")
@click.argument("name")
@click.argument("spec")
@click.option("--share", default=0.2, show_default=True, type=float,
              help="share of requests the new revision answers (0 < share < 1)")
@click.option("--max-error-rate", default=None, type=float,
              help="roll back when more than this share of the canary's requests fail")
@click.option("--max-p99-ms", default=None, type=float,
              help="roll back when the canary's p99 latency is above this many milliseconds")
@click.option("--window", default=50, show_default=True,
              help="how many of the canary's latest requests the rollback judges")
@click.option("--registry", default=None, help="registry root URL (default: $MA_MODEL_REGISTRY_URL)")
def deployments_canary(name: str, spec: str, share: float, max_error_rate: float | None,
                       max_p99_ms: float | None, window: int, registry: str | None) -> None:
    """Run SPEC beside the endpoint NAME with --share of its requests."""
    from michelangelo.lib.serving import AutoRollback, deploy

    auto = None
    if max_error_rate is not None or max_p99_ms is not None:
        auto = AutoRollback(max_error_rate=max_error_rate, window=window,
                            max_p99_latency_s=None if max_p99_ms is None else max_p99_ms / 1000)
    d = deploy(spec, name=name, canary=share, auto_rollback=auto, registry=registry)
    click.echo(f"{d.name}: {d.rollout.describe() if d.rollout else 'no canary'}")
    click.echo(f"  promote with `michelangelo deployments promote {name}`, undo with "
               f"`michelangelo deployments rollback {name}`")


@deployments.command("promote")
@click.argument("name")
def deployments_promote(name: str) -> None:
    """Make the canary of NAME the endpoint's revision."""
    from michelangelo.lib.serving import promote

    d = promote(name)
    click.echo(f"promoted: {d.name} serves {d.spec.project_name}/{d.spec.model_name}:"
               f"{d.spec.revision_id} at {d.url}")


@deployments.command("rollback")
@click.argument("name")
def deployments_rollback(name: str) -> None:
    """Send all of NAME's traffic back to its revision and remove the canary."""
    from michelangelo.lib.serving import rollback

    rollout = rollback(name)
    click.echo(f"{name}: {rollout.describe()}")


@deployments.command("delete")
@click.argument("name")
def deployments_delete(name: str) -> None:
    """Remove the endpoint NAME."""
    from michelangelo.lib.serving import delete_deployment

    delete_deployment(name)
    click.echo(f"deleted {name}")
