"""Each image the sandbox runs, built here from package registries only.

Sources: Debian's packages (``debootstrap`` and ``apt-get``), the Go module proxy (Kubernetes,
etcd, CoreDNS, kind, the KubeRay operator, MinIO) and PyPI (Ray, torch and this project).
No image registry is contacted. The versions are pinned here and in ``go_proxy_build.sh``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from michelangelo.sandbox._build_steps import (
    FILES,
    Builds,
    binary_image,
    docker_build,
    go_build,
    save_images,
)
from michelangelo.sandbox._commands import tail
from michelangelo.sandbox._errors import SandboxError

K8S_VERSION = "1.36.3"
# The images kubeadm v1.36 deploys, under the names it asks containerd for (its constants).
ETCD_TAG = "3.6.8-0"
COREDNS_VERSION = "1.14.2"
PAUSE_TAG = "3.10.2"
KIND_VERSION = "0.33.0"
# Debian release per Python minor version: the runtime image runs the client's Python.
DEBIAN_FOR_PYTHON = {(3, 11): "bookworm", (3, 13): "trixie"}
DEBIAN_MIRROR_ENV = "MICHELANGELO_DEBIAN_MIRROR"
_DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Certificate authorities this machine added (Debian's place for them). The base image carries
# them, so that builds inside it reach registries behind a network that inspects TLS.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
_REPO = "michelangelo-sandbox"
# The pins above are the ones go_proxy_build.sh builds.
_GO_PINS = {"K8S_VERSION": K8S_VERSION, "COREDNS_VERSION": COREDNS_VERSION,
            "KIND_VERSION": KIND_VERSION}


class _GoPrograms:
    """Each ``go_proxy_build.sh`` target at the pins above, run once per image build and only
    when an image needs it. Each says how long it took (a target already in the cache takes
    well under a second), so that the log shows what every image cost."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._folders: dict[tuple[str, ...], Path] = {}
        self._echo = echo

    def __call__(self, *target: str) -> Path:
        if target not in self._folders:
            started = time.monotonic()
            self._folders[target] = go_build(*target, versions=_GO_PINS)
            took = time.monotonic() - started
            name = target[-1] if target[0] == "local" else target[0]
            self._echo(f"      Go programs '{name}' (module proxy, cached by version): "
                       f"{took:.1f} s")
        return self._folders[target]


@dataclass(frozen=True)
class BuiltImages:
    """The tags a ``--build-images`` sandbox runs, and how long each build took (0: kept).

    Attributes:
        base: The Debian base image (the runtime image is built on it).
        node: The kind node image (Kubernetes and its control-plane images inside).
        operator: The KubeRay operator image; ``operator_version`` is its release.
        minio: The object store's server image.
        mc: The object store's client image (it makes the bucket).
        operator_source: The operator's source tree (its CRDs and RBAC role are applied).
        tools: Folder with ``kind`` and ``kubectl`` at the pinned versions.
        seconds: Build time per tag in this call.
    """

    base: str
    node: str
    operator: str
    operator_version: str
    minio: str
    mc: str
    operator_source: Path
    tools: Path
    seconds: dict[str, float] = field(default_factory=dict)


def debian_release() -> str:
    """The Debian release whose ``python3`` has this client's minor version."""
    wanted = sys.version_info[:2]
    release = DEBIAN_FOR_PYTHON.get(wanted)
    if release is None:
        known = ", ".join(f"{major}.{minor} ({name})"
                          for (major, minor), name in sorted(DEBIAN_FOR_PYTHON.items()))
        raise SandboxError(
            f"--build-images builds the Ray image on Debian's Python, and no Debian release "
            f"here has Python {wanted[0]}.{wanted[1]} (the client's); known: {known}. Fix: run "
            "the client on one of those Python versions, or create the sandbox with registry "
            "access (without --build-images).")
    return release


def base_image_tag() -> str:
    """The tag of the Debian base image for this client's Python."""
    return f"{_REPO}/debian:{debian_release()}"


def base_image(builds: Builds) -> str:
    """A minimal Debian image made by ``debootstrap`` (no registry involved)."""
    release, tag = debian_release(), base_image_tag()
    return builds.ensure(tag, lambda: _debootstrap(release, tag), "debootstrap --variant=minbase")


def _debootstrap(release: str, tag: str) -> None:
    if shutil.which("debootstrap") is None:
        raise SandboxError("building the base image needs debootstrap: install it "
                           "(apt-get install debootstrap) and run as root, or create the "
                           "sandbox with registry access (without --build-images).")
    if os.geteuid() != 0:
        raise SandboxError("debootstrap must run as root to make the base image: run "
                           "'sudo michelangelo sandbox create --build-images' once (later runs "
                           "reuse the image).")
    mirror = os.environ.get(DEBIAN_MIRROR_ENV) or _DEBIAN_MIRROR
    with tempfile.TemporaryDirectory(prefix="michelangelo-rootfs-") as root:
        done = subprocess.run(["debootstrap", "--variant=minbase", release, root, mirror],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              check=False)
        if done.returncode != 0:
            raise SandboxError(f"debootstrap {release} from {mirror} failed (set "
                               f"{DEBIAN_MIRROR_ENV} to another mirror):\n{tail(done.stdout)}")
        if LOCAL_CAS.is_dir():
            target = Path(root) / "usr" / "local" / "share" / "ca-certificates"
            target.mkdir(parents=True, exist_ok=True)
            for certificate in LOCAL_CAS.glob("*.crt"):
                shutil.copy2(certificate, target / certificate.name)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout,
                                  capture_output=True, text=True, check=False)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise SandboxError(f"docker import of the {release} root failed:\n"
                               f"{tail(imported.stderr)}")


def _files_hash(*folders: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def control_plane_images(builds: Builds, go: _GoPrograms, base: str) -> list[str]:
    """The images kubeadm starts, built from the Go module proxy, under kubeadm's names."""
    plane = go("k8s")
    node = go("node")
    coredns = go("coredns")
    pause = go("local", str(FILES / "go" / "pause"), "pause")
    version = f"v{K8S_VERSION}"
    tags = []
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        tags.append(builds.ensure(f"registry.k8s.io/{name}:{version}",
                                  lambda n=name: binary_image(f"registry.k8s.io/{n}:{version}",
                                                              plane / n), "Go module proxy"))
    tags.append(builds.ensure(f"registry.k8s.io/etcd:{ETCD_TAG}",
                              lambda: binary_image(f"registry.k8s.io/etcd:{ETCD_TAG}",
                                                   plane / "etcd"), "Go module proxy"))
    coredns_tag = f"registry.k8s.io/coredns/coredns:v{COREDNS_VERSION}"
    tags.append(builds.ensure(coredns_tag, lambda: binary_image(
        coredns_tag, coredns / "coredns", entrypoint=True), "Go module proxy"))
    pause_tag = f"registry.k8s.io/pause:{PAUSE_TAG}"
    tags.append(builds.ensure(pause_tag, lambda: binary_image(
        pause_tag, pause / "pause", entrypoint=True), "this project's pause program"))
    # kube-proxy programs iptables: it needs the iptables commands beside it.
    proxy_tag = f"registry.k8s.io/kube-proxy:{version}"
    tags.append(builds.ensure(proxy_tag, lambda: binary_image(
        proxy_tag, node / "kube-proxy", base=base,
        packages=("iptables", "conntrack", "ipset", "kmod")),
        "Go module proxy and Debian's iptables"))
    return tags


def node_image(builds: Builds, go: _GoPrograms, base: str) -> str:
    """The kind node: systemd, containerd and the kubelet, with the control plane inside."""
    node_bins = go("node")
    capfilter = go("local", str(FILES / "go" / "runc-capfilter"), "runc-capfilter")
    node_files = FILES / "node"
    tag = f"{_REPO}/node:v{K8S_VERSION}-" + _files_hash(
        node_files, FILES / "go", extra=f"{base} {ETCD_TAG} {COREDNS_VERSION} {PAUSE_TAG}")

    def build() -> None:
        images = control_plane_images(builds, go, base)
        with tempfile.TemporaryDirectory(prefix="michelangelo-node-") as folder:
            context = Path(folder)
            shutil.copytree(node_files, context, dirs_exist_ok=True)
            (context / "rootfs" / "kind").mkdir(parents=True, exist_ok=True)
            (context / "rootfs" / "kind" / "version").write_text(f"v{K8S_VERSION}\n")
            (context / "bin").mkdir()
            for name in ("kubelet", "kubeadm", "kubectl"):
                shutil.copy2(node_bins / name, context / "bin" / name)
            shutil.copy2((capfilter / "runc-capfilter").resolve(),
                         context / "bin" / "runc-capfilter")
            save_images(images, context / "images")
            docker_build(tag, context, {"BASE_IMAGE": base})

    return builds.ensure(tag, build, f"Kubernetes v{K8S_VERSION} from the Go module proxy")


def operator_image(builds: Builds, go: _GoPrograms) -> tuple[str, str, Path]:
    """The KubeRay operator image; returns its tag, release and source tree."""
    operator_bin = go("kuberay")
    match = re.fullmatch(r"kuberay-v(\d+\.\d+\.\d+)", operator_bin.parent.name)
    if match is None:
        raise SandboxError(f"cannot tell the KubeRay release built in {operator_bin}")
    version = match.group(1)
    tag = f"{_REPO}/kuberay-operator:v{version}"
    builds.ensure(tag, lambda: binary_image(tag, operator_bin / "kuberay-operator",
                                            user="65532:65532"), "Go module proxy")
    return tag, version, operator_bin.parent / "src"


def minio_images(builds: Builds, go: _GoPrograms, base: str) -> tuple[str, str]:
    """The object store's server and client images (on the Debian base: the bucket Job runs
    a shell)."""
    folder = go("minio")
    version = folder.parent.name.removeprefix("minio-")
    server = f"{_REPO}/minio:{version}"
    client = f"{_REPO}/mc:{version}"
    builds.ensure(server, lambda: binary_image(server, folder / "minio", base=base,
                                               entrypoint=True), "Go module proxy")
    builds.ensure(client, lambda: binary_image(client, folder / "mc", base=base),
                  "Go module proxy")
    return server, client


def build_images(echo: Callable[[str], None]) -> BuiltImages:
    """Build (or find) every image a ``--build-images`` sandbox runs but the Ray runtime
    image, which ``create`` builds from the project like in the other mode."""
    builds, go = Builds(echo), _GoPrograms(echo)
    base = base_image(builds)
    node = node_image(builds, go, base)
    operator, operator_version, source = operator_image(builds, go)
    minio, mc = minio_images(builds, go, base)
    tools = go("kind")
    kubectl = go("node") / "kubectl"
    if not (tools / "kubectl").exists():
        (tools / "kubectl").symlink_to(kubectl)
    return BuiltImages(base=base, node=node, operator=operator, operator_version=operator_version,
                       minio=minio, mc=mc, operator_source=source, tools=tools,
                       seconds=dict(builds.timings))

