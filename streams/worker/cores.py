"""How many cores this process may use, and how many view-sampling processes that gives.

The count honours the CPU affinity mask (taskset, a pinned pod) and a cgroup v2 CPU quota
(`cpu.max`: a Kubernetes CPU limit), whichever is smaller: `os.cpu_count()` alone reports
the host's cores inside a container limited to two.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
MAX_SAMPLE_PROCESSES = 8


def available_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may run on (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                  # no affinity masks on this platform
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def default_sample_processes(cores: int | None = None) -> int:
    """View-sampling processes for a worker on `cores` cores: one per two cores (the other
    half runs ingest, the refresh thread, the encoder's threads and often a broker), at
    least 1, at most `MAX_SAMPLE_PROCESSES`."""
    cores = available_cores() if cores is None else cores
    return max(1, min(MAX_SAMPLE_PROCESSES, cores // 2))
