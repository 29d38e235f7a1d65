#!/usr/bin/env bash
# Build Go programs the sandbox and the KubeRay test bed need, from the Go module proxy only,
# into ~/.cache/michelangelo (or $MICHELANGELO_CACHE), once per version; a second run builds
# nothing. Each target prints the folder that holds what it built.
#
#   go_proxy_build.sh k8s      kube-apiserver, kube-controller-manager, kube-scheduler
#                              v$K8S_VERSION and the etcd release that version requires
#   go_proxy_build.sh node     kubelet, kubeadm, kubectl and kube-proxy v$K8S_VERSION
#   go_proxy_build.sh kuberay  the KubeRay operator v$KUBERAY_VERSION (see below)
#   go_proxy_build.sh kind     kind v$KIND_VERSION
#   go_proxy_build.sh coredns  CoreDNS v$COREDNS_VERSION (the release kubeadm v$K8S_VERSION deploys)
#   go_proxy_build.sh minio    the MinIO server and client at the pinned commits
#   go_proxy_build.sh local DIR NAME   a small main package of this project (pause, runc-capfilter)
#   go_proxy_build.sh all      k8s and kuberay (the test bed's set)
#
# Nothing third-party is kept in this repository: the script writes two small wrapper modules
# into the cache (one requires k8s.io/kubernetes and pins each of its staging modules to the
# matching v0.x release, since k8s.io/kubernetes is published with replace directives that point
# into its own tree; the other holds a three-line main for etcd's etcdmain package) and builds
# from the proxy.
#
# The operator: proxy.golang.org answers "403 This module version is not available" for
# github.com/ray-project/kuberay/ray-operator@v1.7.0 (its .info and .mod are served, the .zip is
# not; checked again on 2026-12-01). The script takes, in this order: an operator already built
# into the cache; v$KUBERAY_VERSION from the proxy; the tag ray-operator/v$KUBERAY_VERSION from a
# git clone of ray-project/kuberay named by KUBERAY_GIT (none by default); and, when neither source has it,
# v$KUBERAY_FALLBACK (1.6.2, the newest release the proxy serves) from the proxy, saying so on
# stderr. The folder it prints (kuberay-v<version>/bin) names the version it built, and the
# test bed starts that operator with that release's chart defaults. KUBERAY_FALLBACK= (empty)
# turns the fallback off. The modules' dependencies always come from the proxy.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
KUBERAY_VERSION=${KUBERAY_VERSION:-1.7.0}
KUBERAY_FALLBACK=${KUBERAY_FALLBACK-1.6.2}
KIND_VERSION=${KIND_VERSION:-0.33.0}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.2}
# MinIO publishes no semantic versions: these are the commits the proxy names for its newest
# server and client source (pseudo-versions), pinned so that every build is the same.
MINIO_VERSION=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
MC_VERSION=${MC_VERSION:-v0.0.0-20250313080218-cf909e1063a9}
CACHE=${MICHELANGELO_CACHE:-$HOME/.cache/michelangelo}
K8S_HOME=$CACHE/k8s-v$K8S_VERSION
# A clone of ray-project/kuberay (bare or not) to take the tag from; none unless named.
KUBERAY_GIT=${KUBERAY_GIT:-}
WHAT=${1:-all}
log() { echo "[go-build $(date +%H:%M:%S)] $*" >&2; }

command -v go >/dev/null 2>&1 || { echo "error: the Go toolchain (go >= 1.26) is needed; see https://go.dev/dl" >&2; exit 2; }
export GOMODCACHE=${GOMODCACHE_OVERRIDE:-$CACHE/gomod} GOCACHE=${GOCACHE_OVERRIDE:-$CACHE/gocache}
export CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=local GOWORK=off
JOBS=${GO_BUILD_JOBS:-$(nproc)}

# Time one build step, when GNU time is there (the numbers go to the log).
timed() {
    if [ -x /usr/bin/time ]; then /usr/bin/time -f "[go-build] $1: %e s wall, %U s user, %M KiB max" "${@:2}"
    else "${@:2}"; fi
}

# The Kubernetes commands named in $@ (and etcd, when named), at v$K8S_VERSION.
build_k8s() {
    local bin=$K8S_HOME/bin mod=$K8S_HOME/wrapper cmd missing=
    for cmd in "$@"; do [ -x "$bin/$cmd" ] || missing=1; done
    if [ -z "$missing" ]; then echo "$bin"; return 0; fi
    mkdir -p "$bin" "$mod/etcd"
    if [ ! -f "$mod/.resolved" ]; then
        log "resolving k8s.io/kubernetes v$K8S_VERSION and its staging modules"
        go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
        local kmod=$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod
        {
            echo "module michelangelo.local/k8s-bed"
            echo
            echo "go $(awk '/^go /{print $2; exit}' "$kmod")"
            echo
            echo "require k8s.io/kubernetes v$K8S_VERSION"
            echo
            echo "replace ("
            # Every staging module the tree replaces with ./staging/src/..., at its release tag
            # (the sample-* modules are examples and not all of them are published).
            sed -n '/^replace (/,/^)/p' "$kmod" | awk '/=> \.\/staging/{print $1}' \
                | grep -v '/sample-' | sed "s#.*#\t& => & v0.${K8S_VERSION#1.}#"
            echo ")"
        } > "$mod/go.mod"
        # etcd's own main is this call; its module is the server release Kubernetes requires.
        printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' \
            > "$mod/etcd/main.go"
        # etcd at the server release Kubernetes' own go.mod requires (its tested pairing).
        local etcd_v k=k8s.io/kubernetes/cmd
        etcd_v=$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$kmod")
        (cd "$mod" && go get "$k/kube-apiserver@v$K8S_VERSION" "$k/kube-controller-manager@v$K8S_VERSION" \
            "$k/kube-scheduler@v$K8S_VERSION" "go.etcd.io/etcd/server/v3/etcdmain@$etcd_v" >&2)
        printf 'k8s.io/kubernetes/cmd/%s\n' kube-apiserver kube-controller-manager kube-scheduler \
            > "$mod/.resolved"
    fi
    local minor=${K8S_VERSION#1.}; minor=${minor%%.*}
    local v="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
    v="$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    v="$v -X k8s.io/component-base/version.gitTreeState=clean"
    v="$v -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
    for cmd in "$@"; do
        [ "$cmd" = etcd ] && continue
        if [ ! -x "$bin/$cmd" ]; then
            if ! grep -q "k8s.io/kubernetes/cmd/$cmd" "$mod/.resolved"; then
                (cd "$mod" && go get "k8s.io/kubernetes/cmd/$cmd@v$K8S_VERSION" >&2)
                echo "k8s.io/kubernetes/cmd/$cmd" >> "$mod/.resolved"
            fi
            log "building $cmd v$K8S_VERSION (minutes on 2 cores)"
            (cd "$mod" && timed "$cmd" go build -p "$JOBS" -trimpath -ldflags="-s -w $v" \
                -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
            mv "$bin/$cmd.tmp" "$bin/$cmd"
        fi
    done
    if [[ " $* " == *" etcd "* ]] && [ ! -x "$bin/etcd" ]; then
        log "building etcd $(cd "$mod" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
        (cd "$mod" && timed etcd go build -p "$JOBS" -trimpath -ldflags="-s -w" -o "$bin/etcd.tmp" ./etcd)
        mv "$bin/etcd.tmp" "$bin/etcd"
    fi
    echo "$bin"
}

build_kuberay() {
    local KUBERAY_VERSION=$1 KUBERAY_HOME=$CACHE/kuberay-v$1
    local bin=$KUBERAY_HOME/bin src=$KUBERAY_HOME/src
    if [ -x "$bin/kuberay-operator" ]; then echo "$bin"; return 0; fi
    mkdir -p "$bin"
    local module=github.com/ray-project/kuberay/ray-operator
    if [ ! -f "$src/go.mod" ]; then
        local zip
        if zip=$(go mod download -json "$module@v$KUBERAY_VERSION" 2>/dev/null | awk -F'"' '/"Dir":/{print $4}') \
            && [ -n "$zip" ] && [ -f "$zip/go.mod" ]; then
            log "operator source from the module proxy"
            rm -rf "$src" && mkdir -p "$src" && cp -r "$zip"/. "$src"/ && chmod -R u+w "$src"
        elif [ -n "$KUBERAY_GIT" ] && { git --git-dir="$KUBERAY_GIT" rev-parse -q --verify "ray-operator/v$KUBERAY_VERSION^{commit}" >/dev/null 2>&1 \
            || git -C "$KUBERAY_GIT" rev-parse -q --verify "ray-operator/v$KUBERAY_VERSION^{commit}" >/dev/null 2>&1; }; then
            log "the proxy does not serve $module@v$KUBERAY_VERSION; using the tag from $KUBERAY_GIT"
            local gd=$KUBERAY_GIT
            [ -d "$KUBERAY_GIT/.git" ] && gd=$KUBERAY_GIT/.git
            rm -rf "$src.tmp" && mkdir -p "$src.tmp"
            # File by file (a partial clone may lack blobs outside ray-operator/, which
            # git archive would trip on).
            local mode type blob path
            git --git-dir="$gd" ls-tree -r "ray-operator/v$KUBERAY_VERSION" ray-operator \
                | while read -r mode type blob path; do
                    mkdir -p "$src.tmp/$(dirname "$path")"
                    git --git-dir="$gd" cat-file blob "$blob" > "$src.tmp/$path"
                done
            rm -rf "$src" && mv "$src.tmp/ray-operator" "$src" && rm -rf "$src.tmp"
        elif [ -n "$KUBERAY_FALLBACK" ] && [ "$KUBERAY_FALLBACK" != "$KUBERAY_VERSION" ]; then
            log "the proxy does not serve $module@v$KUBERAY_VERSION and no clone of ray-project/kuberay" \
                "with its tag was named (KUBERAY_GIT=${KUBERAY_GIT:-<unset>}); using v$KUBERAY_FALLBACK instead"
            KUBERAY_FALLBACK= build_kuberay "$KUBERAY_FALLBACK"
            return
        else
            echo "error: $module@v$KUBERAY_VERSION is not served by the Go proxy here and no clone of" \
                 "ray-project/kuberay with the tag ray-operator/v$KUBERAY_VERSION was found;" \
                 "set KUBERAY_GIT to one (git clone --bare https://github.com/ray-project/kuberay)" >&2
            return 2
        fi
    fi
    log "building the KubeRay operator v$KUBERAY_VERSION (minutes on 2 cores)"
    (cd "$src" && go mod download >&2 && timed kuberay-operator go build -p "$JOBS" -trimpath \
        -ldflags="-s -w" -o "$bin/kuberay-operator.tmp" .)
    mv "$bin/kuberay-operator.tmp" "$bin/kuberay-operator"
    echo "$bin"
}

# `go install MODULE@VERSION` of a main package into $CACHE/<folder>/bin, once.
go_install() {
    local folder=$1 name=$2 target=$3 bin=$CACHE/$1/bin
    if [ ! -x "$bin/$name" ]; then
        mkdir -p "$bin"
        log "building $name ($target)"
        timed "$name" env GOBIN="$bin.tmp" go install -p "$JOBS" -trimpath -ldflags="-s -w" "$target"
        mv "$bin.tmp/$name" "$bin/$name" && rmdir "$bin.tmp"
    fi
    echo "$bin"
}

# A small main package of this project (its own go.mod, no dependencies) into $CACHE/local/bin;
# rebuilt when its source changes (the binary's name carries a hash of the source).
build_local() {
    local dir=$1 name=$2 bin=$CACHE/local/bin hash
    hash=$(cat "$dir"/go.mod "$dir"/*.go | sha256sum | cut -c1-12)
    if [ ! -x "$bin/$name-$hash" ]; then
        mkdir -p "$bin"
        (cd "$dir" && go build -trimpath -ldflags="-s -w" -o "$bin/$name-$hash.tmp" .)
        mv "$bin/$name-$hash.tmp" "$bin/$name-$hash"
    fi
    ln -sf "$name-$hash" "$bin/$name"
    echo "$bin"
}

case $WHAT in
    k8s) build_k8s kube-apiserver kube-controller-manager kube-scheduler etcd ;;
    node) build_k8s kubelet kubeadm kubectl kube-proxy ;;
    kuberay) build_kuberay "$KUBERAY_VERSION" ;;
    kind) go_install "kind-v$KIND_VERSION" kind "sigs.k8s.io/kind@v$KIND_VERSION" ;;
    coredns) go_install "coredns-v$COREDNS_VERSION" coredns "github.com/coredns/coredns@v$COREDNS_VERSION" ;;
    minio) go_install "minio-$MINIO_VERSION" minio "github.com/minio/minio@$MINIO_VERSION" >/dev/null
           go_install "minio-$MINIO_VERSION" mc "github.com/minio/mc@$MC_VERSION" ;;
    local) build_local "$2" "$3" ;;
    all) build_k8s kube-apiserver kube-controller-manager kube-scheduler etcd
         build_kuberay "$KUBERAY_VERSION" ;;
    *) echo "usage: $0 [all|k8s|node|kuberay|kind|coredns|minio|local DIR NAME]" >&2; exit 2 ;;
esac
