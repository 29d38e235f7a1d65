#!/usr/bin/env bash
# GPU checks, for a session lent a GPU machine (one GPU is enough). Under 8 minutes in all:
#   1. the GPU-only tests: pytest -m gpu (FSDP1, DeepSpeed, bf16; marked @pytest.mark.gpu), from
#      the test files that hold such marks (GPU_CHECK_TESTS: other paths),
#   2. bench/bench_trainer.py --gpu (use_gpu=True, bf16-mixed, 1 worker per visible GPU, at most 2).
#   3. when CUDA is present: examples/gpt_lora and examples/embeddings end to end at --size gpu
#      (train -> register -> deploy on one GPU worker); GPU_CHECK_EXAMPLES=0 skips them, and
#      GPU_CHECK_EXAMPLES_S (default 420) bounds both together, on top of the budget above.
# Reuses .venv when it exists (else `make setup`); on an offline CUDA image, install the wheels of
# tools/offline_gpu_wheels.sh and set PYTHON=python3. Prints a short summary; exit status 0 only
# when the tests passed (or none were collected) and the benchmark finished. On a machine
# without a GPU the gpu tests skip and the benchmark refuses to start.
#
#   bash bench/gpu_check.sh            # PYTHON=... to use another interpreter
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET_S=${GPU_CHECK_BUDGET_S:-470}   # whole script, setup included
TESTS_MAX_S=${GPU_CHECK_TESTS_S:-240}
start=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }

PY="${PYTHON:-.venv/bin/python}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "=== no $PY: make setup ==="
    timeout 300 make setup || { echo "SUMMARY: setup failed, nothing run"; exit 1; }
fi

echo "=== devices ==="
nvidia-smi -L 2>/dev/null || echo "nvidia-smi not found"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"

echo "=== pytest -m gpu tests/ ==="
t=$(left); t=$(( t - 200 < TESTS_MAX_S ? t - 200 : TESTS_MAX_S ))   # keep ~200 s for the bench
if [ "$t" -lt 30 ]; then t=30; fi
tests_start=$(date +%s)
tests_log=$(mktemp)
# Only the files that hold GPU tests are collected (GPU_CHECK_TESTS overrides): collecting all
# of tests/ would import what the other tests need (the sandbox's Kubernetes client, MLflow,
# Triton's client), which a GPU machine set up for training alone may not have.
gpu_tests=${GPU_CHECK_TESTS:-$(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests/ | sort)}
# shellcheck disable=SC2086
timeout -k 10 "$t" "$PY" -m pytest -m gpu -q -p no:cacheprovider $gpu_tests >"$tests_log" 2>&1
tests_rc=$?
tail -n 25 "$tests_log"
tests_line=$(grep -E "passed|failed|skipped|error|no tests ran" "$tests_log" | tail -n 1)
rm -f "$tests_log"
tests_s=$(( $(date +%s) - tests_start ))

echo "=== bench/bench_trainer.py --gpu ==="
b=$(( $(left) - 10 ))
bench_rc=124
bench_s=0
if [ "$b" -ge 60 ]; then
    bench_start=$(date +%s)
    timeout -k 10 "$b" "$PY" bench/bench_trainer.py --gpu --rows 20000 --epochs 2 --pairs 2 \
        2>&1 | tail -n 30
    bench_rc=${PIPESTATUS[0]}
    bench_s=$(( $(date +%s) - bench_start ))
else
    echo "skipped: only ${b}s left"
fi

echo "=== examples at --size gpu ==="
examples_rc=0
examples_line="skipped (GPU_CHECK_EXAMPLES=0)"
if [ "${GPU_CHECK_EXAMPLES:-1}" != "0" ]; then
    if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        examples_line=""
        examples_end=$(( $(date +%s) + ${GPU_CHECK_EXAMPLES_S:-420} ))
        for example in gpt_lora embeddings; do
            e=$(( examples_end - $(date +%s) ))
            if [ "$e" -lt 60 ]; then
                examples_rc=124; examples_line+="${example}: no time left; "; continue
            fi
            example_start=$(date +%s)
            timeout -k 10 "$e" "$PY" "examples/${example}/workflow.py" --size gpu 2>&1 \
                | grep -v '^RESULT ' | tail -n 12
            rc=${PIPESTATUS[0]}
            [ "$rc" -eq 0 ] || examples_rc=$rc
            examples_line+="${example}: exit ${rc} ($(( $(date +%s) - example_start )) s); "
        done
    else
        examples_line="skipped: no CUDA device"
    fi
fi

echo
echo "=== SUMMARY ($(( $(date +%s) - start )) s) ==="
case "$tests_rc" in
    0) echo "gpu tests: ok: ${tests_line} (${tests_s} s)" ;;
    5) echo "gpu tests: none collected (${tests_s} s)" ;;
    124|137) echo "gpu tests: TIMED OUT after ${t} s" ;;
    *) echo "gpu tests: FAILED (pytest exit ${tests_rc}): ${tests_line} (${tests_s} s)" ;;
esac
if [ "$bench_rc" -eq 0 ] && [ -f bench/results/trainer_gpu.json ]; then
    "$PY" - <<'EOF'
import json

r = json.load(open("bench/results/trainer_gpu.json"))
t = r["targets"]
parts = []
for label, target, sense in (("steady rows/s ours/raw", t["throughput_ours_raw_min"], ">="),
                             ("whole train() ours/raw", t["wall_ours_raw_max"], "<=")):
    q = r["ratios"].get(label)
    if q is None:
        parts.append(f"{label}: not measured")
        continue
    parts.append(f"{label} {q['median']:.3f} "
                 f"({'met' if q.get('target_met') else 'MISSED'} {sense} {target})")
print(f"gpu bench: {r['workers']} GPU worker(s), bf16-mixed; " + "; ".join(parts)
      + "; bench/results/trainer_gpu.json")
EOF
else
    echo "gpu bench: did not finish (exit ${bench_rc}, ${bench_s} s)"
fi
echo "examples --size gpu: ${examples_line}"
[ "$tests_rc" -eq 0 ] || [ "$tests_rc" -eq 5 ] || exit 1
[ "$bench_rc" -eq 0 ] || exit 1
[ "$examples_rc" -eq 0 ] || exit 1
exit 0
