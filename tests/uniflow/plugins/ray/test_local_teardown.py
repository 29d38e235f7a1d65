"""How a local cluster's teardown tells that a process it ended is gone (no Ray needed)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from michelangelo.uniflow.plugins.ray._local import _gone


def test_an_ended_process_its_parent_has_not_reaped_counts_as_gone():
    """A killed node's processes are reparented and reaped by PID 1 on its own schedule;
    until then they are zombies, which hold nothing. Teardown must not wait for the reaping
    (here: a parent that never reaps its exited child)."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 30
        while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.status() == psutil.STATUS_ZOMBIE
        assert _gone(child)
    finally:
        parent.kill()
        parent.wait()


def test_a_running_process_is_not_gone():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _gone(psutil.Process(proc.pid))
    finally:
        proc.kill()
        proc.wait()
