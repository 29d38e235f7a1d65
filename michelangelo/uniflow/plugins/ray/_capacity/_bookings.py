"""What concurrent branches hold on the cluster they share, so none oversubscribes it.

Ray accepts a worker group that does not fit what is free and leaves it pending. Branches
of one batch would race for the same free CPUs that way. Each Ray Train dispatch instead
books its workers here, node by node, against the cluster's declared nodes minus what the
other branches booked; one that finds no room waits, saying so once, until a branch that
holds room ends its fit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping

from michelangelo.uniflow.core.plugin import wait_awake
from michelangelo.uniflow.plugins.ray._capacity._shapes import (
    ClusterShape,
    NodeShape,
    _describe_request,
    placeable,
)


class Ledger:
    """Resources booked by the Ray Train worker groups running on one cluster."""

    def __init__(self, shape: ClusterShape) -> None:
        self.shape = shape
        self._cond = threading.Condition()
        self._held: dict[str, list[tuple[int, dict[str, float]]]] = {}

    def free(self) -> list[dict[str, float]]:
        """Per node: its declared resources minus what is booked on it."""
        with self._cond:
            return self._free()

    def _free(self) -> list[dict[str, float]]:
        free = [dict(node.resources) for node in self.shape.nodes]
        for booking in self._held.values():
            for index, request in booking:
                for key, amount in request.items():
                    free[index][key] = free[index].get(key, 0.0) - amount
        return free

    def _place(self, workers: int, request: Mapping[str, float]
               ) -> list[tuple[int, dict[str, float]]] | None:
        free = self._free()
        booking = []
        for _ in range(workers):
            for index, left in enumerate(free):
                if all(left.get(k, 0.0) + 1e-9 >= v for k, v in request.items() if v > 0):
                    for key, amount in request.items():
                        left[key] = left.get(key, 0.0) - amount
                    booking.append((index, dict(request)))
                    break
            else:
                return None
        return booking

    @contextlib.contextmanager
    def hold(self, who: str, workers: int, request: Mapping[str, float],
             announce: Callable[[str], None]) -> Iterator[None]:
        """Book ``workers`` x ``request`` for ``who`` while the block runs; wait for room.

        With nothing else booked the booking is made even where the declared nodes cannot
        hold it: the capacity check before it has already said whether it can ever fit.
        """
        waited = False
        mine: list[tuple[int, dict[str, float]]] | None = None
        # One try around all of it: whatever ends the hold early (a Ctrl-C while the room is
        # announced, say) still gives the booking back, and only this hold's booking.
        try:
            with self._cond:
                while True:
                    booking = self._place(workers, request)
                    if booking is not None or not self._held:
                        mine = booking or []
                        self._held[who] = mine
                        break
                    if not waited:
                        waited = True
                        shape = ClusterShape.from_nodes(tuple(
                            NodeShape(n.name, {k: max(0.0, v) for k, v in f.items()})
                            for n, f in zip(self.shape.nodes, self._free(), strict=True)),
                            "what is left")
                        announce(
                            f"{who} waits for room on the shared Ray cluster: it needs "
                            f"{workers} worker(s) x {_describe_request(request)}, "
                            f"{shape.describe()} holds {placeable(shape, request)}; held by "
                            f"{', '.join(sorted(self._held))}"
                        )
                    # Awake, so that an error raised in this thread (its task's timeout, or
                    # a stop) ends the wait while the holders keep the room.
                    wait_awake(self._cond.wait)
            if waited:
                announce(f"{who} has room on the shared Ray cluster now; dispatching")
            yield
        finally:
            with self._cond:
                if mine is not None and self._held.get(who) is mine:
                    del self._held[who]
                self._cond.notify_all()
