"""Remote runs: each RayTask as a Ray job on a cluster through the Jobs API.

``_run``: a task call as a job (cluster, versions and capacity checked first); ``_jobs``:
the Jobs API client; ``_working_dir``: the project packed for the job; ``_sdk_probe``:
whether the cluster's python has this SDK; ``_entry``: what the job runs there.
"""

from __future__ import annotations

from michelangelo.uniflow.plugins.ray._remote._run import (
    attempt as remote_attempt,
)
from michelangelo.uniflow.plugins.ray._remote._run import (
    plan_concurrency as plan_remote_concurrency,
)
from michelangelo.uniflow.plugins.ray._remote._run import (
    submit as submit_remote,
)

__all__ = [
    "plan_remote_concurrency",
    "remote_attempt",
    "submit_remote",
]
