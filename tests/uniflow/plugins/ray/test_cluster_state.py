"""A cluster's state moves only along the lifecycle table, and its timeline is those moves."""

from __future__ import annotations

import pytest

from michelangelo.errors import InternalError
from michelangelo.uniflow.plugins.ray.provisioning import ClusterState, RayCluster

S = ClusterState


class Cluster(RayCluster):
    """The base lifecycle alone: what every provisioner's cluster inherits."""

    def __init__(self) -> None:
        self.transition(S.PENDING)


@pytest.mark.parametrize("path", [
    [S.READY, S.DELETED],  # a local or an existing cluster
    [S.CREATED, S.SCHEDULED, S.HEAD_READY, S.READY, S.DELETED],  # KubeRay, every step seen
    [S.CREATED, S.HEAD_READY, S.READY, S.FAILED, S.DELETED],  # a step unseen, then a failure
    [S.FAILED, S.DELETED],
    [S.DELETED],  # shut down before it started
])
def test_the_legal_paths_and_the_timeline_they_leave(path):
    cluster = Cluster()
    for state in path:
        cluster.transition(state)
    assert cluster.state is path[-1]
    assert list(cluster.timeline) == ["pending", *(state.value for state in path)]
    stamps = list(cluster.timeline.values())
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(("path", "illegal"), [
    ([S.READY], S.HEAD_READY),  # back down the way up
    ([S.READY, S.DELETED], S.READY),  # a deleted cluster never comes back
    ([S.FAILED], S.READY),  # a failed one neither
    ([S.CREATED, S.SCHEDULED], S.CREATED),
])
def test_an_illegal_transition_raises_and_changes_nothing(path, illegal):
    cluster = Cluster()
    for state in path:
        cluster.transition(state)
    before = cluster.timeline
    with pytest.raises(InternalError, match=rf"{path[-1].value} -> {illegal.value} is not a "
                                            "cluster transition"):
        cluster.transition(illegal)
    assert cluster.state is path[-1] and cluster.timeline == before


def test_the_same_state_twice_and_advance_past_a_state_are_no_ops():
    cluster = Cluster()
    cluster.advance(S.SCHEDULED)
    cluster.advance(S.SCHEDULED)  # seen again on the next poll
    cluster.advance(S.HEAD_READY)
    cluster.advance(S.SCHEDULED)  # already past it
    cluster.transition(S.READY)
    cluster.transition(S.DELETED)
    cluster.transition(S.DELETED)  # shutdown() twice
    assert list(cluster.timeline) == ["pending", "scheduled", "head ready", "ready", "deleted"]
    assert cluster.timeline is not cluster.timeline  # a copy: only transitions write it


def test_every_state_has_a_row_and_only_deleted_is_final():
    assert {state for state in S if not any(state.can_become(o) for o in S)} == {S.DELETED}
    assert all(state.can_become(S.DELETED) for state in S if state is not S.DELETED)
