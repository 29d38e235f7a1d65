"""Serving: text generation tokens/s of a text endpoint vs a hand-written Ray Serve deployment.

One local Ray cluster, one Serve instance, two applications side by side serving the same
registered character-level causal language model (2 attention blocks, width 64, context 64):

- OURS: ``deploy(spec)`` of a revision registered with its tokenizer (``CharacterTokenizer``)
  and a text-generation spec; clients ``POST /v2/models/gen/generate`` at the server's root
  (``{"text_input", "parameters": {"max_tokens"}}``). Dynamic batching on (the defaults):
  concurrent prompts of different lengths share each decoding step.
- RAW: the recipe written by hand: a ``@serve.deployment`` class that builds the same module,
  loads the same weights, and for each request tokenizes, runs the greedy loop alone (in a
  thread, so requests overlap) and decodes.

Both replicas reserve 1 CPU. Both arms decode greedily and must give the same text for the
same prompt (checked). Load: C concurrent clients (C = 1 and 8), each sending REQUESTS
requests (prompts of 5 to 40 characters, MAX_TOKENS new tokens each); arms alternate per
round. Reported: median generated tokens/s per arm and C, the ratio ours/raw (target at least
0.9), and the median time to the first streamed token of ``generate_stream`` (read as
server-sent events), beside a whole ``generate`` of the same prompt.

    .venv/bin/python bench/bench_serving_generate.py [--reps 3] [--requests 8] [--max-tokens 32]
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _common import NOISE_NOTE, median, print_table, write_results  # noqa: E402
from torch import nn  # noqa: E402

VOCAB = " abcdefghijklmnopqrstuvwxyz.,!?'TW:"
CONTEXT = 64
PROMPTS = ["The keeper wrote: ", "fog", "the light was lit at dusk and the ",
           "Wind from the west, ", "a ship passed at noon, its lamps dim and late, "[:40]]


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        h = h + nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return h + self.mlp(self.norm2(h))


class CharLM(nn.Module):
    """Token ids ``[batch, length]`` in, ``{"logits": [batch, length, vocab]}`` out."""

    def __init__(self, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), width)
        self.position = nn.Embedding(CONTEXT, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, len(VOCAB))

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(input_ids) + self.position(torch.arange(input_ids.shape[1]))
        return {"logits": self.head(self.blocks(h)) * 3.0}


def create_model() -> nn.Module:
    return CharLM()


def _raw_app(weights_path: str):
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(name="RawGenerate", max_ongoing_requests=256,
                      ray_actor_options={"num_cpus": 1})
    class RawGenerate:
        def __init__(self, path: str) -> None:
            torch.set_num_threads(1)
            self.model = create_model()
            self.model.load_state_dict(torch.load(path, weights_only=True))
            self.model.eval()
            self.index = {c: i for i, c in enumerate(VOCAB)}

        def _generate(self, text: str, max_tokens: int) -> str:
            ids = [self.index.get(c, 0) for c in text]
            start = len(ids)
            with torch.inference_mode():
                for _ in range(max_tokens):
                    logits = self.model(torch.tensor([ids[-CONTEXT:]]))["logits"]
                    ids.append(int(logits[0, -1].argmax()))
            return "".join(VOCAB[i] for i in ids[start:])

        async def __call__(self, request: Request) -> dict:
            import asyncio

            body = await request.json()
            text = await asyncio.to_thread(self._generate, body["text_input"],
                                           body["parameters"]["max_tokens"])
            return {"text_output": text}

    return RawGenerate.bind(weights_path)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


MISMATCHES: list[str] = []


def _load(url: str, clients: int, requests: int, max_tokens: int, expected: dict) -> float:
    """Generated tokens per second with ``clients`` concurrent clients (answers compared with
    each prompt's answer alone; a difference is counted and reported, not fatal: float sums
    over a different batch shape may break a near-tie between two tokens)."""
    errors = MISMATCHES

    def client(index: int) -> None:
        for n in range(requests):
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            out = _post(url, {"text_input": prompt, "parameters": {"max_tokens": max_tokens}})
            if out["text_output"] != expected[prompt]:
                errors.append(f"{prompt!r}: {out['text_output']!r} != {expected[prompt]!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return clients * requests * max_tokens / elapsed


def _first_token_s(url: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    """Seconds to the first streamed event, and to the end of the stream."""
    request = urllib.request.Request(
        url, data=json.dumps({"text_input": prompt, "parameters": {"max_tokens": max_tokens}}
                             ).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: ") and first is None:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8, help="requests per client and round")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from ray import serve

    from michelangelo.lib.model_registry import CharacterTokenizer, ModelRegistry
    from michelangelo.lib.serving import deploy
    from michelangelo.uniflow.plugins.ray import LocalRayCluster, RayTask
    from michelangelo.uniflow.plugins.ray.provisioning import free_port

    work = tempfile.mkdtemp(prefix="ma-bench-generate-")
    torch.manual_seed(0)
    model = create_model()
    tokenizer = CharacterTokenizer(VOCAB)
    registry = ModelRegistry(os.path.join(work, "registry"))
    spec = registry.register(
        "bench", "gen", model=model, create_model_fn=create_model,
        input_example=torch.tensor([tokenizer.encode("The keeper")]), tokenizer=tokenizer,
        processing={"task": "text-generation", "max_tokens": args.max_tokens,
                    "max_context": CONTEXT})
    weights = os.path.join(work, "weights.pt")
    torch.save(model.state_dict(), weights)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH"))
        if p)
    cluster = LocalRayCluster(RayTask(head_cpu=3, head_memory="4Gi"), os.path.join(work, "logs"))
    cluster.start()
    port = free_port()
    results: dict[str, dict[int, list[float]]] = {a: {1: [], 8: []} for a in ("ours", "raw")}
    ttft: list[float] = []
    whole: list[float] = []
    try:
        ours = deploy(spec, name="gen", registry=registry, port=port, replica_cpus=1)
        serve.run(_raw_app(weights), name="raw", route_prefix="/raw")
        base = f"http://127.0.0.1:{port}"
        urls = {"ours": f"{base}/v2/models/gen/generate", "raw": f"{base}/raw"}
        expected = {p: ours.generate(p, max_tokens=args.max_tokens) for p in PROMPTS}
        for p in PROMPTS:
            raw = _post(urls["raw"], {"text_input": p, "parameters": {"max_tokens": args.max_tokens}})
            if raw["text_output"] != expected[p]:
                raise SystemExit(f"the arms disagree on {p!r}: {raw} vs {expected[p]!r}")
        for rep in range(args.reps):
            for clients in (1, 8):
                for arm in ("ours", "raw"):
                    rate = _load(urls[arm], clients, args.requests, args.max_tokens, expected)
                    results[arm][clients].append(rate)
                    print(f"round {rep} C={clients} {arm:4s} {rate:8.1f} tokens/s", flush=True)
            for _ in range(3):
                first, total = _first_token_s(f"{base}/v2/models/gen/generate_stream",
                                              PROMPTS[0], args.max_tokens)
                ttft.append(first)
                whole.append(total)
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    ratios = {}
    for clients in (1, 8):
        ours_rate, raw_rate = (median(results[a][clients]) for a in ("ours", "raw"))
        ratios[clients] = ours_rate / raw_rate
        rows.append([clients, ours_rate, raw_rate, ratios[clients]])
    print_table(f"greedy generation, {args.max_tokens} new tokens per request (medians of "
                f"{args.reps} rounds)", ["clients", "ours tokens/s", "raw tokens/s",
                                         "ours/raw"], rows)
    print(f"\ntime to first streamed token: median {1000 * median(ttft):.0f} ms "
          f"(whole stream of {args.max_tokens} tokens: {1000 * median(whole):.0f} ms)")
    print(f"answers that differ from the prompt's answer alone: {len(MISMATCHES)} "
          f"{MISMATCHES[:2]}")
    print(NOISE_NOTE)
    write_results("serving_generate", {"mismatches": len(MISMATCHES), "args": vars(args), "tokens_per_s": results,
                                       "ratio": ratios, "first_token_s": ttft,
                                       "stream_s": whole})


if __name__ == "__main__":
    main()
