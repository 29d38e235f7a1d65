#!/usr/bin/env bash
# The KubeRay test bed's binaries (control plane, etcd, operator), built from the Go module
# proxy by the builder the sandbox uses too: michelangelo/sandbox/_build/go_proxy_build.sh.
#   bash tools/build_kuberay_bed.sh [all|k8s|kuberay]
exec bash "$(dirname "$0")/../michelangelo/sandbox/_build/go_proxy_build.sh" "${1:-all}"
