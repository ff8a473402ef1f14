"""CPU time of benchmark processes, read from Linux's /proc: on a shared 2-core machine who
used the cores during a phase (the embedded broker, the worker, its sampling process) says
more about a latency figure than the figure alone."""
from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    # the command name may hold spaces or parentheses: split after its closing one
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (one level)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass                                # exited while we looked
    return found


class CpuMeter:
    """CPU share (1.0 = one core) of named groups of processes between two readings."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._last = self._read()

    def _read(self) -> tuple[float, dict[str, float]]:
        now, used = time.monotonic(), {}
        for name, group in self.pids.items():
            try:
                used[name] = sum(cpu_seconds(pid) for pid in group)
            except OSError:
                used[name] = float("nan")           # one of them exited meanwhile
        return now, used

    def shares(self) -> dict[str, float]:
        """Each group's CPU share since the previous call (or since creation)."""
        (t0, a), (t1, b) = self._last, self._read()
        self._last = (t1, b)
        return {name: (b[name] - a[name]) / max(t1 - t0, 1e-9) for name in self.pids}
