"""``sandbox delete``: the kind cluster (with everything in it), the settings file, and the
``kind`` Docker network once no kind cluster uses it.

The runtime image stays in Docker (it is rebuilt only when the project changes, and a
later ``create`` reuses it); ``docker image rm`` removes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from michelangelo.sandbox._commands import run
from michelangelo.sandbox._settings import CLUSTER_NAME, settings_path

KIND_NETWORK = "kind"  # the network kind creates for every cluster's nodes


def delete_sandbox(echo: Callable[[str], None] = print) -> bool:
    """Remove the sandbox; returns whether there was anything to remove."""
    removed = False
    if CLUSTER_NAME in run(("kind", "get", "clusters")).stdout.split():
        echo(f"deleting kind cluster '{CLUSTER_NAME}' (KubeRay, MinIO and all RayClusters) ...")
        run(("kind", "delete", "cluster", "--name", CLUSTER_NAME), timeout=600)
        removed = True
    else:
        echo(f"kind cluster '{CLUSTER_NAME}' does not exist")
    removed = _remove_unused_network(echo) or removed
    path = settings_path()
    if os.path.exists(path):
        os.unlink(path)
        echo(f"removed {path}")
        removed = True
    return removed


def _remove_unused_network(echo: Callable[[str], None]) -> bool:
    """Remove the Docker network kind made for its nodes (kind itself never does), but only
    when no kind cluster is left and no container is attached to it: another cluster's, or a
    user's container, keeps it."""
    if run(("kind", "get", "clusters")).stdout.split():
        return False
    attached = run(("docker", "network", "inspect", KIND_NETWORK, "--format",
                    "{{len .Containers}}"), check=False)
    if attached.returncode != 0 or attached.stdout.strip() != "0":
        return False  # no such network, or something still uses it
    run(("docker", "network", "rm", KIND_NETWORK))
    echo(f"removed Docker network '{KIND_NETWORK}' (no kind cluster or container uses it)")
    return True
