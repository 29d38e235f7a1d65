"""Provisioning timeline of a KubeRay RayCluster on the real test control plane.

Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the real KubeRay
operator (v1.7.0, or v1.6.2 where v1.7.0 cannot be built; see tools/build_kuberay_bed.sh), two
Node objects served by the kubelet test double, then
provisions a RayTask's cluster with the real provisioner and prints, per run, the seconds from
creation to each phase: scheduled, head ready, ready (every Ray node alive), first task
(a no-op Ray job finished through the Jobs API) and deleted (pods gone). It also times one
dashboard request by the head pod's address against the same request through the API server's
port-forward, side by side.

    .venv/bin/python bench/bench_kuberay.py [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from _common import write_results  # noqa: E402

from tools.kuberay_bed import NODES, ControlPlane, KubeletDouble, build, build_operator  # noqa: E402

PHASES = ("scheduled", "head ready", "ready", "first task", "deleted")


def one_run(api, index: int) -> dict[str, float]:
    from michelangelo.uniflow.plugins.ray import RayTask
    from michelangelo.uniflow.plugins.ray._remote._jobs import JobsCluster
    from michelangelo.uniflow.plugins.ray.kuberay._provisioner import KubeRayCluster

    task = RayTask(head_cpu=1, head_memory="1Gi", worker_cpu=1, worker_memory="1Gi",
                   worker_instances=1)
    cluster = KubeRayCluster(task, run_id=f"20261130-00000{index}-bench{index}",
                             task_name="bench", api=api)
    try:
        cluster.start()
        latency = request_latency(api, cluster)
        jobs = JobsCluster(cluster.address)
        status, _ = jobs.run_job(entrypoint="python -c pass", runtime_env={},
                                 submission_id=f"bench-{index}-{os.getpid()}",
                                 echo=lambda text: None)
        assert status == "SUCCEEDED", status
        first_task = time.time()
    finally:
        cluster.shutdown()
    while api.pods("default", f"ray.io/cluster={cluster.name}"):
        time.sleep(0.2)
    # The cluster's own timeline (its state transitions), then what only the bench sees.
    marks = {**cluster.timeline, "first task": first_task, "deleted": time.time()}
    created = marks["created"]
    return {**{phase: marks[phase] - created for phase in PHASES}, **latency}


def request_latency(api, cluster, requests: int = 40) -> dict[str, float]:
    """Median ms of one dashboard request, by the head pod's address and through the API
    server's port-forward (a new connection, hence a new stream, per request), alternated."""
    import urllib.request

    forward = api.port_forward(cluster.namespace, cluster._current_head, 8265)
    urls = {"pod address ms": f"http://{cluster.head_ip}:8265/api/version",
            "port-forward ms": f"{forward.url}/api/version"}
    times: dict[str, list[float]] = {key: [] for key in urls}
    try:
        for _ in range(requests):
            for key, url in urls.items():
                started = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as response:
                    response.read()
                times[key].append((time.perf_counter() - started) * 1000)
    finally:
        forward.close()
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from michelangelo.uniflow.plugins.ray.kuberay import KubeApi, KubeTarget

    plane = ControlPlane(build(), build_operator()).start()
    try:
        for name, amounts in NODES.items():
            plane.add_node(name, **amounts)
        client = plane.api_client()
        kubelet = KubeletDouble(client, list(NODES), net_file=plane.net_file).start()
        try:
            api = KubeApi(KubeTarget(kubeconfig=str(plane.kubeconfig)))
            runs = [one_run(api, i) for i in range(args.runs)]
        finally:
            kubelet.stop()
    finally:
        plane.stop()
    print(f"{'phase':<12} " + " ".join(f"run {i + 1:>2}" for i in range(len(runs)))
          + "   median (s after the RayCluster was created)")
    medians = {}
    for phase in PHASES:
        values = [run[phase] for run in runs]
        medians[phase] = statistics.median(values)
        print(f"{phase:<12} " + " ".join(f"{v:6.1f}" for v in values)
              + f"   {medians[phase]:6.1f}")
    print("\none dashboard request, median ms per run (40 alternated requests each):")
    for key in ("pod address ms", "port-forward ms"):
        medians[key] = statistics.median(run[key] for run in runs)
        print(f"  {key:<16} " + " ".join(f"{run[key]:6.1f}" for run in runs)
              + f"   {medians[key]:6.1f}")
    ratio = medians["port-forward ms"] / medians["pod address ms"]
    print(f"  port-forward / pod address: {ratio:.1f}x")
    medians["port-forward ratio"] = ratio
    write_results("kuberay_timeline", {"runs": runs, "median_s": medians})


if __name__ == "__main__":
    main()
