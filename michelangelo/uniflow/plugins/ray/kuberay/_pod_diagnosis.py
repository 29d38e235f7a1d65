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
# Waiting reasons too common and short-lived to report.
_NOT_A_REASON = ("ContainerCreating",)


def fatal_reason(pods: list[dict[str, Any]]) -> str | None:
    """The first reason a pod cannot become ready however long we wait, if any."""
    fatal = _fatal(pods)
    return fatal[0] if fatal else None


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's container statuses, init containers first: a worker's image or Secret
    problem shows on its first init container, while the Ray container only waits
    (``PodInitializing``)."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or [])]


def _fatal(pods: list[dict[str, Any]]) -> tuple[str, str, str | None, bool] | None:
    """``(reason, pod, container, previous)`` for :func:`fatal_reason`. ``container`` is set
    only when that container ran and ended (a crash loop, an out-of-memory kill), so it left
    a log; ``previous`` says whether that run is the one before the current one (the
    container waits to restart) or the current one (it shows as ended).

    A crash loop has two shapes. Between restarts a kubelet of Kubernetes 1.36 shows the
    crashed run as the container's ``state`` (``terminated``, reason ``Error``) for most of
    each back-off, and ``waiting`` with reason ``CrashLoopBackOff`` only at its end or for
    long back-offs; older kubelets show ``CrashLoopBackOff`` for the whole back-off. Either
    one, with enough restarts, is fatal.
    """
    for pod in pods:
        name = pod["metadata"]["name"]
        for cs in _statuses(pod):
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            reason = waiting.get("reason", "")
            message = waiting.get("message", "")
            if reason in FATAL_REASONS:
                return f"{name}: {reason}: {message}".rstrip(": "), name, None, False
            ended = state.get("terminated") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if ended.get("reason") == "OOMKilled" or last.get("reason") == "OOMKilled":
                return (f"{name}: OOMKilled (raise the RayTask's memory)", name, cs["name"],
                        not ended)
            restarts = cs.get("restartCount", 0)
            crashed = bool(ended) and ended.get("reason") != "Completed"
            if (reason == "CrashLoopBackOff" or crashed) and restarts >= CRASH_LOOP_RESTARTS:
                detail = message or (f"container {cs['name']} exited with code "
                                     f"{ended.get('exitCode')} ({ended.get('reason')})")
                return (f"{name}: CrashLoopBackOff after {restarts} restarts: {detail}", name,
                        cs["name"], not crashed)
    return None


def last_words(api: KubeApi, namespace: str, pods: list[dict[str, Any]], *,
               hide: tuple[str | None, ...] = ()) -> str:
    """The end of what a crashed container printed in its last run, for an error message.

    Read before the cluster and its pods' logs are deleted: ``kubectl logs --previous`` while
    the container waits to restart, ``kubectl logs`` while its status still shows the run
    that ended. Any string in ``hide`` (a token) is masked. Empty when the pod
    :func:`fatal_reason` names has no container that ran and ended.
    """
    fatal = _fatal(pods)
    if fatal is None or fatal[2] is None:
        return ""
    _, pod, container, previous = fatal
    try:
        text = api.container_log(namespace, pod, container, previous=previous,
                                 tail_lines=CRASH_LOG_LINES)
    except KubeError as exc:
        return f" The crashed container's log could not be read: {exc}."
    for secret in hide:
        if secret:
            text = text.replace(secret, "***")
    lines = text.rstrip().splitlines()[-CRASH_LOG_LINES:]
    if not lines:
        return f" Container {container} of pod {pod} printed nothing before it ended."
    command = "kubectl logs --previous" if previous else "kubectl logs"
    return (f"\nThe last {len(lines)} lines container {container} of pod {pod} printed before "
            f"it ended ({command}):\n" + "\n".join("  " + line for line in lines))


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
        for cs in _statuses(pod):
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in _NOT_A_REASON:
                reasons.append(f"{name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": "))
            terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                reasons.append(f"{name}: OOMKilled")
            elif state.get("terminated") and state["terminated"].get("reason") != "Completed":
                ended = state["terminated"]
                reasons.append(f"{name}: container {cs['name']} exited with code "
                               f"{ended.get('exitCode')} ({ended.get('reason')}); restarted "
                               f"{cs.get('restartCount', 0)} time(s)")
    scheduled = {p["metadata"]["name"] for p in pods if (p.get("spec") or {}).get("nodeName")}
    for event in events:
        obj = (event.get("involvedObject") or {}).get("name")
        if event.get("type") == "Warning" and obj not in scheduled:
            text = f"{obj}: {event.get('reason')}: {event.get('message')}"
            if not any(text.split(": ", 1)[1] in r for r in reasons):
                reasons.append(text)
    return sorted(set(reasons))
