"""``make k8s-up`` / ``make k8s-down``: the KubeRay test bed outside pytest.

``up`` starts, in a detached process of its own, what the KubeRay tests' session starts (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, the real KubeRay operator and the
kubelet double with its two nodes), returns once the operator answers ready, and prints
``export KUBECONFIG=<path>`` on a line of its own. ``down`` stops that process, which stops
everything it started. The state lives in ``$UF_K8S_BED`` (default ~/.cache/michelangelo/bed).

    python -m tools.kuberay_bed up|down|serve
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STATE = Path(os.environ.get("UF_K8S_BED", Path.home() / ".cache" / "michelangelo" / "bed"))
STATE_FILE = STATE / "state.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _state() -> dict | None:
    try:
        state = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(state["pid"]) else None


def serve() -> None:
    """Runs the bed in this process until SIGTERM or SIGINT."""
    from tools.kuberay_bed._control_plane import NODES, ControlPlane, build, build_operator
    from tools.kuberay_bed._kubelet_double import KubeletDouble

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    plane = ControlPlane(build(), build_operator()).start()
    kubelet = None
    try:
        for name, amounts in NODES.items():
            plane.add_node(name, **amounts)
        kubelet = KubeletDouble(plane.api_client(), list(NODES), net_file=plane.net_file).start()
        STATE_FILE.write_text(json.dumps({"pid": os.getpid(), "kubeconfig": str(plane.kubeconfig),
                                          "dir": str(plane.dir), "logs": kubelet.log_dir}))
        done.wait()
    finally:
        if kubelet is not None:
            kubelet.stop()
        plane.stop()
        STATE_FILE.unlink(missing_ok=True)


def up(timeout_s: float = 900) -> int:
    state = _state()
    if state is None:
        STATE.mkdir(parents=True, exist_ok=True)
        STATE_FILE.unlink(missing_ok=True)
        log = open(STATE / "bed.log", "ab")  # noqa: SIM115  (handed to the child)
        proc = subprocess.Popen([sys.executable, "-m", "tools.kuberay_bed", "serve"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + timeout_s
        while (state := _state()) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"the test bed did not start; see {STATE / 'bed.log'}", file=sys.stderr)
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)
                return 1
            time.sleep(0.5)
    print(f"KubeRay test bed running (pid {state['pid']}; logs in {state['dir']}, "
          f"{state['logs']}); stop it with make k8s-down", file=sys.stderr)
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def down(timeout_s: float = 60) -> int:
    state = _state()
    if state is None:
        print("no KubeRay test bed is running", file=sys.stderr)
        return 0
    os.kill(state["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(state["pid"]) and time.monotonic() < deadline:
        time.sleep(0.3)
    if _alive(state["pid"]):
        print(f"the test bed (pid {state['pid']}) did not stop", file=sys.stderr)
        return 1
    print("KubeRay test bed stopped", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    """``up``, ``down`` or ``serve`` (what ``up`` starts in its detached process)."""
    command = argv[0] if argv else ""
    if command == "serve":
        serve()
        return 0
    if command in ("up", "down"):
        return up() if command == "up" else down()
    print(__doc__, file=sys.stderr)
    return 2
