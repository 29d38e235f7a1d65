"""The Ray clusters tasks run on: their lifecycle, and the ways to get one.

``_cluster``: ``RayCluster`` and the checked ``ClusterState`` table every provisioner
follows; ``_local``: a cluster of local processes; ``_existing``: one that already runs at an
address; ``_standing``: the one ``michelangelo cluster up`` keeps; ``_provisioners``: the
registry that picks one per task; ``_reaper``: what a killed run left behind, removed;
``_ports``: free ports that two runs never share.
"""

from __future__ import annotations

from michelangelo.uniflow.plugins.ray._clusters._cluster import (
    ClusterState,
    RayCluster,
)
from michelangelo.uniflow.plugins.ray._clusters._local import (
    LocalRayCluster,
)
from michelangelo.uniflow.plugins.ray._clusters._ports import (
    free_port,
)
from michelangelo.uniflow.plugins.ray._clusters._provisioners import (
    ENTRY_POINT_GROUP,
    RunClusters,
    load_extensions,
    make_cluster,
    register_provisioner,
    register_run_provisioner,
    run_clusters_for,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    STATE_ENV as STANDING_STATE_ENV,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    StandingCluster,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    down as standing_down,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    find as find_standing,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    read as read_standing,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    state_file as standing_state_file,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    up as standing_up,
)
from michelangelo.uniflow.plugins.ray._clusters._standing import (
    use_auth_of as use_standing_auth,
)

__all__ = [
    "ClusterState",
    "ENTRY_POINT_GROUP",
    "LocalRayCluster",
    "RayCluster",
    "RunClusters",
    "STANDING_STATE_ENV",
    "StandingCluster",
    "find_standing",
    "free_port",
    "load_extensions",
    "make_cluster",
    "read_standing",
    "register_provisioner",
    "register_run_provisioner",
    "run_clusters_for",
    "standing_down",
    "standing_state_file",
    "standing_up",
    "use_standing_auth",
]
