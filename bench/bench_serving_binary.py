"""Serving: the binary tensor extension vs JSON for a 1M-float tensor, through tritonclient.

One local Ray cluster, one endpoint (``deploy`` of a registered revision, one replica,
dynamic batching off) whose model scales its input: 1000 rows of 1000 FP32 features in,
the same 1M floats out. The client is the real ``tritonclient.http`` against ``host:port``
with no base path (the ``/v2`` gateway at the server's root):

- BINARY: its defaults: ``set_data_from_numpy(x)`` sends raw bytes after the JSON header and,
  with no outputs named, asks every output back in binary.
- JSON: ``set_data_from_numpy(x, binary_data=False)`` and
  ``InferRequestedOutput("output", binary_data=False)``: numbers as JSON text both ways.

Arms alternate per round (binary, json, binary, json, ...); each round sends REQUESTS
sequential requests over one connection after one warm-up request. Reported: median
requests/s per arm, MB/s of tensor data (in + out), and the ratio binary / json (target at
least 3x). Every answer is checked against the expected output.

    .venv/bin/python bench/bench_serving_binary.py [--reps 3] [--requests 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

FEATURES = 1000
ROWS = 1000  # ROWS x FEATURES = 1M floats


class Scale(nn.Module):
    """``x * 2``, row by row: as many floats out as in."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def create_model() -> nn.Module:
    return Scale()


def _one_arm(client, triton, x: np.ndarray, binary: bool, requests: int) -> float:
    """Seconds per request (median of ``requests``), each answer checked."""
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = None if binary else [triton.InferRequestedOutput("output", binary_data=False)]
    want = x * 2
    times = []
    for index in range(requests + 1):
        start = time.perf_counter()
        result = client.infer("scale", [tensor], outputs=outputs)
        got = result.as_numpy("output")
        elapsed = time.perf_counter() - start
        if got.shape != want.shape or not np.array_equal(got.astype(np.float32), want):
            raise SystemExit(f"the {'binary' if binary else 'json'} arm got a wrong answer")
        if index:  # the first one warms the connection and the replica
            times.append(elapsed)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5, help="requests per arm and round")
    args = parser.parse_args()

    import tritonclient.http as triton

    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.lib.serving import deploy
    from michelangelo.uniflow.plugins.ray import LocalRayCluster, RayTask
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    work = tempfile.mkdtemp(prefix="ma-bench-binary-")
    registry = ModelRegistry(os.path.join(work, "registry"))
    spec = registry.register("bench", "scale", model=create_model(),
                             create_model_fn=create_model,
                             input_example=torch.randn(2, FEATURES))
    x = np.random.default_rng(0).normal(size=(ROWS, FEATURES)).astype(np.float32)
    # The replica imports this file's model factory by module name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH"))
        if p)
    cluster = LocalRayCluster(RayTask(head_cpu=2, head_memory="4Gi"), os.path.join(work, "logs"))
    cluster.start()
    port = free_port()
    results: dict[str, list[float]] = {"binary": [], "json": []}
    try:
        deploy(spec, name="scale", registry=registry, port=port, max_batch_size=None,
               max_request_bytes=256 * 2**20, replica_cpus=1)
        client = triton.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=600,
                                              network_timeout=600)
        try:
            for rep in range(args.reps):
                for arm in ("binary", "json"):
                    seconds = _one_arm(client, triton, x, arm == "binary", args.requests)
                    results[arm].append(seconds)
                    print(f"round {rep} {arm:6s} {1000 * seconds:8.1f} ms/request "
                          f"({1 / seconds:6.2f} req/s)", flush=True)
        finally:
            client.close()
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    megabytes = 2 * x.nbytes / 1e6  # the tensor in and the same size out
    rows = []
    for arm in ("binary", "json"):
        seconds = median(results[arm])
        rows.append([arm, 1000 * seconds, 1 / seconds, megabytes / seconds])
    ratio = median(results["json"]) / median(results["binary"])
    print_table(f"1M-float FP32 tensor in and out through tritonclient (medians of {args.reps} "
                "rounds)", ["arm", "ms/request", "req/s", "MB/s of tensors"], rows)
    print(f"\nthroughput binary / json: {ratio:.1f}x (target >= 3x: "
          f"{'met' if ratio >= 3 else 'NOT met'})")
    print(NOISE_NOTE)
    write_results("serving_binary", {"args": vars(args), "throughput_ratio": ratio,
                                     "seconds_per_request": results})


if __name__ == "__main__":
    main()
