"""examples/embeddings end to end at tiny size, run the way a user runs it (a subprocess).

The contrastive loss of the registered encoder is below the untrained one's, the endpoint
answers with unit vectors over HTTP, and they are the vectors the registered model gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from michelangelo.lib.model_registry import ModelRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "embeddings", "workflow.py")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    storage = tmp_path_factory.mktemp("embeddings") / "uniflow"
    env = dict(os.environ, UF_STORAGE_URL=str(storage))
    proc = subprocess.run([sys.executable, SCRIPT, "--size", "tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=480)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), ModelRegistry(str(storage / "model_registry"))


def test_contrastive_loss_falls(tiny_run):
    report, _ = tiny_run
    trained = report["train"]
    assert trained["train_loss_after"] < trained["train_loss_before"] - 0.3, trained
    assert trained["global_batch_size"] == 16


def test_endpoint_returns_normalised_vectors_of_the_registered_model(tiny_run):
    report, registry = tiny_run
    import torch

    endpoint = report["endpoint"]
    assert endpoint["url"].startswith("http://127.0.0.1:")
    assert np.allclose(endpoint["norms"], 1.0, atol=1e-4)
    spec = report["train"]["spec"]
    model = registry.load_model(spec)
    module = sys.modules[type(model).__module__]
    tokenizer_json = registry.get(spec).factory["kwargs"]["tokenizer_json"]
    texts = [module.QUERY, *module.CANDIDATES]
    with torch.no_grad():
        vectors = model(torch.tensor(module.encode(tokenizer_json, texts))).numpy()
    assert vectors.shape[1] == endpoint["dim"]
    scores = vectors[1:] @ vectors[0]
    local = [(module.CANDIDATES[i], float(scores[i])) for i in np.argsort(-scores)]
    assert [t for t, _ in local] == [t for t, _ in endpoint["ranking"]]
    assert np.allclose([s for _, s in local], [s for _, s in endpoint["ranking"]], atol=1e-4)
