"""``sandbox create``: ordered, idempotent steps, each saying what it did or found done.

Every step first looks at what exists (a kind cluster, a helm release, an image, a Secret)
and only then acts, so a second ``create`` changes nothing and rerunning after a failure
continues where it stopped. The storage credentials are created once and then read back from
the cluster's Secret: MinIO keeps the root user it first started with.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from michelangelo.sandbox._build_images import BuiltImages, build_images
from michelangelo.sandbox._build_steps import FILES
from michelangelo.sandbox._commands import run
from michelangelo.sandbox._doctor import doctor, engine_info, engine_on_this_machine
from michelangelo.sandbox._errors import SandboxError
from michelangelo.sandbox._image import (
    IMAGE_REPOSITORY,
    find_project_root,
    plan_image,
    write_context,
)
from michelangelo.sandbox._kind_config import kind_config
from michelangelo.sandbox._node_images import ImageLoad, NodeImages
from michelangelo.sandbox._operator import operator_manifests
from michelangelo.sandbox._settings import (
    BUCKET,
    CLUSTER_NAME,
    CPU_REQUEST_FRACTION,
    HOST_PORTS,
    KUBE_CONTEXT,
    KUBERAY_NAMESPACE,
    KUBERAY_VERSION,
    NAMESPACE,
    STORAGE_SECRET,
    SandboxSettings,
    cache_root,
    settings_path,
    write_sandbox_settings,
)
from michelangelo.sandbox._storage import (
    BUCKET_JOB,
    MINIO_SERVICE,
    credentials_from_secret,
    in_cluster_endpoint,
    new_credentials,
    storage_manifests,
)

KUBERAY_REPO = ("kuberay", "https://ray-project.github.io/kuberay-helm/")
KUBERAY_RELEASE = "kuberay-operator"
_WAIT = "300s"
_LOAD_TIMEOUT_S = 900.0
NODE = f"{CLUSTER_NAME}-control-plane"


_DURATION = re.compile(r"^([1-9][0-9]*)(s|m|h)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class CreateOptions:
    """What ``create`` may vary: the project to build the image from, and the waits.

    Attributes:
        project_root: Source checkout the runtime image installs (default: this package's).
        wait: How long each rollout and the bucket Job may take, as kubectl writes
            durations (``300s``, ``15m``, ``1h``).
        build_images: Build every image here from package registries (Debian, the Go
            module proxy, PyPI) instead of pulling any: for machines that reach no image
            registry. The KubeRay operator is then applied from its release's own manifests
            (CRDs and RBAC role) instead of the helm chart.
        images_only: With ``build_images``: build (or find) the images, runtime image
            included, and stop there: no cluster, no settings file.
    """

    project_root: str | None = None
    wait: str = _WAIT
    build_images: bool = False
    images_only: bool = False

    def __post_init__(self) -> None:
        if self.images_only and not self.build_images:
            raise SandboxError("images_only=True builds the images --build-images makes; "
                               "pass build_images=True (--build-images) with it.")
        if not _DURATION.match(self.wait):
            raise SandboxError(f"wait={self.wait!r} is not a duration kubectl understands; "
                               "write a whole number with s, m or h, e.g. '300s' or '15m'.")

    @property
    def wait_s(self) -> float:
        """``wait`` in seconds, plus a margin for the command itself."""
        number, unit = _DURATION.match(self.wait).groups()
        return int(number) * _UNIT_S[unit] + 60.0


class Creator:
    """Runs the create steps in order, reporting each one through ``echo``."""

    def __init__(self, options: CreateOptions, echo: Callable[[str], None]) -> None:
        self.options = options
        self.echo = echo
        self.kubectl = ("kubectl", "--context", KUBE_CONTEXT)
        self._credentials: tuple[str, str] | None = None
        self._image: str | None = None
        self._built: BuiltImages | None = None
        self._node = NodeImages(NODE)
        self._loading: ImageLoad | None = None

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        if self.options.images_only:
            return [
                ("check tools", self.check_tools),
                ("images built on this machine", self.build_images),
                ("runtime image", self.build_image),
            ]
        # The runtime image (gigabytes) streams into the node in the background while the
        # operator and MinIO roll out; the last step before the settings waits for it.
        if self.options.build_images:
            return [
                ("check tools", self.check_tools),
                ("images built on this machine", self.build_images),
                ("runtime image", self.build_image),
                (f"kind cluster '{CLUSTER_NAME}'", self.kind_cluster),
                (f"kubeconfig context '{KUBE_CONTEXT}'", self.kube_context),
                ("operator and storage images loaded into kind", self.load_built_images),
                ("runtime image load into kind", self.start_image_load),
                ("KubeRay operator (its release's manifests)", self.kuberay_manifests),
                (f"MinIO and its credentials Secret '{STORAGE_SECRET}'", self.minio),
                (f"bucket '{BUCKET}'", self.bucket),
                ("runtime image loaded into kind", self.load_image),
                ("settings file", self.write_settings),
            ]
        return [
            ("check tools", self.check_tools),
            ("runtime image", self.build_image),
            (f"kind cluster '{CLUSTER_NAME}'", self.kind_cluster),
            (f"kubeconfig context '{KUBE_CONTEXT}'", self.kube_context),
            ("runtime image load into kind", self.start_image_load),
            (f"KubeRay operator {KUBERAY_VERSION} (helm)", self.kuberay),
            (f"MinIO and its credentials Secret '{STORAGE_SECRET}'", self.minio),
            (f"bucket '{BUCKET}'", self.bucket),
            ("runtime image loaded into kind", self.load_image),
            ("settings file", self.write_settings),
        ]

    def create(self) -> SandboxSettings | None:
        """Run every step; returns the settings written at the end (None: images only)."""
        steps = self.steps()
        try:
            for number, (title, step) in enumerate(steps, 1):
                self.echo(f"[{number}/{len(steps)}] {title} ...")
                started = time.monotonic()
                outcome = step()
                self.echo(f"      {outcome} ({time.monotonic() - started:.1f} s)")
        finally:
            if self._loading is not None:  # a step failed, or Ctrl-C, while it streamed
                self._loading.stop()
        return None if self.options.images_only else self.settings

    # -- steps -----------------------------------------------------------------------------
    def check_tools(self) -> str:
        bad = [r for r in doctor(build_images=self.options.build_images) if not r.ok]
        if bad:
            lines = "\n".join(f"  {r.name}: {r.problem}; {r.fix}" for r in bad)
            raise SandboxError(f"the sandbox cannot be created yet:\n{lines}")
        if self.options.build_images:
            return "the Docker engine, Go and debootstrap are ready"
        return "docker, kind, kubectl and helm are ready"

    def build_images(self) -> str:
        self._built = build_images(self.echo)
        built = {tag: s for tag, s in self._built.seconds.items() if s > 0}
        if not built:
            return "every image present, kept"
        return f"{len(built)} built in {sum(built.values()):.0f} s, the rest kept"

    def kind_cluster(self) -> str:
        if CLUSTER_NAME in run(("kind", "get", "clusters")).stdout.split():
            self._check_port_mappings()
            return "exists, kept"
        config = os.path.join(os.path.dirname(os.path.abspath(settings_path())),
                              "sandbox-kind.json")
        os.makedirs(os.path.dirname(config), exist_ok=True)
        info = engine_info() or {}
        store = self._image_store(info)
        with open(config, "w", encoding="utf-8") as handle:
            json.dump(kind_config(cgroup_v1=str(info.get("CgroupVersion")) == "1",
                                  image_store=store), handle, indent=2)
        image = ("--image", self._built.node) if self._built else ()
        run(("kind", "create", "cluster", "--name", CLUSTER_NAME, "--config", config,
             *image, "--wait", "120s"), timeout=900)
        ports = ", ".join(f"127.0.0.1:{host}" for host, _ in HOST_PORTS.values())
        kept = f"; node images kept in {store}" if store else ""
        return f"created (ports {ports}; config {config}{kept})"

    def _image_store(self, info: dict) -> str | None:
        """The folder the node's containerd keeps its images in across clusters: a built
        node (its boot drops what containers an earlier cluster left there before the
        kubelet starts) on an engine of this machine. Elsewhere (Docker Desktop's VM, a
        remote engine) each cluster's node unpacks its images afresh."""
        if not self._built or not engine_on_this_machine(info):
            return None
        store = cache_root() / "sandbox-node" / "containerd"
        store.mkdir(parents=True, exist_ok=True)
        return str(store)

    def _check_port_mappings(self) -> None:
        # kind cannot add port mappings to an existing cluster: one made without them (by
        # hand, or by an older version) must be recreated, and saying so beats a run that
        # cannot reach MinIO later.
        found = run(("docker", "inspect", "--format", "{{json .HostConfig.PortBindings}}",
                     NODE)).stdout
        bindings = json.loads(found or "{}") or {}
        missing = [f"127.0.0.1:{host}->{node_port}" for host, node_port in HOST_PORTS.values()
                   if not any(b.get("HostPort") == str(host) and b.get("HostIp") == "127.0.0.1"
                              for b in bindings.get(f"{node_port}/tcp") or [])]
        if missing:
            raise SandboxError(
                f"kind cluster '{CLUSTER_NAME}' exists without the port mappings "
                f"{', '.join(missing)}; kind cannot add them to a running cluster: run "
                "'michelangelo sandbox delete', then 'michelangelo sandbox create'.")

    def kube_context(self) -> str:
        # Rewrites the context if another tool replaced the kubeconfig; a no-op otherwise.
        run(("kind", "export", "kubeconfig", "--name", CLUSTER_NAME))
        return "ready"

    def kuberay(self) -> str:
        helm = ("--kube-context", KUBE_CONTEXT, "--namespace", KUBERAY_NAMESPACE)
        listed = json.loads(run(("helm", "list", *helm, "--output", "json")).stdout or "[]")
        release = next((r for r in listed if r.get("name") == KUBERAY_RELEASE), None)
        wanted = f"kuberay-operator-{KUBERAY_VERSION}"
        if release and release.get("chart") == wanted and release.get("status") == "deployed":
            outcome = "installed, kept"
        else:
            run(("helm", "repo", "add", *KUBERAY_REPO, "--force-update"))
            run(("helm", "upgrade", "--install", KUBERAY_RELEASE,
                 f"{KUBERAY_REPO[0]}/kuberay-operator", "--version", KUBERAY_VERSION,
                 *helm, "--create-namespace"), timeout=600)
            outcome = "installed" if release is None else \
                f"upgraded from {release.get('chart')} ({release.get('status')})"
        run((*self.kubectl, "--namespace", KUBERAY_NAMESPACE, "rollout", "status",
             f"deployment/{KUBERAY_RELEASE}", f"--timeout={self.options.wait}"),
            timeout=self.options.wait_s)
        return f"{outcome}; operator deployment available"

    def load_built_images(self) -> str:
        built = self._built
        tags = (built.operator, built.minio, built.mc)
        missing = self._node.missing(tags)
        if not missing:
            return f"{', '.join(tags)} on the node, kept"
        seconds = self._finish_load(self._node.start(missing))
        return f"{', '.join(missing)} loaded in {seconds:.0f} s"

    def kuberay_manifests(self) -> str:
        built = self._built
        crds = sorted((built.operator_source / "config" / "crd" / "bases").glob("*.yaml"))
        role = built.operator_source / "config" / "rbac" / "role.yaml"
        for path in (*crds, role):
            # Server-side: the CRDs are larger than client-side apply's annotation allows.
            run((*self.kubectl, "apply", "--server-side", "--force-conflicts",
                 "--filename", str(path)), timeout=self.options.wait_s)
        run((*self.kubectl, "apply", "--filename", "-"),
            input=json.dumps(operator_manifests(KUBERAY_NAMESPACE, built.operator)))
        run((*self.kubectl, "--namespace", KUBERAY_NAMESPACE, "rollout", "status",
             f"deployment/{KUBERAY_RELEASE}", f"--timeout={self.options.wait}"),
            timeout=self.options.wait_s)
        return (f"KubeRay {built.operator_version}: {len(crds)} CRDs, its role, and the "
                "operator deployment available")

    def minio(self) -> str:
        found = run((*self.kubectl, "--namespace", NAMESPACE, "get", "secret", STORAGE_SECRET,
                     "--output", "json", "--ignore-not-found"))
        existing = credentials_from_secret(json.loads(found.stdout)) if found.stdout.strip() \
            else None
        self._credentials = existing or new_credentials()
        images = {"minio_image": self._built.minio, "mc_image": self._built.mc} \
            if self._built else {}
        manifests = storage_manifests(NAMESPACE, *self._credentials, **images)
        applied = run((*self.kubectl, "apply", "--filename", "-"),
                      input=json.dumps(manifests)).stdout
        run((*self.kubectl, "--namespace", NAMESPACE, "rollout", "status",
             f"deployment/{MINIO_SERVICE}", f"--timeout={self.options.wait}"),
            timeout=self.options.wait_s)
        changed = sum(1 for line in applied.splitlines()
                      if line.rstrip().endswith(("created", "configured")))
        credentials = "kept" if existing else "new"
        return (f"{changed} object(s) created or changed, credentials {credentials}; "
                f"S3 at http://127.0.0.1:{HOST_PORTS['s3'][0]}")

    def bucket(self) -> str:
        run((*self.kubectl, "--namespace", NAMESPACE, "wait", "--for=condition=complete",
             f"job/{BUCKET_JOB}", f"--timeout={self.options.wait}"),
            timeout=self.options.wait_s)
        return f"s3://{BUCKET} exists"

    def build_image(self) -> str:
        root = self.options.project_root or find_project_root()
        if self._built:
            plan = plan_image(root, base=self._built.base,
                              dockerfile=str(FILES / "runtime" / "Dockerfile"))
        else:
            plan = plan_image(root)
        self._image = plan.tag
        if run(("docker", "image", "inspect", plan.tag), check=False).returncode == 0:
            return f"{plan.tag} exists, kept"
        with tempfile.TemporaryDirectory(prefix="michelangelo-sandbox-") as context:
            dockerfile = write_context(root, context, plan.dockerfile)
            build_args = [arg for key, value in sorted(plan.build_args.items())
                          for arg in ("--build-arg", f"{key}={value}")]
            run(("docker", "build", "--tag", plan.tag, *build_args, "--file", dockerfile,
                 context), timeout=3600)
        removed = self._remove_older_images(plan.tag)
        return f"{plan.tag} built from {plan.base_image}" + \
            (f"; {removed} older one(s) removed" if removed else "")

    @staticmethod
    def _remove_older_images(current: str) -> int:
        """Remove the runtime images earlier projects built (each is gigabytes; a new tag
        supersedes them, and a later create rebuilds one if its project comes back). An
        image a container still uses stays."""
        listed = run(("docker", "images", IMAGE_REPOSITORY, "--format",
                      "{{.Repository}}:{{.Tag}}")).stdout.split()
        older = [tag for tag in listed if tag != current and not tag.endswith(":<none>")]
        return sum(run(("docker", "image", "rm", tag), check=False).returncode == 0
                   for tag in older)

    def start_image_load(self) -> str:
        missing = self._node.missing([self._image])
        if not missing:
            return f"{self._image} on the node, kept"
        self._loading = self._node.start(missing)
        return f"{self._image} streaming into the node while the next steps run"

    def load_image(self) -> str:
        outcome = f"{self._image} on the kind node"
        if self._loading is not None:
            outcome += f", loaded in {self._finish_load(self._loading):.0f} s"
        # the node keeps its own copy of each runtime image loaded into it
        removed = self._node.remove_others(IMAGE_REPOSITORY, self._image.split(":", 1)[1])
        return outcome + (f"; {removed} older runtime image(s) removed from it" if removed
                          else "")

    def _finish_load(self, load: ImageLoad) -> float:
        self._loading = load  # stopped by create() if this wait is interrupted
        seconds = load.wait(_LOAD_TIMEOUT_S)
        self._loading = None
        return seconds

    def write_settings(self) -> str:
        path = write_sandbox_settings(self.settings)
        return f"{path} (mode 0600)"

    @property
    def settings(self) -> SandboxSettings:
        if self._credentials is None or self._image is None:
            raise SandboxError("the settings are known only after the storage and image steps")
        return SandboxSettings(
            kube_context=KUBE_CONTEXT,
            namespace=NAMESPACE,
            image=self._image,
            storage_url=f"s3://{BUCKET}/uniflow",
            s3_endpoint=f"http://127.0.0.1:{HOST_PORTS['s3'][0]}",
            s3_endpoint_in_cluster=in_cluster_endpoint(NAMESPACE),
            storage_secret=STORAGE_SECRET,
            node_ports={name: node for name, (_, node) in HOST_PORTS.items()},
            cpu_request_fraction=CPU_REQUEST_FRACTION,
            access_key=self._credentials[0],
            secret_key=self._credentials[1],
        )


def create_sandbox(options: CreateOptions | None = None,
                   echo: Callable[[str], None] = print) -> SandboxSettings | None:
    """Create (or complete) the sandbox; see the module docstring for the steps. Returns the
    settings written, or None when ``options.images_only`` built the images alone."""
    return Creator(options or CreateOptions(), echo).create()
