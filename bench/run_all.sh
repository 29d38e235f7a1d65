#!/usr/bin/env bash
# Run the foundation benchmarks in sequence with the project's virtual environment.
# Results: bench/results/<name>.json (git-ignored). Times are noisy on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
status=0
for name in dispatch dataset cluster_start; do
    echo "=== bench_${name}.py ==="
    "$PY" "bench/bench_${name}.py" || { echo "bench_${name}.py failed" >&2; status=1; }
done
# Trainer benchmarks (about 8-12 minutes more on a loaded 2-core machine): LightningTrainer vs
# a hand-written Ray Train + Lightning loop, and initial_weights_path read once.
for name in trainer initial_weights; do
    echo "=== bench_${name}.py ==="
    "$PY" "bench/bench_${name}.py" || { echo "bench_${name}.py failed" >&2; status=1; }
done
# remote-run: a no-op RayTask as a Ray job vs a bare JobSubmissionClient.submit_job.
echo "=== bench_remote.py ==="
"$PY" bench/bench_remote.py || { echo "bench_remote.py failed" >&2; status=1; }
# concurrent.batch_run of 8 RayTask branches vs the same in turn vs bare ray.remote.
echo "=== bench_concurrent.py ==="
"$PY" bench/bench_concurrent.py || { echo "bench_concurrent.py failed" >&2; status=1; }
# Serving: our endpoint vs a hand-written Ray Serve deployment, and batching on vs off.
echo "=== bench_serving.py ==="
"$PY" bench/bench_serving.py || { echo "bench_serving.py failed" >&2; status=1; }
# Serving: binary tensors vs JSON for a 1M-float tensor through tritonclient.
echo "=== bench_serving_binary.py ==="
"$PY" bench/bench_serving_binary.py || { echo "bench_serving_binary.py failed" >&2; status=1; }
# Serving: a 20% canary under a steady stream; failed requests across rollout verbs.
echo "=== bench_serving_rollout.py ==="
"$PY" bench/bench_serving_rollout.py || { echo "bench_serving_rollout.py failed" >&2; status=1; }
# Serving: generated tokens/s of a text endpoint vs a hand-written deployment; first token.
echo "=== bench_serving_generate.py ==="
"$PY" bench/bench_serving_generate.py || { echo "bench_serving_generate.py failed" >&2; status=1; }
exit "$status"
