"""Serving: our endpoint vs a hand-written Ray Serve deployment of the same model.

Both run in ONE local Ray cluster with one Serve instance on 127.0.0.1, one replica each,
0.5 CPU each, ``torch.set_num_threads(1)`` in both:

- OURS: ``michelangelo.lib.serving.deploy(spec)`` of a registered revision (registry load,
  sha256 and example check at start; per request: JSON, signature checks, dynamic batching
  that counts rows, OIP-style answer with the model identity).
- RAW: the Ray Serve recipe written by hand: a ``@serve.deployment`` class that builds the
  same module and loads the same weights in ``__init__``, and an ``async __call__`` that parses
  ``{"inputs": rows}``, runs the rows through ``@serve.batch`` with the same batch settings
  (max 32, 5 ms wait), and returns ``{"predictions": ...}``.
- OURS with batching off (``max_batch_size=None``), for the batching gain.

Load: an aiohttp client on 127.0.0.1 with C concurrent workers (C = 1 and 16), each in a
bounded loop of requests over keep-alive connections; each request holds ROWS rows of the
quickstart-sized MLP (8 features). Arms alternate per round (ours, raw, ours, raw, ...).
Reported per C: median throughput (requests/s and rows/s), p50 and p99 latency, the ratios
ours/raw (targets: throughput >= 0.9, p99 <= 1.2x), and rows/s with batching on vs off at 16.

    .venv/bin/python bench/bench_serving.py [--reps 3] [--requests 200] [--rows 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

FEATURES = 8


def create_model(hidden_dim: int = 32) -> nn.Module:
    """The quickstart regressor's shape: 8 -> hidden -> 1."""
    return nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))


def _raw_app(weights_path: str):
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(name="RawModel", max_ongoing_requests=256)
    class RawModel:
        def __init__(self, path: str) -> None:
            torch.set_num_threads(1)
            self.model = create_model()
            self.model.load_state_dict(torch.load(path, weights_only=True))
            self.model.eval()

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005,
                     batch_size_fn=lambda items: sum(len(i) for i in items))
        async def run(self, batches: list[list]) -> list[list]:
            counts = [len(b) for b in batches]
            x = torch.tensor([row for b in batches for row in b], dtype=torch.float32)
            with torch.inference_mode():
                y = self.model(x).tolist()
            out, start = [], 0
            for n in counts:
                out.append(y[start:start + n])
                start += n
            return out

        async def __call__(self, request: Request) -> dict:
            rows = (await request.json())["inputs"]
            return {"predictions": await self.run(rows)}

    return RawModel.options(ray_actor_options={"num_cpus": 0.5}).bind(weights_path)


async def _load(url: str, clients: int, requests: int, body: bytes) -> dict:
    import aiohttp

    latencies: list[float] = []
    failures = 0

    async def worker(session, count):
        nonlocal failures
        for _ in range(count):
            start = time.perf_counter()
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                if resp.status != 200:
                    failures += 1
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await worker(session, 3)  # warm the connection and the replica
        latencies.clear()
        per = max(1, requests // clients)
        start = time.perf_counter()
        await asyncio.gather(*(worker(session, per) for _ in range(clients)))
        wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"requests_per_s": len(ordered) / wall, "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "failures": failures, "requests": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="requests per arm and round")
    parser.add_argument("--rows", type=int, default=4, help="rows per request")
    args = parser.parse_args()

    from ray import serve

    from michelangelo.lib.model_registry import ModelRegistry
    from michelangelo.lib.serving import deploy
    from michelangelo.lib.serving._client import post_json
    from michelangelo.uniflow.plugins.ray import LocalRayCluster, RayTask
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    work = tempfile.mkdtemp(prefix="ma-bench-serving-")
    registry = ModelRegistry(os.path.join(work, "registry"))
    torch.manual_seed(0)
    model = create_model()
    spec = registry.register("bench", "mlp", model=model, create_model_fn=create_model,
                             input_example=torch.randn(2, FEATURES))
    weights = os.path.join(work, "weights.pt")
    torch.save(registry.load_state_dict(spec), weights)  # the raw arm loads the same weights

    cluster = LocalRayCluster(RayTask(head_cpu=4, head_memory="4Gi"), os.path.join(work, "logs"))
    cluster.start()
    port = free_port()
    try:
        ours = deploy(spec, name="ours", registry=registry, port=port)
        unbatched = deploy(spec, name="ours-nobatch", registry=registry, port=port,
                           max_batch_size=None)
        serve.run(_raw_app(weights), name="raw", route_prefix="/raw")
        urls = {"ours": ours.url, "raw": f"http://127.0.0.1:{port}/raw",
                "ours_nobatch": unbatched.url}
        rows = torch.randn(args.rows, FEATURES).tolist()
        body = json.dumps({"inputs": rows}).encode()
        answers = [post_json(urls[a], {"inputs": rows})["predictions"] for a in urls]
        if not all(torch.allclose(torch.tensor(a), torch.tensor(answers[1]), atol=1e-5)
                   for a in answers):
            raise SystemExit(f"the arms disagree on the same rows: {answers}")
        results: dict[str, dict[int, list[dict]]] = {a: {1: [], 16: []} for a in urls}
        for rep in range(args.reps):
            for clients in (1, 16):
                for arm in ("ours", "raw", "ours_nobatch"):
                    if arm == "ours_nobatch" and clients == 1:
                        continue
                    got = asyncio.run(_load(urls[arm], clients, args.requests, body))
                    results[arm][clients].append(got)
                    print(f"round {rep} clients {clients:2d} {arm:12s} "
                          f"{got['requests_per_s']:7.1f} req/s  p50 {got['p50_ms']:6.1f} ms  "
                          f"p99 {got['p99_ms']:6.1f} ms  failures {got['failures']}", flush=True)
    finally:
        cluster.shutdown()

    def med(arm, clients, key):
        return median([r[key] for r in results[arm][clients]])

    table, summary = [], {}
    for clients in (1, 16):
        ratio = med("ours", clients, "requests_per_s") / med("raw", clients, "requests_per_s")
        p99 = med("ours", clients, "p99_ms") / med("raw", clients, "p99_ms")
        summary[f"c{clients}"] = {"throughput_ratio": ratio, "p99_ratio": p99}
        table.append([clients, med("ours", clients, "requests_per_s"),
                      med("raw", clients, "requests_per_s"), ratio,
                      med("ours", clients, "p50_ms"), med("raw", clients, "p50_ms"),
                      med("ours", clients, "p99_ms"), med("raw", clients, "p99_ms"), p99])
    print_table("ours vs hand-written Ray Serve (medians over rounds)",
                ["clients", "ours req/s", "raw req/s", "ratio", "ours p50", "raw p50",
                 "ours p99", "raw p99", "p99 ratio"], table)
    on = med("ours", 16, "requests_per_s") * args.rows
    off = med("ours_nobatch", 16, "requests_per_s") * args.rows
    summary["batching_gain_c16"] = on / off
    print(f"\nbatching on vs off, 16 clients: {on:.0f} vs {off:.0f} rows/s -> {on / off:.2f}x")
    met = all(summary[f"c{c}"]["throughput_ratio"] >= 0.9 and summary[f"c{c}"]["p99_ratio"] <= 1.2
              for c in (1, 16))
    print(f"targets (throughput >= 0.9, p99 <= 1.2x): {'met' if met else 'NOT met'}")
    print(NOISE_NOTE)
    write_results("serving", {"args": vars(args), "summary": summary, "runs": results})


if __name__ == "__main__":
    main()
