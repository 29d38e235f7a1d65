"""Docker images into the kind node's containerd, streamed: ``docker save`` piped straight
into ``ctr images import`` inside the node.

``kind load docker-image`` writes the whole archive to a temporary file first and reads it
back: for the runtime image (about 6 GB, torch included) that is gigabytes written twice. The
stream writes nothing on this side. Each image imported is labelled with its Docker image ID,
so a second ``create`` on the same cluster finds it there and loads nothing (kind compares the
same IDs, but through ``crictl``, which the node image built here does not have). A load can
run in the background while the other create steps wait on Kubernetes.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Sequence

from michelangelo.sandbox._commands import require_tool, run, tail
from michelangelo.sandbox._errors import SandboxError

ID_LABEL = "michelangelo.sandbox/docker-image-id"
_SNAPSHOTTER = re.compile(r"""^\s*snapshotter\s*=\s*["']([A-Za-z0-9_.-]+)["']""", re.M)


def containerd_name(tag: str) -> str:
    """The name containerd gives an image Docker calls ``tag`` (Docker's short names are
    ``docker.io/library/...``)."""
    first = tag.split("/", 1)[0]
    if "/" not in tag:
        return f"docker.io/library/{tag}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{tag}"
    return tag


class NodeImages:
    """The images of one kind node, and loads into it."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.ctr = ("docker", "exec", node, "ctr", "--namespace", "k8s.io")

    def missing(self, tags: Sequence[str]) -> dict[str, str]:
        """The tags whose Docker image (by ID) the node does not hold yet, with those IDs."""
        held = self.labelled_ids()
        return {tag: image_id for tag, image_id in zip(tags, _docker_ids(tags), strict=True)
                if held.get(containerd_name(tag)) != image_id}

    def labelled_ids(self) -> dict[str, str]:
        """containerd name -> the Docker image ID it was loaded from (labelled images only)."""
        return {ref: labels[ID_LABEL] for ref, labels in (self._listing() or {}).items()
                if ID_LABEL in labels}

    def remove_others(self, repository: str, keep: str) -> int:
        """Remove the node's images of ``repository`` but the tag ``keep`` and any that a
        container still runs (the node's disk is this machine's); returns how many went.
        ``ctr`` is in every kind node image (``crictl`` is not in the one built here)."""
        listing = self._listing()
        containers = run((*self.ctr, "containers", "list"), check=False)
        if listing is None or containers.returncode != 0:
            return 0
        in_use = {line.split()[1] for line in containers.stdout.splitlines()[1:]
                  if len(line.split()) > 1}
        older = [ref for ref in listing
                 if f"/{repository}:" in ref and not ref.endswith(f":{keep}")
                 and ref not in in_use]
        return sum(run((*self.ctr, "images", "remove", ref), check=False).returncode == 0
                   for ref in older)

    def _listing(self) -> dict[str, dict[str, str]] | None:
        """containerd name -> its labels, from one ``ctr images list`` (None if it failed)."""
        listed = run((*self.ctr, "images", "list"), check=False)
        if listed.returncode != 0:
            return None
        found = {}
        for line in listed.stdout.splitlines()[1:]:
            words = line.split()
            if words:
                found[words[0]] = dict(pair.split("=", 1) for pair in words[-1].split(",")
                                       if "=" in pair)
        return found

    def start(self, images: dict[str, str]) -> ImageLoad:
        """Start streaming ``images`` (tag -> Docker image ID, as :meth:`missing` gives them)
        into the node; :meth:`ImageLoad.wait` finishes it."""
        return ImageLoad(self, dict(images))

    def label(self, images: dict[str, str]) -> None:
        for tag, image_id in images.items():
            run((*self.ctr, "images", "label", containerd_name(tag), f"{ID_LABEL}={image_id}"))

    def snapshotter(self) -> str:
        """The snapshotter the node's CRI unpacks images with (``overlayfs`` unless the node
        was configured otherwise); an import must unpack into the same one."""
        dump = run(("docker", "exec", self.node, "containerd", "config", "dump"), check=False)
        found = _SNAPSHOTTER.findall(dump.stdout)
        return next((name for name in found if name), "overlayfs")


class ImageLoad:
    """One running ``docker save ... | docker exec -i NODE ctr images import -``."""

    def __init__(self, node: NodeImages, images: dict[str, str]) -> None:
        self.node = node
        self.images = images
        self.tags = list(images)
        self.started = time.monotonic()
        # closed by wait() or stop(), which every caller reaches
        self._errors = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]  # noqa: SIM115
        self._procs: list[subprocess.Popen] = []
        if not images:
            return
        save = (require_tool("docker"), "save", *self.tags)
        load = (require_tool("docker"), "exec", "-i", node.node, "ctr", "--namespace", "k8s.io",
                "images", "import", "--all-platforms", "--digests",
                f"--snapshotter={node.snapshotter()}", "-")
        saver = subprocess.Popen(save, stdout=subprocess.PIPE, stderr=self._errors[0],
                                 stdin=subprocess.DEVNULL)
        try:
            loader = subprocess.Popen(load, stdin=saver.stdout, stdout=subprocess.DEVNULL,
                                      stderr=self._errors[1])
        except BaseException:
            saver.kill()
            saver.wait()
            raise
        saver.stdout.close()  # the loader holds the pipe now; a dead loader stops the saver
        self._procs = [saver, loader]

    def wait(self, timeout: float) -> float:
        """Wait for the load to end; returns its seconds since :meth:`start`.

        Raises:
            SandboxError: Either side failed or ran past ``timeout`` (then both are stopped).
        """
        deadline = self.started + timeout
        try:
            for proc in self._procs:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.stop()
            raise SandboxError(f"loading {', '.join(self.tags)} into the kind node took over "
                               f"{timeout:.0f} s.") from None
        try:
            for proc, errors, side in zip(self._procs, self._errors,
                                          ("docker save", "ctr images import"), strict=False):
                if proc.returncode != 0:
                    errors.seek(0)
                    raise SandboxError(
                        f"loading {', '.join(self.tags)} into the kind node failed in "
                        f"'{side}' (exit {proc.returncode}):\n{tail(errors.read())}")
        finally:
            self._close()
        if self.images:
            self.node.label(self.images)
        return time.monotonic() - self.started

    def stop(self) -> None:
        """End both sides (an interrupted create); the node keeps no half image (containerd
        imports an image only once all its content is in)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._close()

    def _close(self) -> None:
        for errors in self._errors:
            errors.close()


def _docker_ids(tags: Sequence[str]) -> list[str]:
    """Docker's image IDs of ``tags``, in their order."""
    return run(("docker", "image", "inspect", "--format", "{{.Id}}", *tags)).stdout.split()
