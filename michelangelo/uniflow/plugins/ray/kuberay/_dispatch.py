"""remote-run --kuberay: each RayTask gets a RayCluster, and its attempts run there as jobs.

The clusters of a run are reused by later RayTasks that fit them (like local clusters) and
deleted when a RayTask that does not fit comes, and when the run ends however it ends. Once
a cluster is ready, dispatch is plain remote-run against its head's Jobs API.
"""

from __future__ import annotations

from typing import Any

from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.core.plugin import Run, RunOption, register_run_option
from michelangelo.uniflow.plugins.ray.kuberay._kube import KubeTarget
from michelangelo.uniflow.plugins.ray.kuberay._provisioner import (
    KubeRayCluster,
    KubeRaySettings,
)
from michelangelo.uniflow.plugins.ray.provisioning import RayTask, register_run_provisioner

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
}


def enabled(options: dict[str, Any]) -> bool:
    return bool(options.get(OPTION))


def settings_from(options: dict[str, Any]) -> KubeRaySettings:
    """The provisioner settings that the run options (and the sandbox file) describe."""
    namespace = options.get("namespace") or "default"
    image = options.get("image")
    context = options.get("kube_context")
    storage_secret = head_address = head_node_ports = serve_node_port = None
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
    return KubeRaySettings(namespace=namespace, image=image,
                           target=KubeTarget(context=context), storage_secret=storage_secret,
                           head_address=head_address, head_node_ports=head_node_ports,
                           head_access=options.get("head_access") or "auto",
                           serve_node_port=serve_node_port)


def _check(mode: str, value: Any, options: dict[str, Any]) -> None:
    if not value:
        for name in ("namespace", "image", "kube_context", "sandbox", "head_access"):
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
    for key, value in sandbox.client_environment().items():
        os.environ.setdefault(key, value)


def _no_check(mode: str, value: Any, options: dict[str, Any]) -> None:
    return None  # checked together with --kuberay


for _name, (_flag, _help) in _FLAG_OPTIONS.items():
    register_run_option(RunOption(name=_name, flag=_flag, help=_help, is_flag=True,
                                  check=_check if _name == OPTION else _no_check))
for _name, (_flag, _metavar, _help) in _VALUE_OPTIONS.items():
    register_run_option(RunOption(name=_name, flag=_flag, metavar=_metavar, help=_help,
                                  check=_no_check))


class RunClusters:
    """The KubeRay clusters of one run: one at a time, replaced when a RayTask does not fit."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.settings = settings_from(run.options)
        self.current: KubeRayCluster | None = None
        run.add_cleanup(self.close)

    def address_for(self, config: RayTask, task_name: str) -> str:
        """The Jobs API address of a ready cluster that can hold ``config``."""
        if self.current is not None and self.current.can_host(config):
            return self.current.address
        if self.current is not None:
            self.run.info("the next RayTask does not fit the current RayCluster; replacing it")
            self.close()
        cluster = KubeRayCluster(config, run_id=self.run.run_id, task_name=task_name,
                                 settings=self.settings, on_progress=self.run.info)
        self.current = cluster
        with self.run.status(f"provisioning RayCluster {cluster.name}: {config.describe()}"):
            cluster.start()
        self.run.info(f"RayCluster {self.settings.namespace}/{cluster.name} ready; "
                      f"dashboard {cluster.dashboard_url}")
        return cluster.address

    def publish(self, deployments: list[dict[str, Any]], config: RayTask, call_id: str,
                project: Any) -> None:
        """Make the endpoints a task's ``deploy()`` calls stood up lasting RayServices.

        The task's cluster goes with the run; each endpoint it deployed (already proven to
        answer there) is applied as a RayService shaped like the task's RayTask, serving from
        the project the run sent, and waited for. Kubernetes credentials stay on this machine.
        """
        from michelangelo.uniflow.plugins.ray.kuberay._publish import publish

        publish(self, deployments, config, call_id, project)

    def close(self) -> None:
        cluster, self.current = self.current, None
        if cluster is not None:
            cluster.shutdown()
            self.run.info(f"RayCluster {self.settings.namespace}/{cluster.name} deleted")



def _run_clusters(run: Run) -> RunClusters | None:
    return RunClusters(run) if enabled(run.options) else None


register_run_provisioner(OPTION, _run_clusters)
