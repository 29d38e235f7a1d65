"""The KubeRay provisioner against a real API server, scheduler and the real KubeRay operator
(the kubelet is a test double): readiness, the fit check, pending reasons, fatal reasons,
deadlines, deletion."""

from __future__ import annotations

import time

import pytest

from michelangelo.uniflow.core.errors import ClusterError
from michelangelo.uniflow.plugins.ray import RayTask
from michelangelo.uniflow.plugins.ray.kuberay._fit import ClusterFitError
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeTarget
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import (
    KubeRayCluster,
    KubeRaySettings,
)

SMALL = RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="1Gi",
                worker_instances=1)


def _cluster(api, task, run_id="20261129-000000-aaaaaa", **settings):
    messages: list[str] = []
    cluster = KubeRayCluster(task, run_id=run_id, task_name="train",
                             settings=KubeRaySettings(**settings), api=api,
                             on_progress=messages.append)
    return cluster, messages


def _wait_gone(api, name, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.get("RayCluster", name, "default") is None and not api.pods(
                "default", f"ray.io/cluster={name}"):
            return True
        time.sleep(0.5)
    return False


def test_cluster_becomes_ready_with_every_node_then_is_deleted(api, kube_cluster):
    _, kubelet = kube_cluster
    cluster, messages = _cluster(api, SMALL, deadline_s=240)
    try:
        cluster.start()
        # auto: the head pod's address answers from here, so no forward is needed
        assert cluster.address == f"http://{cluster.head_ip}:8265"
        assert cluster._alive_nodes(cluster.address) == 2
        assert list(cluster.timeline) == ["pending", "created", "scheduled", "head ready", "ready"]
        assert any("Pending" in m or "Running" in m for m in messages)
        pods = api.pods("default", f"ray.io/cluster={cluster.name}")
        assert sorted(p["spec"]["nodeName"] is not None for p in pods) == [True, True]
        procs = kubelet.processes()
        assert procs
        # Our quick wait for the head ran first, then the operator's wait-gcs-ready, each to
        # success, before the worker's Ray. The operator's check passed at its first try:
        # after a failed one it says "N seconds elapsed" (its first try at a GCS that is still
        # starting takes about 40 s), which is what the quick wait is there to spare.
        (worker,) = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
        assert [c["name"] for c in worker["spec"]["initContainers"]] == [
            "uf-wait-for-head", "wait-gcs-ready"]
        log = kubelet.pod_log(worker["metadata"]["name"])
        assert (log.index("--- uf-wait-for-head") < log.index("answered after")
                < log.index("--- wait-gcs-ready") < log.index("GCS is ready")
                < log.index("--- ray-worker")), log
        assert "seconds elapsed" not in log, log
    finally:
        cluster.shutdown()
    assert _wait_gone(api, cluster.name)
    assert all(proc.poll() is not None for proc in procs)


def test_a_sandbox_shaped_cluster_with_node_ports_becomes_ready(api, kube_cluster):
    from kubernetes import client

    # --sandbox gives the head Service fixed node ports; the real operator appends its default
    # ports to a custom head Service, and the API server refuses two ports of one name.
    cluster, _ = _cluster(api, SMALL, deadline_s=240,
                          head_node_ports={"dashboard": 30265, "client": 30001})
    try:
        cluster.start()
        core = client.CoreV1Api(kube_cluster[0].api_client())
        service = core.read_namespaced_service(f"{cluster.name}-head-svc", "default")
        assert service.spec.type == "NodePort"
        ports = {p.name: p for p in service.spec.ports}
        assert len(ports) == len(service.spec.ports)  # no name twice
        assert ports["dashboard"].node_port == 30265 and ports["client"].node_port == 30001
        assert cluster._alive_nodes(cluster.address) == 2
    finally:
        cluster.shutdown()
    assert _wait_gone(api, cluster.name)


def test_port_forward_through_the_api_server_carries_jobs_to_the_head(api, kube_cluster):
    import socket

    from ray.job_submission import JobStatus, JobSubmissionClient

    _, kubelet = kube_cluster
    before = kubelet.streaming.streams
    task = RayTask(head_cpu=1, head_memory="1Gi", worker_instances=0)
    cluster, _ = _cluster(api, task, deadline_s=240, head_access="port-forward")
    try:
        cluster.start()
        forward = cluster._forward
        assert forward is not None and cluster.address == forward.url
        assert cluster.address.startswith("http://127.0.0.1:") and forward.port == 8265
        assert cluster._alive_nodes(cluster.address) == 1
        jobs = JobSubmissionClient(cluster.address)
        job = jobs.submit_job(entrypoint="python -c \"print('through', 6 * 7)\"")
        deadline = time.monotonic() + 120
        while jobs.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                JobStatus.STOPPED}:
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.5)
        assert jobs.get_job_status(job) == JobStatus.SUCCEEDED
        assert "through 42" in jobs.get_job_logs(job)
        # every request went API server -> kubelet streaming -> head pod
        assert kubelet.streaming.streams - before >= 5
        assert kubelet.streaming.errors == []
        # A job still running when the cluster goes: Ray starts its driver in a session of
        # its own, and the pod's end must take it all the same.
        jobs.submit_job(entrypoint="python -c \"import time; time.sleep(600)\"")
        deadline = time.monotonic() + 120
        while not any("time.sleep(600)" in " ".join(_cmdline(pid))
                      for pid in _pod_pids(kubelet)):
            assert time.monotonic() < deadline, "the job's driver did not start"
            time.sleep(0.5)
    finally:
        cluster.shutdown()
    assert cluster._forward is None
    with pytest.raises(OSError):  # the local listener is gone with the cluster
        socket.create_connection(("127.0.0.1", forward.local_port), timeout=2).close()
    assert _wait_gone(api, cluster.name)
    assert kubelet.stray_processes() == []


def _cmdline(pid):
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def _pod_pids(kubelet):
    """Every process started in one of the kubelet double's pods."""
    import psutil

    return [p.pid for root in kubelet.processes() if root.poll() is None
            for p in [psutil.Process(root.pid), *psutil.Process(root.pid).children(True)]]


def test_fit_check_names_the_pod_the_resource_and_the_largest_node(api):
    task = RayTask(head_cpu=1, worker_cpu=16, worker_memory="1Gi", worker_instances=1)
    cluster, _ = _cluster(api, task)
    with pytest.raises(ClusterFitError) as info:
        cluster.start()
    message = str(info.value)
    assert "worker pod 1/1" in message and "cpu" in message and "'node-a'" in message
    assert api.get("RayCluster", cluster.name, "default") is None  # nothing was created


def test_fit_check_sees_that_pods_do_not_fit_together(api):
    task = RayTask(head_cpu=1, worker_cpu=2, worker_memory="1Gi", worker_instances=3)
    cluster, _ = _cluster(api, task)
    with pytest.raises(ClusterFitError, match="all 4 pods together"):
        cluster.start()
    assert api.get("RayCluster", cluster.name, "default") is None


def test_pending_reasons_are_reported_and_the_deadline_names_the_phase(api):
    # With the fit check off (as with a node autoscaler) the real scheduler says why.
    task = RayTask(head_cpu=1, worker_cpu=16, worker_memory="1Gi", worker_instances=1)
    cluster, messages = _cluster(api, task, fit_check=False, deadline_s=15)
    try:
        with pytest.raises(ClusterError) as info:
            cluster.start()
    finally:
        cluster.shutdown()
    message = str(info.value)
    assert "was not ready within 15s" in message and "Pending" in message
    assert "Insufficient cpu" in message
    assert any("Insufficient cpu" in m for m in messages)
    assert _wait_gone(api, cluster.name)


@pytest.mark.parametrize("setting, reason, detail", [
    # a kubelet's first word for it is ErrImagePull, then ImagePullBackOff between retries
    ({"image": "registry.invalid/ray:missing"}, "(ErrImagePull|ImagePullBackOff)",
     "cannot start"),
    ({"storage_secret": "no-such-secret"}, "CreateContainerConfigError",
     'secret "no-such-secret" not found'),
], ids=["image-not-pulled", "storage-secret-missing"])
def test_a_pod_the_kubelet_cannot_start_fails_at_once_with_its_reason(api, setting, reason,
                                                                      detail):
    """Fails on the kubelet's reason as soon as it shows, not at the deadline."""
    cluster, _ = _cluster(api, SMALL, deadline_s=120, **setting)
    try:
        with pytest.raises(ClusterError, match=reason) as info:
            cluster.start()
    finally:
        cluster.shutdown()
    assert detail in str(info.value) and "was not ready within" not in str(info.value)
    assert _wait_gone(api, cluster.name)


def test_a_crash_looping_head_fails_with_the_end_of_its_last_log(api):
    """A head whose ``ray start`` exits at once: after the restarts the provisioner allows,
    the task fails with the reason and with what the head printed in its last run, read
    through the API server (``kubectl logs``, or ``--previous`` once the container waits to
    restart) before the cluster and its pods' logs are deleted."""
    task = RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="1Gi",
                   worker_instances=1,
                   runtime_env={"env_vars": {"RAY_OVERRIDE_RESOURCES": "{not json"}})
    cluster, _ = _cluster(api, task, deadline_s=240)
    try:
        with pytest.raises(ClusterError, match="CrashLoopBackOff after 3 restarts") as info:
            cluster.start()
    finally:
        cluster.shutdown()
    message = str(info.value)
    assert "(kubectl logs" in message and "JSONDecodeError" in message, message
    assert message.index("the cluster is being deleted") < message.index("JSONDecodeError")
    assert "was not ready within" not in message
    assert _wait_gone(api, cluster.name)


def test_server_side_dry_run_refuses_what_the_crd_rejects(api):
    from michelangelo.uniflow.core.errors import UserError

    cluster, _ = _cluster(api, SMALL)
    manifest = cluster.manifest()
    manifest["spec"]["workerGroupSpecs"][0]["replicas"] = "one"
    with pytest.raises(Exception) as info:
        api.create(manifest, dry_run=True)
    assert "replicas" in str(info.value)
    assert api.get("RayCluster", cluster.name, "default") is None
    assert not isinstance(info.value, UserError)


def test_workers_the_api_server_refuses_fail_at_once_with_kubes_reason(api, kube_cluster):
    """A quota that admits the head pod but not the worker: the real operator marks the
    cluster ``ReplicaFailure`` (its ``RayClusterProvisioned`` alone would read as done, since
    every pod that exists runs), and the provisioner fails with the API server's words
    instead of waiting out its deadline."""
    from kubernetes import client

    plane, _ = kube_cluster
    core = client.CoreV1Api(plane.api_client())
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="one-pod"),
                                   spec=client.V1ResourceQuotaSpec(hard={"pods": "1"}))
    core.create_namespaced_resource_quota("default", quota)
    cluster, _ = _cluster(api, SMALL, deadline_s=600)
    try:
        with pytest.raises(ClusterError) as info:
            cluster.start()
    finally:
        cluster.shutdown()
        core.delete_namespaced_resource_quota("one-pod", "default")
    message = str(info.value)
    assert "cannot start" in message and "exceeded quota: one-pod" in message, message
    assert "was not ready within" not in message  # failed on the reason, not the deadline
    assert _wait_gone(api, cluster.name)


def test_token_auth_end_to_end_without_the_token_ever_shown(api, kube_cluster, capfd):
    """``auth="token"``: the real operator makes the cluster's token Secret and gives every
    node the token; the provisioner reads it for its own dashboard checks and the Jobs API
    client, a job on the cluster connects to Ray with it, a request without it is refused,
    and the token shows up in no message."""
    import urllib.error
    import urllib.request

    from michelangelo.uniflow.plugins.ray._remote._jobs import JobsCluster

    _, kubelet = kube_cluster
    task = RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="1Gi",
                   worker_instances=1)
    cluster, messages = _cluster(api, task, deadline_s=240, auth="token")
    try:
        cluster.start()
        token = api.secret_value(cluster.name, "default", "auth_token")
        assert token and cluster.auth_headers == {"Authorization": f"Bearer {token}"}
        pods = api.pods("default", f"ray.io/cluster={cluster.name}")
        for pod in pods:  # the operator's doing: the mode, and the token from the Secret
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == cluster.name
            if pod["metadata"]["labels"]["ray.io/node-type"] == "worker":
                # the quick wait for the head got through with the same token
                log = kubelet.pod_log(pod["metadata"]["name"])
                assert "answered after" in log and "seconds elapsed" not in log, log
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{cluster.address}/api/jobs/", timeout=10)
        assert refused.value.code in (401, 403)
        jobs = JobsCluster(cluster.address, headers=cluster.auth_headers)
        jobs.check_versions()
        out = jobs.probe("python -c \"import ray; ray.init(); "
                         "print('alive', len([n for n in ray.nodes() if n['Alive']]))\"",
                         deadline_s=180)
        assert "alive 2" in out
    finally:
        cluster.shutdown()
    assert _wait_gone(api, cluster.name)
    deadline = time.monotonic() + 60  # the Secret is the cluster's: the garbage collector's
    while api.secret_value(cluster.name, "default", "auth_token") is not None:
        assert time.monotonic() < deadline, "the token Secret outlived its RayCluster"
        time.sleep(0.5)
    shown = capfd.readouterr()
    assert token not in shown.out + shown.err and not any(token in m for m in messages)
    assert token not in repr(cluster) and token not in str(cluster.__dict__.get("settings"))
    assert kubelet.errors == []


def test_a_user_without_a_needed_permission_learns_it_before_any_cluster_is_made(
        api, kube_cluster):
    """A user RBAC lets make RayClusters but neither read Secrets nor open port-forwards:
    ``auth="token"`` and ``head_access="port-forward"`` each make the provisioner ask the API
    server first (a SelfSubjectAccessReview), and fail with the permission and the fix before
    the RayCluster exists (the same review says this user may create RayClusters, so nothing
    else would have stopped it)."""
    from kubernetes import client

    from michelangelo.uniflow.core.errors import UserError
    from tools.kuberay_bed import DEVELOPER_CONTEXT

    plane, _ = kube_cluster
    rbac = client.RbacAuthorizationV1Api(plane.api_client())
    rule = client.V1PolicyRule
    rbac.create_cluster_role(client.V1ClusterRole(
        metadata=client.V1ObjectMeta(name="uf-developer"),
        rules=[rule(api_groups=["ray.io"], resources=["rayclusters"],
                    verbs=["get", "list", "watch", "create", "delete"]),
               rule(api_groups=[""], resources=["pods", "events", "nodes"],
                    verbs=["get", "list", "watch"])]))
    rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name="uf-developer"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                                  name="uf-developer"),
        subjects=[client.RbacV1Subject(kind="User", name="developer",
                                       api_group="rbac.authorization.k8s.io")]))
    try:
        developer = KubeApi(KubeTarget(kubeconfig=str(plane.kubeconfig),
                                       context=DEVELOPER_CONTEXT))
        assert developer.allowed("create", "rayclusters", "default", group="ray.io") is True
        assert developer.allowed("get", "secrets", "default") is False
        assert developer.allowed("create", "pods", "default", subresource="portforward") is False
        assert developer.allowed("get", "pods", "default") is True
        for setting, names, fix in [
                ({"auth": "token"}, "Secret default/{name}",
                 "granted 'get' on secrets in namespace 'default'"),
                ({"head_access": "port-forward"}, "port-forward to RayCluster '{name}'",
                 "granted 'create' on pods/portforward in namespace 'default'")]:
            cluster, messages = _cluster(developer, SMALL, deadline_s=120, **setting)
            try:
                with pytest.raises(UserError) as info:
                    cluster.start()
            finally:
                cluster.shutdown()
            assert not cluster.created and "created" not in cluster.timeline
            assert api.get("RayCluster", cluster.name, "default") is None
            message = str(info.value)
            assert names.format(name=cluster.name) in message, message
            assert "no RayCluster was made" in message and fix in message, message
    finally:
        rbac.delete_cluster_role_binding("uf-developer")
        rbac.delete_cluster_role("uf-developer")
