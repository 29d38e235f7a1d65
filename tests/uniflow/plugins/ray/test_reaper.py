"""A local cluster's teardown reaps the processes it kills itself (no Ray needed).

Killing a node orphans its processes; without a subreaper they go to PID 1, which may reap
them long after (a defunct entry in ``ps`` meanwhile), and teardown waits for that.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from michelangelo.uniflow.plugins.ray._clusters._reaper import adopting_orphans, is_subreaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="child subreapers are a Linux feature")

# A parent that starts a long-lived child, says its pid, and exits: the child is orphaned.
_ORPHAN_A_CHILD = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
    "                         start_new_session=True, stdout=subprocess.DEVNULL,\n"
    "                         stderr=subprocess.DEVNULL)\n"
    "print(child.pid, flush=True)\n"
)


def _orphan() -> psutil.Process:
    parent = subprocess.run([sys.executable, "-c", _ORPHAN_A_CHILD], capture_output=True,
                            text=True, check=True, timeout=60)
    return psutil.Process(int(parent.stdout.strip()))


def test_orphans_of_the_teardown_are_adopted_and_reaped_here():
    assert not is_subreaper()
    with adopting_orphans():
        assert is_subreaper()
        orphan = _orphan()
        try:
            assert orphan.ppid() == os.getpid()  # adopted, not handed to PID 1
        finally:
            orphan.kill()
        assert orphan.wait(timeout=10) == -9  # reaped by this process, with its status
        assert not psutil.pid_exists(orphan.pid)  # not even a defunct entry is left
    assert not is_subreaper()  # the flag is back as it was


def test_after_the_teardown_orphans_go_elsewhere_again():
    with adopting_orphans():
        pass
    orphan = _orphan()
    try:
        assert orphan.ppid() != os.getpid()
    finally:
        orphan.kill()  # its new parent reaps it
