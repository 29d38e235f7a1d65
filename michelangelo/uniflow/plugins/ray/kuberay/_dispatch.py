"""remote-run --kuberay: each RayTask gets a RayCluster, and its attempts run there as jobs.

The clusters of a run are reused by later RayTasks that fit them (like local clusters) and
deleted when a RayTask that does not fit comes, and when the run ends however it ends.
Concurrent branches each hold a cluster of their own while their attempt runs, and a new
cluster must fit the nodes next to all of the run's others. Once a cluster is ready,
dispatch is plain remote-run against its head's Jobs API.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from michelangelo.uniflow.core.errors import ClusterError, UserError
from michelangelo.uniflow.core.plugin import Run, RunOption, register_run_option
from michelangelo.uniflow.plugins.ray.kuberay._fit import (
    check_fit,
    copies_that_fit,
    describe_free,
    fit_with_run,
)
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeApi, KubeTarget
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import (
    KubeRayCluster,
    KubeRaySettings,
)
from michelangelo.uniflow.plugins.ray.provisioning import (
    ClusterState,
    RayTask,
    register_run_provisioner,
)

OPTION = "kuberay"
_FLAG_OPTIONS = {
    "kuberay": ("--kuberay", "remote-run: give each RayTask a KubeRay RayCluster on Kubernetes"),
    "sandbox": ("--sandbox", "remote-run --kuberay: use the `michelangelo sandbox` kind cluster"),
}
_VALUE_OPTIONS = {
    "namespace": ("--namespace", "NS", "remote-run --kuberay: namespace of the RayClusters"),
    "image": ("--image", "IMAGE", "remote-run --kuberay: the Ray image of every node"),
    "kube_context": ("--kube-context", "CTX", "remote-run --kuberay: the kubeconfig context"),
    "head_access": ("--head-access", "auto|pod|port-forward",
                    "remote-run --kuberay: reach heads by pod address, through the API server's "
                    "port-forward, or auto (the address when it answers, else port-forward)"),
    "auth": ("--auth", "disabled|token",
             "remote-run --kuberay: Ray's token authentication on the RayClusters (token: "
             "KubeRay makes one per cluster; it is read from the cluster's Secret, never shown)"),
}


def enabled(options: dict[str, Any]) -> bool:
    return bool(options.get(OPTION))


def settings_from(options: dict[str, Any]) -> KubeRaySettings:
    """The provisioner settings that the run options (and the sandbox file) describe."""
    namespace = options.get("namespace") or "default"
    image = options.get("image")
    context = options.get("kube_context")
    storage_secret = head_address = head_node_ports = serve_node_port = None
    cpu_request_fraction = 1.0
    if options.get("sandbox"):
        from michelangelo.sandbox import load_sandbox_settings

        sandbox = load_sandbox_settings()
        namespace = options.get("namespace") or sandbox.namespace
        image = image or sandbox.image
        context = context or sandbox.kube_context
        storage_secret = sandbox.storage_secret
        # kind maps these node ports to the same ports on 127.0.0.1 (see `sandbox create`):
        # the dashboard to the run's current cluster, Serve to the RayServices deploy() makes.
        head_node_ports = {"dashboard": sandbox.node_ports["dashboard"]}
        serve_node_port = sandbox.node_ports["serve"]
        head_address = "http://127.0.0.1:8265"
        cpu_request_fraction = sandbox.cpu_request_fraction
    return KubeRaySettings(namespace=namespace, image=image,
                           target=KubeTarget(context=context), storage_secret=storage_secret,
                           head_address=head_address, head_node_ports=head_node_ports,
                           head_access=options.get("head_access") or "auto",
                           serve_node_port=serve_node_port,
                           auth=options.get("auth") or "disabled",
                           cpu_request_fraction=cpu_request_fraction)


def _check(mode: str, value: Any, options: dict[str, Any]) -> None:
    if not value:
        for name in ("namespace", "image", "kube_context", "sandbox", "head_access", "auth"):
            if options.get(name):
                flag = (_VALUE_OPTIONS.get(name) or _FLAG_OPTIONS[name])[0]
                raise UserError(f"{flag} only applies with remote-run --kuberay.")
        return
    if mode != "remote-run":
        raise UserError("--kuberay only applies to remote-run: run "
                        "`python wf.py remote-run --kuberay` (or `michelangelo run ... --kuberay`).")
    settings_from({k: v for k, v in options.items() if k != "sandbox"})  # bad values, now
    if options.get("sandbox"):
        _use_sandbox_storage()
    if options.get("ray_address"):
        raise UserError(
            f"--kuberay and --ray-address {options['ray_address']!r} both name where tasks run; "
            "pass one: --kuberay makes a cluster per RayTask, --ray-address uses one you have."
        )


def _use_sandbox_storage() -> None:
    """Runs keep their results in the sandbox's bucket unless the user named a storage."""
    import os

    from michelangelo.sandbox import load_sandbox_settings

    sandbox = load_sandbox_settings()
    os.environ.setdefault("UF_STORAGE_URL", sandbox.storage_url)
    sandbox.use_client_environment()


def _no_check(mode: str, value: Any, options: dict[str, Any]) -> None:
    return None  # checked together with --kuberay


for _name, (_flag, _help) in _FLAG_OPTIONS.items():
    register_run_option(RunOption(name=_name, flag=_flag, help=_help, is_flag=True,
                                  check=_check if _name == OPTION else _no_check))
for _name, (_flag, _metavar, _help) in _VALUE_OPTIONS.items():
    register_run_option(RunOption(name=_name, flag=_flag, metavar=_metavar, help=_help,
                                  check=_no_check))


class RunClusters:
    """The KubeRay clusters of one run: one per RayTask branch in flight, reused when idle.

    A branch holds its cluster for the whole attempt. A later branch takes over an idle
    cluster that can host its RayTask; otherwise it gets a new one, and idle clusters that
    cannot host it are deleted first. A new cluster is checked against the nodes together
    with every other cluster of the run (:func:`fit_with_run`): one that does not fit until
    others end waits, and says so; one that could never fit fails before anything starts.
    """

    #: How often a waiting branch looks at the nodes again (pods of other users change too).
    recheck_s = 5.0

    def __init__(self, run: Run) -> None:
        self.run = run
        self.settings = settings_from(run.options)
        self._cond = threading.Condition()
        self._clusters: list[KubeRayCluster] = []  # made by this run and not deleted yet
        self._holders: dict[str, str] = {}  # cluster name -> the call holding it
        self._retiring: list[KubeRayCluster] = []  # being deleted: their room is not free yet
        self._closed = False  # the run is ending: no new cluster may start
        self._api: KubeApi | None = None
        run.add_cleanup(self.close)

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(self.settings.target)
        return self._api

    @property
    def exclusive(self) -> bool:
        """Whether the run may hold one cluster at a time only.

        With a fixed head address (the sandbox maps one dashboard node port to this
        machine) two clusters would claim the same port.
        """
        return bool(self.settings.head_address or self.settings.head_node_ports)

    @contextlib.contextmanager
    def lease(self, config: RayTask, task_name: str, holder: str) -> Iterator[str]:
        """A ready cluster that can hold ``config``, for ``holder`` (a call id) alone.

        Yields:
            The cluster's Jobs API address; the cluster is the branch's until the block ends.
        """
        cluster = self._acquire(config, task_name, holder)
        try:
            yield cluster.address
        finally:
            with self._cond:
                self._holders.pop(cluster.name, None)
                self._cond.notify_all()

    def auth_headers(self, address: str) -> dict[str, str]:
        """The token header of the run's cluster whose Jobs API is at ``address``."""
        with self._cond:
            for cluster in self._clusters:
                if cluster.address and cluster.address.rstrip("/") == address.rstrip("/"):
                    return cluster.auth_headers
        return {}

    def _acquire(self, config: RayTask, task_name: str, holder: str) -> KubeRayCluster:
        cluster = KubeRayCluster(config, run_id=self.run.run_id, task_name=task_name,
                                 settings=self.settings, on_progress=self.run.info)
        if self.settings.fit_check:  # one that never fits fails now, before anything changes
            with self._cond:
                ours = {c.name for c in self._clusters + self._retiring}
            check_fit(cluster.manifest(), self.api.nodes(),
                      [p for p in self.api.all_pods() if _cluster_label(p) not in ours])
        waited = False
        while True:
            retire: list[KubeRayCluster] = []
            with self._cond:
                if self._closed:  # a branch still waiting when the run ends makes nothing
                    raise ClusterError(f"{holder}: the run is ending; no RayCluster is made "
                                       "for it")
                idle = [c for c in self._clusters if c.name not in self._holders
                        and c.state == ClusterState.READY]
                host = next((c for c in idle if c.can_host(config)), None)
                if host is not None:
                    self._holders[host.name] = holder
                    return host
                retire = idle  # none can host it; their room may be needed
                for old in retire:
                    self._clusters.remove(old)
                    self._retiring.append(old)
                if not retire:
                    blocker = self._blocker(cluster, config)
                    if blocker is None:
                        self._clusters.append(cluster)
                        self._holders[cluster.name] = holder
                        break
                    if not waited:
                        waited = True
                        self.run.info(f"{holder} waits for {blocker}")
                    self._cond.wait(self.recheck_s)
                    continue
            for old in retire:  # outside the lock: deleting takes a while
                self._delete(old, "the next RayTask does not fit it")
        try:
            with self.run.status(f"provisioning RayCluster {cluster.name}: "
                                 f"{config.describe()}"):
                cluster.start(fit_checked=True)
        except BaseException:
            with self._cond:
                self._holders.pop(cluster.name, None)
                if cluster in self._clusters:  # else close() has it
                    self._clusters.remove(cluster)
                self._cond.notify_all()
            self._delete(cluster, None)
            raise
        self.run.info(f"RayCluster {self.settings.namespace}/{cluster.name} ready; "
                      f"dashboard {cluster.dashboard_url}")
        return cluster

    def _blocker(self, cluster: KubeRayCluster, config: RayTask) -> str | None:
        """What ``cluster`` must wait for before it starts (called holding the lock), or None.

        Raises:
            ClusterFitError: It can never fit the nodes.
        """
        others = [c.manifest() for c in self._clusters + self._retiring]
        if not self.settings.fit_check:
            if self.exclusive and others:
                return _exclusive_wait(others)
            return None
        fit = fit_with_run(cluster.manifest(), self.api.nodes(), self.api.all_pods(), others)
        if self.exclusive and others:
            return _exclusive_wait(others)
        if fit.fits:
            return None
        return (f"RayCluster(s) {', '.join(fit.waits_for)} of this run to end: a RayCluster "
                f"for {config.describe()} asks for {fit.need}; next to them the nodes have "
                f"free {fit.free}")

    def plan_concurrency(self, configs: list[RayTask]) -> tuple[int, str]:
        """How many RayTask branches (each with its own RayCluster) the nodes hold at once."""
        if self.exclusive:
            return 1, ("--kuberay with a fixed head address (the sandbox maps one dashboard "
                       "to this machine): branches' RayClusters take turns")
        shapes = "; ".join(sorted({c.describe() for c in configs}))
        if not self.settings.fit_check:
            return len(configs), f"--kuberay: a RayCluster per branch ({shapes})"
        manifests = [KubeRayCluster(c, run_id=self.run.run_id, task_name="plan",
                                    settings=self.settings).manifest() for c in configs]
        with self._cond:
            idle = {c.name for c in self._clusters} - set(self._holders)
        nodes, pods = self.api.nodes(), self.api.all_pods()
        # The idle clusters are reused or deleted by the branches: their room counts as free.
        pods = [p for p in pods if _cluster_label(p) not in idle]
        at_once = max(1, copies_that_fit(manifests, nodes, pods))
        return at_once, (f"--kuberay: a RayCluster per branch ({shapes}); the nodes' free "
                         f"allocatable ({describe_free(nodes, pods)}) holds {at_once} of "
                         "them at once")

    def publish(self, deployments: list[dict[str, Any]], config: RayTask, call_id: str,
                project: Any) -> None:
        """Make the endpoints a task's ``deploy()`` calls stood up lasting RayServices.

        The task's cluster goes with the run; each endpoint it deployed (already proven to
        answer there) is applied as a RayService shaped like the task's RayTask, serving from
        the project the run sent, and waited for. Kubernetes credentials stay on this machine.
        """
        from michelangelo.uniflow.plugins.ray.kuberay._publish import publish

        publish(self, deployments, config, call_id, project)

    def make_room(self, call_id: str) -> bool:
        """Delete the clusters no other branch holds (``call_id``'s own is done); any?"""
        with self._cond:
            gone = [c for c in self._clusters
                    if self._holders.get(c.name) in (None, call_id)]
            for cluster in gone:
                self._clusters.remove(cluster)
                self._holders.pop(cluster.name, None)
        for cluster in gone:
            self._delete(cluster, None)
        return bool(gone)

    def close(self) -> None:
        """Delete every cluster of the run (at its end, however it ends), all at once."""
        with self._cond:
            self._closed = True
            clusters, self._clusters = self._clusters + self._retiring, []
            self._retiring = []
            self._holders.clear()
            self._cond.notify_all()
        threads = [threading.Thread(target=self._delete, args=(c, None), daemon=True)
                   for c in clusters]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _delete(self, cluster: KubeRayCluster, why: str | None) -> None:
        if why:
            self.run.info(f"RayCluster {self.settings.namespace}/{cluster.name}: {why}; "
                          "deleting it")
        created = cluster.created
        cluster.shutdown()
        if created:
            self.run.info(f"RayCluster {self.settings.namespace}/{cluster.name} deleted")
        with self._cond:
            if cluster in self._retiring:
                self._retiring.remove(cluster)
            self._cond.notify_all()


def _exclusive_wait(others: list[dict[str, Any]]) -> str:
    names = ", ".join(sorted(m["metadata"]["name"] for m in others))
    return (f"RayCluster(s) {names} of this run to end: with a fixed head address the run "
            "holds one RayCluster at a time")


def _cluster_label(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get("ray.io/cluster")


def _run_clusters(run: Run) -> RunClusters | None:
    return RunClusters(run) if enabled(run.options) else None


register_run_provisioner(OPTION, _run_clusters)
