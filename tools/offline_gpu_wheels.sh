#!/usr/bin/env bash
# Wheels that let bench/gpu_check.sh run on an offline GPU machine whose Python already has
# torch, Lightning, DeepSpeed's needs, transformers, peft, pandas, pyarrow, aiohttp and grpcio
# (a CUDA image), but not Ray or this project. Run here, where PyPI answers; copy DEST there.
#
#   bash tools/offline_gpu_wheels.sh [DEST]        # DEST defaults to .whl (git-ignored)
#   # there:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DEST/*.whl
#   PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHON=python3 bash bench/gpu_check.sh
#
# PY_VERSION (default 3.12) is the GPU machine's Python. Ray's wheel is slimmed to fit a 64 MiB
# transfer: its Java jar goes (no Java workers here) and the dashboard's web page becomes a
# placeholder (the dashboard's API, which the Jobs client uses, stays). DeepSpeed comes from a
# wheel built here without its compiled ops (they build on first use there, as usual).
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${1:-.whl}
PY_VERSION=${PY_VERSION:-3.12}
PY="${PYTHON:-.venv/bin/python}"
tag=cp${PY_VERSION/./}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$DEST"

download() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -c constraints.txt -d "$1" "${@:2}"
}

# What Ray's default, data, train and serve extras need that such an image lacks.
download "$DEST" aiohttp-cors annotated-types cachetools colorful fastapi google-api-core \
    google-auth googleapis-common-protos hjson httptools importlib-metadata jsonschema \
    jsonschema-specifications opencensus opencensus-context opentelemetry-api \
    opentelemetry-exporter-prometheus opentelemetry-proto opentelemetry-sdk \
    opentelemetry-semantic-conventions proto-plus protobuf pyasn1 pyasn1-modules pydantic \
    pydantic-core python-dotenv referencing rpds-py smart-open starlette tensorboardX \
    typing-inspection uvicorn watchfiles websockets

download "$work" ray
"$PY" - "$work"/ray-*-"$tag"-*.whl "$DEST" <<'EOF'
import base64, hashlib, os, sys, zipfile

src, dest = sys.argv[1], sys.argv[2]
dropped = ("ray/jars/", "ray/dashboard/client/build/")
placeholder = {
    "ray/dashboard/client/build/index.html":
        b"<html><body>The dashboard's web page is not in this slimmed wheel.</body></html>\n",
    "ray/dashboard/client/build/static/.keep": b"",
}

def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}".encode()

with zipfile.ZipFile(src) as zin, zipfile.ZipFile(
        os.path.join(dest, os.path.basename(src)), "w", zipfile.ZIP_DEFLATED) as zout:
    for name, data in placeholder.items():
        zout.writestr(name, data)
    for info in zin.infolist():
        if info.filename.startswith(dropped):
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            kept = [line for line in data.splitlines()
                    if line and not line.decode().split(",")[0].startswith(dropped)]
            data = b"\n".join([record_line(n, d) for n, d in placeholder.items()] + kept) + b"\n"
        zout.writestr(info, data)
EOF

version=$(grep -i '^deepspeed==' constraints.txt | cut -d= -f3)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "deepspeed==$version"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" .
du -sh "$DEST"
