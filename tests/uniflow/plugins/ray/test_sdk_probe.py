"""The SDK probe, run by real Pythons the way a cluster's job would run it.

The end-to-end path (a probe job on a real Ray cluster, a job that carries the client's copy)
is in ``test_remote_run.py``.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig

import pytest

from michelangelo.uniflow.core.errors import UserError
from michelangelo.uniflow.plugins.ray._remote._sdk_probe import (
    client_version,
    needs_shipping,
    parse_probe,
    probe_entrypoint,
    required_distributions,
)


def _probe(python: str, tmp_path, **env):
    done = subprocess.run(probe_entrypoint(python), shell=True, capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    found = parse_probe("some job noise\n" + done.stdout)
    assert found is not None
    return found


def test_the_clients_own_python_has_this_sdk(tmp_path):
    found = _probe(sys.executable, tmp_path)
    assert found.version == client_version() and found.missing == ()
    assert not needs_shipping(found, address="http://h:8265", python_env="UF_RAY_JOB_PYTHON")


def test_a_python_with_the_stack_but_not_the_sdk_gets_it_shipped(tmp_path):
    # No site hooks: the editable install's finder is gone, its requirements stay importable.
    found = _probe(f"{sys.executable} -S", tmp_path,
                   PYTHONPATH=sysconfig.get_paths()["purelib"])
    assert found.version is None and found.missing == ()
    assert needs_shipping(found, address="http://h:8265", python_env="UF_RAY_JOB_PYTHON")


def test_a_python_without_the_stack_is_refused_with_the_fix(tmp_path):
    found = _probe(f"{sys.executable} -S", tmp_path)
    assert found.version is None and set(found.missing) == set(required_distributions())
    assert "ray" in found.missing
    with pytest.raises(UserError, match=r"lacks ray, .*does not have either\)\. Fix: install "
                                        r"them there \(.* -m pip install ray==[0-9.]+ .*"
                                        r"UF_RAY_JOB_PYTHON"):
        needs_shipping(found, address="http://h:8265", python_env="UF_RAY_JOB_PYTHON")
