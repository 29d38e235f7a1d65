"""runc-capfilter, the runtime wrapper for hosts whose bounding set lacks a capability.

The wrapper is built from the project's Go source and run for real; only runc is replaced, by
a RECORDING STAND-IN (a shell script, below) that keeps the spec it was handed and the
arguments, since a real runc would start a container. runc reads the spec from
``<bundle>/config.json`` for ``create``/``run`` and from the ``--process`` file for ``exec``
(runc's ``utils_linux.go``/``exec.go``), which is what the wrapper edits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from michelangelo.sandbox._doctor import missing_capabilities

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")

EVERY = ["CAP_CHOWN", "CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_KILL"]
RUNC_STAND_IN = """#!/bin/sh
# RECORDING STAND-IN for runc: keeps its arguments and the spec it would read.
printf '%s\\n' "$@" > "$RECORD/args"
prev=""
for arg in "$@"; do
    [ "$prev" = "--bundle" ] && cp "$arg/config.json" "$RECORD/spec.json"
    [ "$prev" = "--process" ] && cp "$arg" "$RECORD/spec.json"
    prev="$arg"
done
exit 0
"""


@pytest.fixture(scope="module")
def capfilter():
    from michelangelo.sandbox._build_steps import FILES, go_build

    folder = go_build("local", str(FILES / "go" / "runc-capfilter"), "runc-capfilter")
    return str(folder / "runc-capfilter")


def _held() -> set[str]:
    with open("/proc/self/status") as handle:
        status = handle.read()
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    missing = set(missing_capabilities(status, last))
    return {c for c in EVERY if c not in missing}


def _own_oom_score() -> int:
    with open("/proc/self/oom_score_adj") as handle:
        return int(handle.read())


def _run(capfilter, tmp_path, args, spec_path, spec):
    record = tmp_path / "record"
    record.mkdir()
    runc = tmp_path / "runc"
    runc.write_text(RUNC_STAND_IN)
    runc.chmod(0o755)
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, CAPFILTER_RUNC=str(runc), RECORD=str(record))
    done = subprocess.run([capfilter, *args], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return (record / "args").read_text().split("\n")[:-1], json.loads(
        (record / "spec.json").read_text())


def test_create_keeps_only_what_the_host_grants(capfilter, tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    caps = {name: list(EVERY) for name in ("bounding", "effective", "permitted")}
    spec = {"ociVersion": "1.0.2", "process": {"args": ["/pause"], "capabilities": caps,
                                               "oomScoreAdj": -998},
            "root": {"path": "rootfs"}}
    args = ["--root", "/run/x", "create", "--bundle", str(bundle), "--pid-file", "p", "c1"]
    passed, seen = _run(capfilter, tmp_path, args, bundle / "config.json", spec)
    assert passed == args  # runc gets the same arguments
    held = _held()
    for name in ("bounding", "effective", "permitted"):
        assert set(seen["process"]["capabilities"][name]) == held
    if "CAP_SYS_RESOURCE" in held:
        assert seen["process"]["oomScoreAdj"] == -998
        assert seen == spec  # nothing missing: the spec is left as it was
    else:
        # Lowering oom_score_adj needs CAP_SYS_RESOURCE: raised to the wrapper's own.
        assert seen["process"]["oomScoreAdj"] == _own_oom_score()
    assert seen["root"] == spec["root"] and seen["process"]["args"] == ["/pause"]


def test_exec_edits_the_process_file(capfilter, tmp_path):
    process = {"args": ["cat", "/kind/version"], "cwd": "/",
               "capabilities": {"bounding": list(EVERY), "effective": list(EVERY)}}
    path = tmp_path / "process.json"
    args = ["exec", "--process", str(path), "--detach", "c1"]
    passed, seen = _run(capfilter, tmp_path, args, path, process)
    assert passed == args
    assert set(seen["capabilities"]["bounding"]) == _held()
    assert seen["args"] == ["cat", "/kind/version"]
