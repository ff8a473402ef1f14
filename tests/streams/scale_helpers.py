"""Helpers of the tests whose worker set changes (test_scale, test_plan): waiting for the
workers to catch up, and the checks that nothing was lost or applied twice."""
import re
import time

from hirflow.state.graph import GraphStore
from hirflow.streams.scaleout import changelog
from hirflow.streams import changes
from hirflow.streams.topics import Topics
from hirflow.streams.worker.worker_process import WorkerProcess
from tests.state.helpers import apply_direct, assert_same_state, digest
from tests.streams.kafka_helpers import drain, end_offsets


def applied_offsets(w: WorkerProcess) -> dict[tuple[str, int], float]:
    """The worker's `hirflow_applied_offset` gauges: (topic, partition) -> offset."""
    out = {}
    for key, v in w.metrics().items():
        m = re.fullmatch(r'hirflow_applied_offset\{partition="(\d+)",topic="([^"]+)"\}', key)
        if m:
            out[(m.group(2), int(m.group(1)))] = v
    return out


def wait_done(cfg, running: list[WorkerProcess], timeout: float = 120.0) -> None:
    """Until the owners have applied every engagement, and then every reverse record."""
    topics = Topics(cfg.kafka.topic_prefix)
    deadline = time.monotonic() + timeout
    for topic in (topics.engagements, topics.reverse):
        ends = end_offsets(cfg, topic)
        while True:
            have: dict[tuple[str, int], float] = {}
            for w in running:
                have.update(applied_offsets(w))
            left = {p: e for p, e in ends.items() if e > 0 and have.get((topic, p), -1) < e - 1}
            if not left:
                break
            assert time.monotonic() < deadline, f"{topic}: partitions {left} not applied to their end"
            time.sleep(0.5)


def wait_refreshed(running: list[WorkerProcess], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ms = [w.metrics() for w in running]
        if all(m and m.get("hirflow_dirty_nodes", 1) == 0 and m.get("hirflow_neighbor_refresh_backlog", 1) == 0
               for m in ms):
            return
        assert time.monotonic() < deadline, "refresh did not catch up"
        time.sleep(0.3)


def assert_changes_consistent(cfg) -> None:
    """Whoever published a node's token change with a sequence number, the content is the
    same (a move carries the sequences and the unacknowledged outbox with the state), and a
    node's new changes (resends aside) come in increasing sequence."""
    seen: dict[tuple[str, int], set[bytes]] = {}
    last: dict[str, int] = {}
    for m in drain(cfg, Topics(cfg.kafka.topic_prefix).token_changes, 10**9, timeout=8):
        c = changes.decode(m.value())
        if (c.node, c.seq) not in seen:
            assert c.seq > last.get(c.node, -1), (c.node, c.seq, last.get(c.node))
            last[c.node] = c.seq
        seen.setdefault((c.node, c.seq), set()).add(m.value())
    assert seen and all(len(v) == 1 for v in seen.values())


def assert_state_is_direct(cfg, tmp_path, volume: str, evs) -> None:
    """The store in `volume`, and a fresh restore of every partition from the change log,
    equal a direct apply of `evs` (counts exact, weights 1e-9)."""
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        expected = digest(store)
    with GraphStore(tmp_path / volume, cfg.schema, cfg.kafka.partitions, create=False) as store:
        assert_same_state(digest(store), expected)
    with GraphStore(tmp_path / "fresh", cfg.schema, cfg.kafka.partitions) as store:
        topics = Topics(cfg.kafka.topic_prefix)
        writer = changelog.ChangelogWriter(cfg.kafka, store, topics.changelog, "test")
        done = changelog.settle(cfg.kafka, store, writer, list(range(cfg.kafka.partitions)),
                                cfg.kafka.partitions)
        writer.close()
        assert sorted(done.restored) == list(range(cfg.kafka.partitions))
        assert_same_state(digest(store), expected)
