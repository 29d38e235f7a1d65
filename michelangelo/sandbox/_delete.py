"""``sandbox delete``: the kind cluster (with everything in it) and the settings file.

The runtime image stays in Docker (it is rebuilt only when the project changes, and a
later ``create`` reuses it); ``docker image rm`` removes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from michelangelo.sandbox._commands import run
from michelangelo.sandbox._settings import CLUSTER_NAME, settings_path


def delete_sandbox(echo: Callable[[str], None] = print) -> bool:
    """Remove the sandbox; returns whether there was anything to remove."""
    removed = False
    if CLUSTER_NAME in run(("kind", "get", "clusters")).stdout.split():
        echo(f"deleting kind cluster '{CLUSTER_NAME}' (KubeRay, MinIO and all RayClusters) ...")
        run(("kind", "delete", "cluster", "--name", CLUSTER_NAME), timeout=600)
        removed = True
    else:
        echo(f"kind cluster '{CLUSTER_NAME}' does not exist")
    path = settings_path()
    if os.path.exists(path):
        os.unlink(path)
        echo(f"removed {path}")
        removed = True
    return removed
