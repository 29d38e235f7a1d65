"""Which Ray cluster deployments go to, and the Serve instance on it.

Order: the Ray connection this process already has (e.g. inside a RayTask), then
``RAY_ADDRESS``, then the standing cluster from ``michelangelo cluster up``. Serve is
started once per cluster with its HTTP proxy on ``host:port``; asking for another address
afterwards is refused, because Serve's proxy options cannot change while it runs.
"""

from __future__ import annotations

import os
from typing import Any

from michelangelo.lib.serving._errors import DeploymentError


def connect() -> None:
    """Connect this process to the cluster deployments live on (no-op when connected)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        from michelangelo.uniflow.plugins.ray import standing as _standing

        standing = _standing.find()
        if standing is not None:
            _standing.use_auth_of(standing)
            address = standing.address
    if not address:
        raise DeploymentError(
            "there is no Ray cluster to deploy on. Fix: run `michelangelo cluster up` (the "
            "endpoint then outlives this process), call deploy() inside a RayTask, set "
            "RAY_ADDRESS, or use `michelangelo serve PROJECT/MODEL` for a foreground endpoint.")
    ray.init(address=address, logging_level="WARNING")


def serve_client() -> Any | None:
    """The running Serve controller's client, or None when Serve is not started."""
    from ray.serve.context import _get_global_client

    return _get_global_client(raise_if_no_controller_running=False)


def ensure_serve(host: str, port: int) -> None:
    """Start Serve on ``host:port``, or check that the running one listens there."""
    from ray import serve

    client = serve_client()
    if client is None:
        # One proxy, on the head: the nodes of a local cluster share one host, so a proxy per
        # node would fight over the port.
        try:
            serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
        except Exception as exc:
            if "Failed to bind" not in str(exc):
                raise
            # A controller whose proxy never came up would pin this address for every later
            # deployment; take it down so the next try can choose another port.
            serve.shutdown()
            raise DeploymentError(
                f"Serve's HTTP proxy could not listen on {host}:{port}: something on the head "
                f"node already holds that port. Fix: pass another port=, or stop whatever "
                f"listens on {port}.") from None
        return
    config = client.http_config
    if (config.host, int(config.port)) != (host, int(port)):
        raise DeploymentError(
            f"Serve on this cluster already listens on {config.host}:{config.port}, so a "
            f"deployment cannot bind {host}:{port}. Fix: pass host={config.host!r}, "
            f"port={config.port}, or delete every deployment and shut Serve down first.")


def http_address() -> tuple[str, int] | None:
    client = serve_client()
    if client is None:
        return None
    return client.http_config.host, int(client.http_config.port)
