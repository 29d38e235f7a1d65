"""CPU-seconds a benchmark arm spent, in all, and by the kind of process that spent them.

On a machine with few cores a run that keeps every core busy can only get faster by doing
less work, while one that leaves cores idle could also overlap more. ``CpuMeter`` tells the
two apart: around one arm it reads the machine's busy and idle time from ``/proc/stat`` (exact)
and, every ``interval_s``, each process's user and system time from ``/proc/<pid>/stat``,
grouped by the kind its command line names (``ray::RayTrainWorker``, ``raylet``, the driver...).
The grouping is approximate: time a process spent after the last sample it was seen in is
missed, and a Ray worker counts as ``ray::IDLE`` until it takes its first task or actor (its
imports land there). Linux only; elsewhere the meter records nothing.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from typing import Any

from _common import median, print_table

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Ray titles its processes "ray::<Class>.<method>" or "ray::<Class>" (Serve replicas carry
# "ServeReplica:<app>:<deployment>" somewhere in theirs). The method changes while an actor
# works; the kind keeps the class only.
_METHOD = re.compile(r"\.(?:_*[a-z]\w*)$")
_NAMED = ("raylet", "gcs_server", "dashboard_agent", "dashboard", "runtime_env_agent",
          "log_monitor", "monitor.py")


def process_kind(cmdline: str) -> str:
    """A short name for the kind of process ``cmdline`` belongs to."""
    words = cmdline.split()
    if not words:
        return "other"
    if words[0].startswith("ray::"):
        title = _METHOD.sub("", words[0][len("ray::"):])
        replica = title.rfind("ServeReplica:")
        return "ray::" + (title[replica:] if replica >= 0 else title)
    script = None
    if "python" in os.path.basename(words[0]) and len(words) > 1:
        args = [w for w in words[1:] if not w.startswith("-")]
        script = os.path.basename(args[0]) if args else words[1]
        # The `ray start --block` of a local node, before the names below: its flags
        # (--dashboard-port, ...) would otherwise file it under the dashboard.
        if script == "ray" and len(args) > 1:
            return f"ray {args[1]}"
    for name in _NAMED:
        if name in cmdline:
            return name
    return "python " + script if script else os.path.basename(words[0])


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, idle) clock ticks of all cores since boot."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, idle


def _process_ticks() -> dict[int, tuple[int, str]]:
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        found[int(entry)] = (int(fields[11]) + int(fields[12]), cmdline)
    return found


class CpuMeter:
    """``with CpuMeter() as meter: ...``, then ``meter.result()``."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._by_kind: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[int, int] = {}
        self._start = self._end = None
        self._wall = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = _machine_ticks()
        if self._start is not None:
            self._seen = {pid: ticks for pid, (ticks, _) in _process_ticks().items()}
            self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
            self._thread.start()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._wall = time.perf_counter() - self._wall
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()
        self._end = _machine_ticks()

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        own = os.getpid()
        for pid, (ticks, cmdline) in _process_ticks().items():
            spent = ticks - self._seen.get(pid, 0)
            self._seen[pid] = ticks
            if spent > 0 and pid != own:
                self._by_kind[process_kind(cmdline)] += spent / _TICK

    def result(self, top: int = 8) -> dict[str, Any]:
        """Busy CPU-seconds, mean busy cores, and the ``top`` kinds' CPU-seconds."""
        if self._start is None or self._end is None:
            return {}
        busy = (self._end[0] - self._start[0]) / _TICK
        kinds = {kind: round(seconds, 1) for kind, seconds in self._by_kind.most_common(top)}
        return {"busy_cpu_s": round(busy, 1), "cores": os.cpu_count(),
                "mean_busy_cores": round(busy / self._wall, 2) if self._wall else None,
                "by_kind_cpu_s": kinds}


def print_cpu(runs: dict[str, list[dict]]) -> None:
    """Each arm's CPU-seconds (median) and, for its last round, the kinds that spent them."""
    if not all(r["cpu"] for rows in runs.values() for r in rows):
        return
    print_table("CPU spent by the whole machine during each run, medians",
                ["arm", "busy CPU-s", "mean busy cores"],
                [[arm, median([r["cpu"]["busy_cpu_s"] for r in rows]),
                  median([r["cpu"]["mean_busy_cores"] for r in rows])]
                 for arm, rows in runs.items()])
    for arm, rows in runs.items():
        kinds = rows[-1]["cpu"]["by_kind_cpu_s"]
        print(f"{arm}, last round, CPU-s by process kind: "
              + ", ".join(f"{kind} {seconds}" for kind, seconds in kinds.items()))
