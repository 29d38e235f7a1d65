#!/usr/bin/env bash
# `make test`: the set-up, then every test run, each step's start stamped in the log.
#
# The runs, each a pytest process of its own:
# - the main run: everything but the KubeRay bed;
# - the KubeRay bed run: its session keeps a control plane, the operator and the kubelet double
#   running, which no other test should share;
# - the tests marked lightning_packages again, with the `lightning` package on the path beside
#   the venv's pytorch_lightning (both installed): modules of either package train;
# - the only-lightning tests, in a venv that has the `lightning` package alone;
# - the sandbox run (tests/sandbox/e2e): the kind sandbox for real, on a Docker engine that
#   tools/docker_engine.sh starts when none answers (and stops afterwards).
#
# Two lanes share the cores. The first: the set-up, then the main run. The second: the bed's
# binaries build from the start (a cold build takes minutes on 2 cores; a warm one returns at
# once), and once both that build and the set-up are done, the bed run, the lightning_packages
# run and the only-lightning run follow each other. The main run waits on Ray, Serve and
# subprocesses for about a third of its time and the bed run on the control plane, so the two
# lanes together take far less than one after the other. The second lane's output is kept in
# build/lane2.log and printed once the main run is done. A third lane, once the set-up is done,
# starts the Docker engine and builds the sandbox's images (`sandbox create --build-images
# --images-only`: Debian's packages, the Go module proxy, PyPI; cached, so a warm one returns
# in seconds) at low priority (nice 19 for the Go builds and for an engine whose containers run the image
# builds), so the other runs keep the cores they need; its log is build/lane3.log. The sandbox
# run comes last, alone, when all three lanes are done: it starts a kind cluster with a Ray
# cluster or two on it, which needs the cores. SANDBOX_E2E=0 leaves it out (for a machine with
# no Docker engine and no root to start one); make test does not skip it on its own. Every
# run goes on when another fails
# (so one failure does not hide the rest), and the script fails if any did. Each run's
# per-test times land in build/junit-*.xml.
#
# Called by the Makefile with BIN, LIGHTNING_SIDE, ONLY_LIGHTNING and MAKE set.
set -u
mkdir -p build
rm -f build/.setup-done
stamp() { echo "[make test $(date +%H:%M:%S)] $*"; }
tests() { "$@" -m "${MARKS:-not gpu}" -q -p no:cacheprovider; }

lane2() {
    local status=0
    if ! bash tools/build_kuberay_bed.sh >build/k8s-build.log 2>&1; then
        echo "the bed build failed (build/k8s-build.log):"; tail -n 30 build/k8s-build.log
        status=1
    fi
    grep '\[bed-build\]' build/k8s-build.log
    while [ ! -e build/.setup-done ]; do sleep 2; done
    if [ "$status" = 0 ]; then
        stamp "KubeRay bed run"
        tests "$BIN/python" -m pytest --durations=15 --junitxml=build/junit-bed.xml \
            tests/uniflow/plugins/ray/kuberay/bed || status=$?
    fi
    stamp "lightning_packages run (both packages installed)"
    PYTHONPATH="$PWD/$LIGHTNING_SIDE" MARKS="lightning_packages and not gpu" \
        tests "$BIN/python" -m pytest --junitxml=build/junit-both.xml tests/lib/trainer \
        || status=$?
    stamp "only-lightning run (the lightning package alone)"
    tests "$ONLY_LIGHTNING/bin/python" -m pytest --junitxml=build/junit-only-lightning.xml \
        tests/lib/trainer/torch/only_lightning || status=$?
    stamp "second lane done (status $status)"
    return "$status"
}

lane3() {
    while [ ! -e build/.setup-done ]; do sleep 2; done
    stamp "the Docker engine, then the sandbox's images"
    DOCKER_ENGINE_NICE=19 bash tools/docker_engine.sh start || return 1
    nice -n 19 "$BIN/michelangelo" sandbox create --build-images --images-only || return 1
    stamp "sandbox images done"
}

SANDBOX_E2E=${SANDBOX_E2E:-1}
stamp "second lane starts: the bed build, then the bed and Lightning-package runs (build/lane2.log)"
lane2 >build/lane2.log 2>&1 &
lane=$!
lane3_pid=
if [ "$SANDBOX_E2E" != 0 ]; then
    stamp "third lane starts: the sandbox's images (build/lane3.log)"
    lane3 >build/lane3.log 2>&1 &
    lane3_pid=$!
else
    stamp "SANDBOX_E2E=0: no sandbox run"
fi
stop_lane() {
    for pid in $lane $lane3_pid; do
        pkill -TERM -P "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    done
    [ -z "$lane3_pid" ] || bash tools/docker_engine.sh stop
}
trap 'stop_lane; exit 130' INT TERM

stamp "set-up"
if ! "$MAKE" --no-print-directory setup "$LIGHTNING_SIDE/.installed" "$ONLY_LIGHTNING/.installed"; then
    stop_lane; exit 1
fi
touch build/.setup-done

status=0
stamp "main test run"
tests "$BIN/python" -m pytest --durations=15 --junitxml=build/junit-main.xml \
    --ignore=tests/uniflow/plugins/ray/kuberay/bed --ignore=tests/sandbox/e2e || status=$?

stamp "main test run done (status $status); waiting for the second lane"
wait "$lane" || status=$(( status ? status : 1 ))
cat build/lane2.log
if [ -n "$lane3_pid" ]; then
    stamp "waiting for the third lane (the sandbox's images)"
    images=0
    wait "$lane3_pid" || images=$?
    cat build/lane3.log
    if [ "$images" = 0 ]; then
        stamp "sandbox run (tests/sandbox/e2e)"
        MARKS="sandbox" tests "$BIN/python" -m pytest -s --durations=10 \
            --junitxml=build/junit-sandbox.xml tests/sandbox/e2e || status=$?
    else
        echo "the sandbox's images could not be built (build/lane3.log): no sandbox run"
        status=1
    fi
    bash tools/docker_engine.sh stop
fi
trap - INT TERM
rm -f build/.setup-done
stamp "done (status $status)"
exit "$status"
