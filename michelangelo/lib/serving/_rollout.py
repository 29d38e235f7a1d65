"""Canary rollouts: a share of an endpoint's requests goes to a new revision beside the old one.

The endpoint's Serve application keeps serving its stable revision; the canary revision runs
as a hidden application (``_canary-{name}``, no route of its own). Every request reaches a
stable replica first, on the endpoint's prefix or through the root ``/v2`` gateway, and that
replica's :class:`CanaryRouter` decides where it is answered: a deterministic weighted
choice (each replica sends exactly ``floor(n * share)`` of its ``n`` requests to the canary,
spread evenly) for ``POST /`` and ``.../infer``, and the canary always for paths that name
its revision (``/v2/models/{name}/versions/{rev}/...``).

What the split is lives in one small detached Ray actor per endpoint, the rollout record
(:class:`RolloutRecord`). Replicas read it at most :data:`REFRESH_S` seconds old and report
the canary's outcomes to it; with an :class:`AutoRollback` policy the record sends traffic
back to the stable revision when the canary's error rate or p99 latency over its last
``window`` requests passes the threshold, keeps the reason, and removes the canary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Any

from michelangelo.errors import InputError

logger = logging.getLogger("michelangelo.serving")

NAMESPACE = "michelangelo-serving"
CANARY_PREFIX = "_canary-"
# How old a replica's copy of the split may be when it routes a request.
REFRESH_S = 0.25
# How long traffic is off a canary before its replicas are removed (many REFRESH_S).
DRAIN_S = 2.0
CANARY = "canary"
ROLLED_BACK = "rolled_back"


def canary_app(name: str) -> str:
    """The hidden Serve application that runs ``name``'s canary revision."""
    return f"{CANARY_PREFIX}{name}"


def record_name(name: str) -> str:
    return f"rollout-{name}"


@dataclasses.dataclass(frozen=True)
class AutoRollback:
    """When to send traffic back to the stable revision without being asked.

    The canary's last ``window`` requests are judged once that many have been answered; a
    request failed when the canary answered 5xx, could not be reached, or its model raised.

    Args:
        max_error_rate: Roll back when more than this share of the window failed (0 to 1).
        max_p99_latency_s: Roll back when the window's 99th percentile latency is above this.
        window: How many of the canary's most recent requests are judged.
    """

    max_error_rate: float | None = None
    max_p99_latency_s: float | None = None
    window: int = 50

    def __post_init__(self) -> None:
        if self.max_error_rate is None and self.max_p99_latency_s is None:
            raise InputError("AutoRollback needs max_error_rate=, max_p99_latency_s= or both. "
                             "Fix: e.g. AutoRollback(max_error_rate=0.05).")
        if self.max_error_rate is not None and not (
                isinstance(self.max_error_rate, int | float) and 0 <= self.max_error_rate < 1):
            raise InputError(f"AutoRollback max_error_rate={self.max_error_rate!r} must be a "
                             "share in [0, 1). Fix: e.g. 0.05 for 5%.")
        if self.max_p99_latency_s is not None and not (
                isinstance(self.max_p99_latency_s, int | float) and self.max_p99_latency_s > 0):
            raise InputError(f"AutoRollback max_p99_latency_s={self.max_p99_latency_s!r} must be "
                             "a number of seconds > 0. Fix: e.g. 0.5.")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise InputError(f"AutoRollback window={self.window!r} must be an integer >= 1 "
                             "(requests). Fix: e.g. 50.")

    def verdict(self, outcomes: list[tuple[bool, float]]) -> str | None:
        """Why the last ``window`` outcomes ``(failed, latency_s)`` call for a rollback, or None."""
        if len(outcomes) < self.window:
            return None
        last = outcomes[-self.window:]
        if self.max_error_rate is not None:
            rate = sum(failed for failed, _ in last) / len(last)
            if rate > self.max_error_rate:
                return (f"error rate {rate:.0%} over the canary's last {len(last)} requests is "
                        f"above max_error_rate={self.max_error_rate}")
        if self.max_p99_latency_s is not None:
            p99 = percentile([latency for _, latency in last], 99)
            if p99 > self.max_p99_latency_s:
                return (f"p99 latency {p99 * 1000:.0f} ms over the canary's last {len(last)} "
                        f"requests is above max_p99_latency_s={self.max_p99_latency_s}")
        return None


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclasses.dataclass(frozen=True)
class Rollout:
    """Where a canary rollout of one endpoint stands (``Deployment.rollout``).

    Attributes:
        stable_revision: The revision the endpoint serves.
        canary_revision: The revision beside it.
        canary_share: The share of requests the canary gets now (0 once rolled back).
        state: ``"canary"`` while it takes traffic, ``"rolled_back"`` afterwards.
        reason: Why it was rolled back (by hand, or the automatic rollback's measurement).
        canary_requests: Requests the canary answered so far.
        canary_failures: Of those, how many failed.
        auto_rollback: The automatic rollback policy, if any.
    """

    stable_revision: int
    canary_revision: int
    canary_share: float
    state: str
    reason: str | None = None
    canary_requests: int = 0
    canary_failures: int = 0
    auto_rollback: AutoRollback | None = None

    def describe(self) -> str:
        """One line for the console."""
        if self.state == ROLLED_BACK:
            return (f"canary revision {self.canary_revision} rolled back "
                    f"({self.canary_failures}/{self.canary_requests} canary requests failed): "
                    f"{self.reason}")
        return (f"canary revision {self.canary_revision} takes {self.canary_share:.0%} beside "
                f"revision {self.stable_revision} ({self.canary_failures}/"
                f"{self.canary_requests} canary requests failed)")


class RolloutRecord:
    """The split of one endpoint, as a detached Ray actor (see the module docstring)."""

    def __init__(self, name: str, stable_revision: int, canary_revision: int, share: float,
                 auto_rollback: dict[str, Any] | None) -> None:
        self.name = name
        self.stable_revision = stable_revision
        self.canary_revision = canary_revision
        self.share = share
        self.state = CANARY
        self.reason: str | None = None
        self.auto = AutoRollback(**auto_rollback) if auto_rollback else None
        self.outcomes: list[tuple[bool, float]] = []
        self.requests = 0
        self.failures = 0
        self._removal: asyncio.Task | None = None

    async def sync(self, outcomes: list[tuple[bool, float]]) -> dict[str, Any]:
        """Take a replica's canary outcomes; return the split it routes by now."""
        if self.state == CANARY:
            self.requests += len(outcomes)
            self.failures += sum(failed for failed, _ in outcomes)
            self.outcomes = (self.outcomes + list(outcomes))[-(self.auto.window
                                                               if self.auto else 1):]
            reason = self.auto.verdict(self.outcomes) if self.auto else None
            if reason is not None:
                logger.warning("endpoint %r: rolling the canary back: %s", self.name, reason)
                self._roll_back(f"automatic rollback: {reason}")
        return self.traffic()

    def traffic(self) -> dict[str, Any]:
        return {"app": canary_app(self.name), "revision": self.canary_revision,
                "share": self.share if self.state == CANARY else 0.0}

    async def set_share(self, share: float, auto_rollback: dict[str, Any] | None) -> str | None:
        """Move the split; returns why not (the rollback's reason) once rolled back."""
        if self.state != CANARY:
            return self.reason or "rolled back"
        self.share = share
        self.auto = AutoRollback(**auto_rollback) if auto_rollback else None
        return None

    async def roll_back(self, reason: str) -> None:
        """Traffic back to the stable revision; returns once the canary is removed."""
        if self.state == CANARY:
            self._roll_back(reason)
        if self._removal is not None:
            await self._removal

    def _roll_back(self, reason: str) -> None:
        self.state, self.reason, self.share = ROLLED_BACK, reason, 0.0
        self._removal = asyncio.get_running_loop().create_task(self._remove_canary())

    async def _remove_canary(self) -> None:
        # Replicas route by a copy at most REFRESH_S old: wait until none sends it more.
        await asyncio.sleep(DRAIN_S)
        from ray import serve

        await asyncio.to_thread(serve.delete, canary_app(self.name))

    async def status(self) -> dict[str, Any]:
        return {"stable_revision": self.stable_revision, "canary_revision": self.canary_revision,
                "canary_share": self.share if self.state == CANARY else 0.0,
                "state": self.state, "reason": self.reason, "canary_requests": self.requests,
                "canary_failures": self.failures,
                "auto_rollback": dataclasses.asdict(self.auto) if self.auto else None}


def rollout_of(status: dict[str, Any]) -> Rollout:
    auto = status.get("auto_rollback")
    return Rollout(**{**status, "auto_rollback": AutoRollback(**auto) if auto else None})


def find_record(name: str) -> Any | None:
    """The rollout record actor of endpoint ``name``, or None."""
    import ray

    try:
        return ray.get_actor(record_name(name), namespace=NAMESPACE)
    except ValueError:
        return None


def start_record(name: str, stable_revision: int, canary_revision: int, share: float,
                 auto_rollback: AutoRollback | None) -> Any:
    import ray

    actor = ray.remote(RolloutRecord).options(
        name=record_name(name), namespace=NAMESPACE, lifetime="detached", num_cpus=0,
        max_concurrency=64)
    return actor.remote(name, stable_revision, canary_revision, share,
                        dataclasses.asdict(auto_rollback) if auto_rollback else None)


def end_record(name: str) -> None:
    """Forget ``name``'s rollout record (after a promote, a full deploy or a delete)."""
    import ray

    record = find_record(name)
    if record is not None:
        ray.kill(record)


class CanaryRouter:
    """Inside each stable replica: which requests the canary answers.

    Args:
        name: The endpoint.
        own_revision: The revision this replica serves (a canary equal to it is ignored).
    """

    def __init__(self, name: str, own_revision: int) -> None:
        self.name = name
        self.own_revision = own_revision
        self._traffic: dict[str, Any] | None = None
        self._synced_at = -math.inf
        self._record: Any = None
        self._pending: list[tuple[bool, float]] = []
        self._credit = 0.0
        self._lock = asyncio.Lock()
        self._handles: dict[str, Any] = {}

    async def target(self, method: str, path: str) -> Any | None:
        """The canary's Serve handle if it answers this request, else None (answer here)."""
        parts = [p for p in path.split("/") if p]
        pinned = None
        weighted = not parts and method == "POST"
        if parts[:2] == ["v2", "models"] and len(parts) >= 3:
            tail = parts[3:]
            if tail[:1] == ["versions"] and len(tail) >= 2:
                pinned = tail[1]
            weighted = tail == ["infer"] and method == "POST"
        if pinned is None and not weighted:
            return None
        traffic = await self._current()
        share = float(traffic["share"]) if traffic else 0.0
        if not traffic or share <= 0 or int(traffic["revision"]) == self.own_revision:
            return None  # no canary, or one rolled back (pinned paths get this one's 404)
        if pinned is not None:
            return self._handle(traffic["app"]) if pinned == str(traffic["revision"]) else None
        # Deterministic: exactly floor(n * share) of n requests, spread evenly.
        self._credit += share
        if self._credit < 1 - 1e-9:
            return None
        self._credit -= 1
        return self._handle(traffic["app"])

    def report(self, failed: bool, latency_s: float) -> None:
        """One canary outcome; sent to the record with the next refresh."""
        self._pending.append((failed, latency_s))

    def _handle(self, app: str) -> Any:
        if app not in self._handles:
            from ray import serve

            self._handles[app] = serve.get_app_handle(app)
        return self._handles[app]

    async def _current(self) -> dict[str, Any] | None:
        if time.monotonic() - self._synced_at < REFRESH_S:
            return self._traffic
        async with self._lock:
            if time.monotonic() - self._synced_at < REFRESH_S:
                return self._traffic
            await self._sync()
            return self._traffic

    async def _sync(self) -> None:
        outcomes, self._pending = self._pending, []
        try:
            if self._record is None:
                self._record = await asyncio.to_thread(find_record, self.name)
            if self._record is None:
                self._traffic = None
            else:
                self._traffic = await self._record.sync.remote(outcomes)
        except Exception as exc:  # the record was removed (promote, delete): no canary
            logger.debug("rollout record of %r unavailable: %r", self.name, exc)
            self._record, self._traffic = None, None
        if not self._traffic or self._traffic.get("share", 0) <= 0:
            self._credit = 0.0
        self._synced_at = time.monotonic()
