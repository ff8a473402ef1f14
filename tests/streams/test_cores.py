"""Cores available to the worker and the sampling processes that gives."""
import os

from hirflow.streams.worker.cores import MAX_SAMPLE_PROCESSES, available_cores, default_sample_processes


def test_a_cgroup_quota_caps_the_cores_and_no_quota_leaves_the_affinity_mask(tmp_path):
    mask = len(os.sched_getaffinity(0))
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")                  # a 1.5 CPU limit: 2 cores' worth
    assert available_cores(limit) == min(mask, 2)
    limit.write_text("max 100000\n")
    assert available_cores(limit) == mask
    assert available_cores(tmp_path / "absent") == mask
    limit.write_text("garbage")
    assert available_cores(limit) == mask


def test_one_sampling_process_per_two_cores_within_bounds():
    assert [default_sample_processes(c) for c in (1, 2, 3, 4, 16, 64)] == \
        [1, 1, 1, 2, 8, MAX_SAMPLE_PROCESSES]
    assert 1 <= default_sample_processes() <= MAX_SAMPLE_PROCESSES
