#!/usr/bin/env bash
# A Docker engine for the sandbox's end-to-end run, on machines where none runs yet.
#
#   bash tools/docker_engine.sh start   # returns once `docker info` answers
#   bash tools/docker_engine.sh stop    # stops the engine `start` started, nothing else
#
# start installs Debian's debootstrap when missing (the image builds need it), and does
# nothing more when an engine already answers. Otherwise, where it runs as root: it
# installs Debian's docker.io when dockerd is missing (and apt-get is there), creates
# /lib/modules when missing (kind mounts it into its node), and starts dockerd with the
# overlay2 storage driver. Where this machine's capability bounding set lacks a capability
# (virtual machines often lack CAP_SYS_RESOURCE, which runc asks for in privileged containers),
# dockerd's default runtime becomes runc-capfilter, built from this project's source with Go,
# which drops what the machine cannot grant before calling runc. The engine's pid and log live
# in $DOCKER_ENGINE_STATE (default build/docker-engine); stop acts only on that pid.
# DOCKER_ENGINE_NICE (default 0) starts the engine at that niceness, which its containers
# (image builds included) inherit: make test builds the sandbox's images beside its other
# runs at low priority.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${DOCKER_ENGINE_STATE:-build/docker-engine}
WHAT=${1:-start}
log() { echo "[docker-engine $(date +%H:%M:%S)] $*" >&2; }

engine_answers() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

# debootstrap makes the base image of `sandbox create --build-images`; a fresh machine has
# neither it nor an engine. Installed, as root with apt-get, only when missing.
os_packages() {
    local wanted=()
    if ! engine_answers && ! command -v dockerd >/dev/null 2>&1; then wanted+=(docker.io); fi
    if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then wanted+=(debootstrap); fi
    [ ${#wanted[@]} -gt 0 ] || return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "missing ${wanted[*]}, and apt-get cannot run as root here: install them with your package manager"; return 0
    fi
    log "installing Debian's ${wanted[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
}

start() {
    os_packages
    if engine_answers; then log "an engine already answers: $(docker info --format '{{.ServerVersion}}'); kept"; return 0; fi
    if [ "$(id -u)" != 0 ]; then
        echo "error: no Docker engine answers and this is not root: start Docker (e.g. 'sudo systemctl start docker')" >&2; return 2
    fi
    if ! command -v dockerd >/dev/null 2>&1; then
        echo "error: no dockerd, and Debian's docker.io could not be installed (no apt-get?)" >&2; return 2
    fi
    mkdir -p /lib/modules "$STATE"
    local runtime_args=() missing
    missing=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
    local last; last=$(cat /proc/sys/kernel/cap_last_cap)
    # Every capability up to cap_last_cap held is (1 << (last+1)) - 1.
    if [ "$(( 16#$missing ))" != "$(( (1 << (last + 1)) - 1 ))" ]; then
        local bin
        bin=$(bash michelangelo/sandbox/_build/go_proxy_build.sh local michelangelo/sandbox/_build/files/go/runc-capfilter runc-capfilter)
        log "the bounding set is $missing (not every capability up to $last): runc runs through $bin/runc-capfilter"
        runtime_args=(--add-runtime "capfilter=$(readlink -f "$bin/runc-capfilter")" --default-runtime capfilter)
    fi
    log "starting dockerd (log: $STATE/dockerd.log)"
    nohup nice -n "${DOCKER_ENGINE_NICE:-0}" dockerd --storage-driver overlay2 --pidfile "$STATE/dockerd.pid" "${runtime_args[@]}" \
        >"$STATE/dockerd.log" 2>&1 &
    echo $! > "$STATE/started.pid"
    local waited=0
    until engine_answers; do
        sleep 1; waited=$((waited + 1))
        if [ $waited -ge 60 ] || ! kill -0 "$(cat "$STATE/started.pid")" 2>/dev/null; then
            echo "error: dockerd did not answer within ${waited} s; its log:" >&2; tail -20 "$STATE/dockerd.log" >&2; return 1
        fi
    done
    log "engine $(docker info --format '{{.ServerVersion}} ({{.Driver}}, cgroup {{.CgroupDriver}}/v{{.CgroupVersion}}, runtime {{.DefaultRuntime}})') up after ${waited} s"
}

stop() {
    [ -f "$STATE/started.pid" ] || { log "no engine started by start; nothing to stop"; return 0; }
    local pid; pid=$(cat "$STATE/started.pid")
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping dockerd ($pid)"
        kill -TERM "$pid"
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$STATE/started.pid"
}

case $WHAT in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
