"""Serving: a canary at 20% under a steady stream, and failed requests across rollout verbs.

One local Ray cluster, one endpoint (``deploy`` of revision 1 of a small registered MLP).
Two clients send one row after another without pause, one on the endpoint's prefix
(``POST /{name}``), one at the server's root (``POST /v2/models/{name}/infer``), and note
which revision answered each request (``model`` / ``model_version``) and every failure.
While they run, the phases are:

1. ``deploy(rev2, name=..., canary=0.2)``, then REQUESTS answers are counted: the share that
   revision 2 answered (target: within 5 points of 20%), on each path.
2. ``rollback(name)``.
3. ``deploy(rev2, canary=0.2)`` again, then a redeploy of a revision that fails readiness
   (its output differs from the one recorded at registration): ``deploy`` raises.
4. ``promote(name)``, until 50 answers in a row come from revision 2.

Reported: the canary's share, failed requests per phase (target: zero in all), the time each
verb took, requests answered. For comparison (the raw arm), the same failing revision is
given to Ray Serve's own in-place update (``serve.run`` over a live endpoint of the same
kind, as ``deploy`` did before it proved revisions first) under the same stream, and its
failed requests are counted.

    .venv/bin/python bench/bench_serving_rollout.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import NOISE_NOTE, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

FEATURES = 8


def create_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))


class Drifting(nn.Module):
    """Adds a random buffer that is not saved: no other process reproduces its example."""

    def __init__(self) -> None:
        super().__init__()
        self.net = create_model()
        self.register_buffer("noise", torch.randn(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + self.noise


def create_drifting() -> nn.Module:
    return Drifting()


class Stream:
    """Clients sending one row after another; every answer's revision, every failure."""

    def __init__(self, targets: list[tuple[str, str, dict]]) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers: list[tuple[str, int]] = []
        self.failures: list[tuple[str, str]] = []
        self.answered_at: list[float] = []
        self.threads = [threading.Thread(target=self._run, args=t) for t in targets]

    def _run(self, path: str, url: str, body: dict) -> None:
        data = json.dumps(body).encode()
        while not self.stop.is_set():
            request = urllib.request.Request(url, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    answer = json.loads(response.read())
                revision = (answer["model"]["revision_id"] if "model" in answer
                            else int(answer["model_version"]))
                with self.lock:
                    self.answers.append((path, revision))
                    self.answered_at.append(time.monotonic())
            except urllib.error.HTTPError as exc:
                with self.lock:
                    self.failures.append((path, f"{exc.code} {exc.read()[:200]!r}"))
            except Exception as exc:
                with self.lock:
                    self.failures.append((path, f"{type(exc).__name__}: {exc}"))

    def longest_silence(self, since: float) -> float:
        """The longest time after ``since`` with no answer (up to now)."""
        with self.lock:
            times = [since] + [t for t in self.answered_at if t > since] + [time.monotonic()]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def mark(self) -> tuple[int, int]:
        with self.lock:
            return len(self.answers), len(self.failures)

    def wait(self, done, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> Stream:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def _targets(endpoint) -> list[tuple[str, str, dict]]:
    row = [0.5] * FEATURES
    return [("prefix", endpoint.url, {"inputs": [row]}),
            ("root", endpoint.root_infer_url,
             {"inputs": [{"name": "input", "shape": [1, FEATURES], "datatype": "FP32",
                          "data": row}]})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000,
                        help="answers counted while the canary takes 20%%")
    args = parser.parse_args()

    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.lib.serving import DeploymentError, deploy, promote, rollback
    from michelangelo.uniflow.plugins.ray import LocalRayCluster, RayTask
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    work = tempfile.mkdtemp(prefix="ma-bench-rollout-")
    registry = ModelRegistry(os.path.join(work, "registry"))
    example = torch.randn(2, FEATURES)
    revisions = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        revisions.append(registry.register("bench", "mlp", model=create_model(),
                                           create_model_fn=create_model, input_example=example))
    drifting = registry.register("bench", "drifting", model=create_drifting(),
                                 create_model_fn=create_drifting, input_example=example)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH"))
        if p)
    cluster = LocalRayCluster(RayTask(head_cpu=3, head_memory="4Gi"), os.path.join(work, "logs"))
    cluster.start()
    port = free_port()
    phases: list[list] = []
    verbs: dict[str, float] = {}
    try:
        endpoint = deploy(revisions[0], name="mlp", registry=registry, port=port)
        stable, canary = revisions[0].revision_id, revisions[1].revision_id
        with Stream(_targets(endpoint)) as stream:
            stream.wait(lambda: len(stream.answers) >= 50)

            def phase(name: str, action) -> None:
                answers, failures = stream.mark()
                start = time.perf_counter()
                action()
                verbs[name] = time.perf_counter() - start
                after = stream.mark()[0]
                stream.wait(lambda: len(stream.answers) >= after + 50)
                now = stream.mark()
                phases.append([name, now[0] - answers, now[1] - failures, verbs[name]])
                print(f"{name}: {verbs[name]:.1f}s, {now[0] - answers} answered, "
                      f"{now[1] - failures} failed", flush=True)

            sequence_start = time.monotonic()
            phase("canary 20%", lambda: deploy(revisions[1], name="mlp", registry=registry,
                                               canary=0.2))
            first = stream.mark()[0]
            stream.wait(lambda: len(stream.answers) >= first + args.requests)
            counted = stream.answers[first:first + args.requests]
            phase("rollback", lambda: rollback("mlp"))
            phase("canary 20% again", lambda: deploy(revisions[1], name="mlp",
                                                     registry=registry, canary=0.2))

            def failed_redeploy() -> None:
                try:
                    deploy(drifting, name="mlp", registry=registry, port=port)
                except DeploymentError as exc:
                    print(f"  deploy raised as it should: {str(exc)[:160]}...", flush=True)
                else:
                    raise SystemExit("the failing revision was deployed")

            phase("failed-readiness redeploy", failed_redeploy)
            phase("promote", lambda: promote("mlp"))
            stream.wait(lambda: [r for _, r in stream.answers[-50:]] == [canary] * 50)
            silence = stream.longest_silence(sequence_start)
        failures = list(stream.failures)
        last = stream.answers[-1][1]
        raw = _raw_serve_update(endpoint, drifting, registry, port)
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    share = sum(r == canary for _, r in counted) / len(counted)
    per_path = {path: sum(r == canary for p, r in counted if p == path)
                / max(1, sum(p == path for p, _ in counted)) for path in ("prefix", "root")}
    print_table(f"canary at 20% beside revision {stable} ({len(counted)} answers counted)",
                ["path", "share answered by the canary"],
                [[p, f"{100 * s:.1f}%"] for p, s in per_path.items()]
                + [["both", f"{100 * share:.1f}%"]])
    print_table("failed requests while each verb ran (and the 50 answers after it)",
                ["phase", "answered", "failed", "verb took (s)"], phases)
    print_table("raw: Ray Serve's own in-place update to the failing revision (from its start)",
                ["answered", "failed", "longest time without an answer (s)", "serve.run raised"],
                [[raw["answered"], raw["failed"], raw["longest_silence_s"], raw["error"]]])
    print(f"\ncanary share {100 * share:.1f}% (target 20% +- 5 points: "
          f"{'met' if abs(share - 0.2) <= 0.05 else 'NOT met'}); failed requests across "
          f"canary, rollback, failed redeploy and promote: {len(failures)} (target 0: "
          f"{'met' if not failures else 'NOT met'}); longest time without an answer "
          f"{silence:.2f}s; endpoint ends on revision {last}")
    for failure in failures[:5]:
        print(f"  failure: {failure}")
    print(NOISE_NOTE)
    write_results("serving_rollout", {
        "args": vars(args), "canary_share": share, "canary_share_per_path": per_path,
        "phases": [dict(zip(["phase", "answered", "failed", "seconds"], p, strict=True))
                   for p in phases],
        "failures": failures, "longest_silence_s": silence, "raw_serve_update": raw})


def _raw_serve_update(endpoint, drifting, registry, port) -> dict:
    """Serve's own update of a live endpoint to the failing revision, under the same stream."""
    import dataclasses

    from ray import serve

    from michelangelo.lib.serving import deploy
    from michelangelo.lib.serving._app import build_app

    raw = deploy(endpoint.spec, name="raw", registry=registry, port=port)
    failing = dataclasses.replace(
        raw.description, project_name="bench", model_name="drifting",
        revision_id=drifting.revision_id, weights_sha256=registry.get(drifting).weights_sha256)
    error = ""
    with Stream(_targets(raw)) as stream:
        stream.wait(lambda: len(stream.answers) >= 50)
        before = stream.mark()
        started = time.monotonic()
        try:
            serve.run(build_app({"description": failing.to_dict()}), name="raw",
                      route_prefix=failing.route_prefix)
        except Exception as exc:
            error = type(exc).__name__
        mark = sum(stream.mark())
        stream.wait(lambda: sum(stream.mark()) >= mark + 50, timeout=60)
        silence = stream.longest_silence(started)
    after = stream.mark()  # the clients' last requests included (timed out or answered)
    serve.delete("raw")
    return {"answered": after[0] - before[0], "failed": after[1] - before[1], "error": error,
            "longest_silence_s": silence, "failures": stream.failures[:5]}


if __name__ == "__main__":
    main()
