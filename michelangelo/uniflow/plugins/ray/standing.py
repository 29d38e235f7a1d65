"""The standing local Ray cluster of ``michelangelo cluster up``: start, find, stop.

A public face over the plugin's standing cluster (``_clusters._standing``), for the CLI, serving and
examples. While :func:`find` returns a cluster, RayTask runs borrow it (like ``RAY_ADDRESS``)
and serving deploys onto it.

Typical use::

    from michelangelo.uniflow.plugins.ray import standing

    cluster = standing.find()
    if cluster is not None:
        print(cluster.address)
"""

from michelangelo.uniflow.plugins.ray._clusters import STANDING_STATE_ENV as STATE_ENV
from michelangelo.uniflow.plugins.ray._clusters import StandingCluster
from michelangelo.uniflow.plugins.ray._clusters import find_standing as find
from michelangelo.uniflow.plugins.ray._clusters import read_standing as read
from michelangelo.uniflow.plugins.ray._clusters import standing_down as down
from michelangelo.uniflow.plugins.ray._clusters import standing_state_file as state_file
from michelangelo.uniflow.plugins.ray._clusters import standing_up as up
from michelangelo.uniflow.plugins.ray._clusters import use_standing_auth as use_auth_of

__all__ = ["STATE_ENV", "StandingCluster", "down", "find", "read", "state_file", "up",
           "use_auth_of"]
