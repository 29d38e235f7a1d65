"""The standing local Ray cluster of ``michelangelo cluster up``: start, find, stop.

A public face over the plugin's private ``_standing`` module, for the CLI, serving and
examples. While :func:`find` returns a cluster, RayTask runs borrow it (like ``RAY_ADDRESS``)
and serving deploys onto it.

Typical use::

    from michelangelo.uniflow.plugins.ray import standing

    cluster = standing.find()
    if cluster is not None:
        print(cluster.address)
"""

from michelangelo.uniflow.plugins.ray._standing import (
    STATE_ENV,
    StandingCluster,
    down,
    find,
    read,
    state_file,
    up,
    use_auth_of,
)

__all__ = ["STATE_ENV", "StandingCluster", "down", "find", "read", "state_file", "up",
           "use_auth_of"]
