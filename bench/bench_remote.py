"""remote-run dispatch overhead: a no-op RayTask as a Ray job vs a bare ``submit_job``.

One real Ray cluster (a ``ray start`` head on loopback, made with the local provisioner and
then left alone by this process), reached through its Jobs API in both arms:

OUR arm: ``Context("remote-run", options={"ray_address": URL}).run(one_noop)``: a workflow
that calls one ``@uniflow.task(config=RayTask(head_cpu=1))`` whose body returns 0. Everything
a user's remote run does is in it: version and capacity checks, packing the project, storing
the call and its input, the job (entrypoint: uniflow's job runner, which loads the task,
connects to the cluster, runs and stores the result), log streaming, reading the result.
RAW arm: ``JobSubmissionClient(URL).submit_job(entrypoint="python bench/bench_remote.py
--raw-job", runtime_env={"working_dir": <the same project files, zipped once>})``: a job that
connects to the cluster, calls the same function and disconnects; then its status is polled
at the same cadence until it ends and its logs are fetched once.

Reported: the median over alternated pairs of ours / raw wall time, against the target of at
most 1.3x, and the medians of each arm.

    .venv/bin/python bench/bench_remote.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private loopback cluster
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NOISE_NOTE, alternate, median, print_table, temp_storage, write_results  # noqa: E402

import michelangelo.uniflow.core as uniflow  # noqa: E402
from michelangelo.uniflow.core import Reporter  # noqa: E402
from michelangelo.uniflow.plugins.ray import RayTask  # noqa: E402

TARGET_RATIO = 1.3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@uniflow.task(config=RayTask(head_cpu=1))
def noop() -> int:
    return 0


@uniflow.workflow()
def one_noop() -> int:
    return noop()


def _raw_job() -> None:
    """What the raw arm's job runs: connect, call the same function, disconnect."""
    import ray

    ray.init(logging_level="WARNING")
    assert noop.fn() == 0
    ray.shutdown()


def _wait(client, job_id: str) -> str:
    poll = 0.05  # the cadence remote-run uses
    while True:
        status = str(client.get_job_info(job_id).status.value)
        if status in _TERMINAL:
            client.get_job_logs(job_id)
            return status
        time.sleep(poll)
        poll = min(poll * 1.5, 0.5)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--raw-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw_job:
        _raw_job()
        return {}

    import ray
    from ray.job_submission import JobSubmissionClient

    from michelangelo.uniflow.plugins.ray import LocalRayCluster
    from michelangelo.uniflow.plugins.ray._remote._working_dir import pack_project, project_root

    # Jobs run `python`: this virtualenv's, as the Python of a Ray image would be.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    from michelangelo.uniflow.core.errors import ClusterError

    logs = tempfile.mkdtemp(prefix="ufbench-remote-logs-")
    for attempt in range(3):  # `ray start` gives up after 30 s on a loaded machine: retry
        cluster = LocalRayCluster(RayTask(head_cpu=2, head_memory="2Gi"), logs)
        try:
            cluster.start()
            break
        except ClusterError:
            if attempt == 2:
                raise
    ray.shutdown()  # both arms talk to the cluster over HTTP only
    url = cluster.dashboard_url
    # The raw arm ships the same files as ours, zipped once up front (a plain directory would
    # also pick up files that only .git/info/exclude keeps out, and be re-hashed every time).
    project = pack_project(project_root(__file__), logs)
    client = JobSubmissionClient(url)
    try:
        with temp_storage("remote"):
            context = uniflow.Context("remote-run", reporter=Reporter(),
                                      options={"ray_address": url})

            def ours() -> float:
                start = time.perf_counter()
                assert context.run(one_noop) == 0
                return time.perf_counter() - start

            def raw() -> float:
                start = time.perf_counter()
                job = client.submit_job(
                    entrypoint="python bench/bench_remote.py --raw-job",
                    runtime_env={"working_dir": project.zip_path},
                )
                assert _wait(client, job) == "SUCCEEDED", client.get_job_logs(job)
                return time.perf_counter() - start

            ours()  # warm-up: first upload of the project, worker pool, imports
            raw()
            runs = alternate({"uniflow": ours, "raw": raw}, args.reps)
    finally:
        cluster.shutdown()

    ratios = [o / r for o, r in zip(runs["uniflow"], runs["raw"], strict=True)]
    rows = [[i + 1, o, r, q] for i, (o, r, q) in
            enumerate(zip(runs["uniflow"], runs["raw"], ratios, strict=True))]
    print_table("remote dispatch: one no-op RayTask as a Ray job vs bare submit_job "
                "(alternated)", ["rep", "uniflow s", "raw s", "ours / raw"], rows)
    ratio = median(ratios)
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    print(f"\nmedian ours / raw: {ratio:.3f}x  (target <= {TARGET_RATIO}x: {verdict}); "
          f"medians {median(runs['uniflow']):.2f} s vs {median(runs['raw']):.2f} s")
    print(NOISE_NOTE)
    results = {
        "repetitions": args.reps,
        "uniflow_s": runs["uniflow"],
        "raw_s": runs["raw"],
        "ratios": ratios,
        "median_ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "note": NOISE_NOTE,
    }
    write_results("remote", results)
    return results


if __name__ == "__main__":
    main()
