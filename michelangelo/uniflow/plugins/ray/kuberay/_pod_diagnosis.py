"""Why a cluster's pods are not ready: read from their statuses, their Events and the log of a
container that crashed.

Both the run clusters (``_provisioner``) and the RayServices (``_service``) wait on pods that
KubeRay creates; while they wait they report :func:`pending_reasons` as they change, stop at
once on a :func:`fatal_reason` (a reason that does not heal by waiting longer), and quote the
crashed container's :func:`last_words` in the error.
"""

from __future__ import annotations

from typing import Any

from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeError

# Waiting reasons that do not heal by waiting longer.
FATAL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")
# A node may crash while its peers start (a worker racing its head): fatal only when it keeps
# crashing.
CRASH_LOOP_RESTARTS = 3
CRASH_LOG_LINES = 25  # of a crashed container's last run, in the error that reports it


def fatal_reason(pods: list[dict[str, Any]]) -> str | None:
    """The first reason a pod cannot become ready however long we wait, if any."""
    fatal = _fatal(pods)
    return fatal[0] if fatal else None


def _fatal(pods: list[dict[str, Any]]) -> tuple[str, str, str | None] | None:
    """``(reason, pod, container)`` for :func:`fatal_reason`; ``container`` is set only when
    that container ran and ended (a crash loop, an out-of-memory kill), so it left a log."""
    for pod in pods:
        name = pod["metadata"]["name"]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason", "")
            message = waiting.get("message", "")
            if reason in FATAL_REASONS:
                return f"{name}: {reason}: {message}".rstrip(": "), name, None
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if last.get("reason") == "OOMKilled":
                return f"{name}: OOMKilled (raise the RayTask's memory)", name, cs["name"]
            if reason == "CrashLoopBackOff" and cs.get("restartCount", 0) >= CRASH_LOOP_RESTARTS:
                return (f"{name}: CrashLoopBackOff after {cs['restartCount']} restarts: "
                        f"{message}", name, cs["name"])
    return None


def last_words(api: KubeApi, namespace: str, pods: list[dict[str, Any]], *,
               hide: tuple[str | None, ...] = ()) -> str:
    """The end of what a crashed container printed in its last run, for an error message.

    What ``kubectl logs --previous`` shows, read before the cluster and its pods' logs are
    deleted; any string in ``hide`` (a token) is masked. Empty when the pod
    :func:`fatal_reason` names has no container that ran and ended.
    """
    fatal = _fatal(pods)
    if fatal is None or fatal[2] is None:
        return ""
    _, pod, container = fatal
    try:
        text = api.container_log(namespace, pod, container, previous=True,
                                 tail_lines=CRASH_LOG_LINES)
    except KubeError as exc:
        return f" The crashed container's log could not be read: {exc}."
    for secret in hide:
        if secret:
            text = text.replace(secret, "***")
    lines = text.rstrip().splitlines()[-CRASH_LOG_LINES:]
    if not lines:
        return f" Container {container} of pod {pod} printed nothing before it ended."
    return (f"\nThe last {len(lines)} lines container {container} of pod {pod} printed before "
            "it ended (kubectl logs --previous):\n" + "\n".join("  " + line for line in lines))


def events_about(api: KubeApi, namespace: str, pods: list[dict[str, Any]],
                 owner: str) -> list[dict[str, Any]]:
    """The namespace's Events about ``pods`` or the object ``owner`` names."""
    names = {p["metadata"]["name"] for p in pods} | {owner}
    return [e for e in api.events(namespace)
            if (e.get("involvedObject") or {}).get("name") in names]


def pending_reasons(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    """Why pods are not running yet, from their conditions, container states and Events."""
    reasons: list[str] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reasons.append(f"{name}: {cond.get('reason')}: {cond.get('message')}")
        for cs in status.get("containerStatuses") or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
                reasons.append(f"{name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": "))
            terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                reasons.append(f"{name}: OOMKilled")
    scheduled = {p["metadata"]["name"] for p in pods if (p.get("spec") or {}).get("nodeName")}
    for event in events:
        obj = (event.get("involvedObject") or {}).get("name")
        if event.get("type") == "Warning" and obj not in scheduled:
            text = f"{obj}: {event.get('reason')}: {event.get('message')}"
            if not any(text.split(": ", 1)[1] in r for r in reasons):
                reasons.append(text)
    return sorted(set(reasons))
