"""Standby replicas: warm copies of other workers' partitions, kept by following the change
log, so that a worker that gains a partition takes it over from its local copy and the log's
tail instead of replaying the log from the partition's newest snapshot.

Which copies (`standbys_of`): with `worker.standby_replicas = r`, the k-th standby of
partition p (k = 1..r, at most count - 1) is the worker that would own p if the plan had k
fewer workers (`p % (count - k)`), or the next worker after it when that one owns p
already. So scaling in by up to r workers moves every partition to a worker that holds a
copy; scaling out starts the new workers from the log as before.

Where: a second RocksDB store beside the worker's (`standby_path`), holding the standby
partitions' movable keys and each one's position in the log (the `Position` of the last
log step applied, where `partition_log.Replay.resume` goes on). It is never read by the
refresh, the query API or the peers: a standby copy is not this worker's state until
`streams.scaleout.changelog.settle` promotes it.

How (`StandbyFollower`): one thread with one consumer assigned to the standby partitions of
the change-log topic, feeding each partition's records to its replay and applying the steps
it confirms. The steps are absolute puts and deletes, so applying some of them twice (a
crash between a step and its position) ends in the same state: the follower is at least
once and still exact. A copy whose position the log no longer holds (retention) starts again
from the newest snapshot.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from hirflow.state import partition_state
from hirflow.state.graph import GraphStore
from hirflow.state.partition_log import Position, Replay
from hirflow.streams import clients
from hirflow.streams.scaleout.changelog import LogReader, newest_snapshot
from hirflow.streams.config import KafkaConfig
from hirflow.streams.metrics import STANDBY_APPLIED, STANDBY_LAG, STANDBY_PARTITIONS

log = logging.getLogger(__name__)

LAG_EVERY_S = 5.0           # how often the follower asks the broker where the log ends


def standbys_of(partition: int, count: int, replicas: int) -> list[int]:
    """The workers (indexes among `count`) that keep a standby copy of `partition`, first
    standby first."""
    owner, out = partition % count, []
    for k in range(1, min(replicas, count - 1) + 1):
        w = partition % (count - k)
        while w == owner or w in out:
            w = (w + 1) % count
        out.append(w)
    return out


def standby_partitions(index: int, count: int, replicas: int, partitions: int) -> list[int]:
    """The partitions worker `index` of `count` keeps standby copies of."""
    return [p for p in range(partitions) if index in standbys_of(p, count, replicas)]


def standby_path(graph_path: str | Path) -> Path:
    """The standby store of the worker whose store is at `graph_path`: beside it, on the
    same volume."""
    p = Path(graph_path)
    return p.with_name(p.name + "-standby")


def open_store(graph_path: str | Path, schema, partitions: int, replicas: int) -> GraphStore | None:
    """The standby store when standbys are on or one is left from when they were (a copy to
    promote from once more); None otherwise."""
    path = standby_path(graph_path)
    if replicas <= 0 and not (path / "CURRENT").exists():
        return None
    return GraphStore(path, schema, partitions)


def remove_store(store: GraphStore) -> None:
    """Close and delete a standby store that is no longer wanted (`standby_replicas` 0)."""
    store.close()
    shutil.rmtree(store.path, ignore_errors=True)
    log.info("standby: removed %s (worker.standby_replicas is 0)", store.path)


class StandbyFollower:
    """Keeps the standby copies of `partitions` in `store` following the change log."""

    def __init__(self, kafka: KafkaConfig, store: GraphStore, topic: str, partitions: list[int],
                 poll_s: float = 0.2) -> None:
        self.kafka, self.store, self.topic = kafka, store, topic
        self.partitions = sorted(partitions)
        self.poll_s = poll_s
        self.replays: dict[int, Replay] = {}
        self.consumed: dict[int, int] = {}          # partition -> next offset to read
        self.applied = 0                            # log steps applied since start
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None
        STANDBY_PARTITIONS.set(len(self.partitions))

    # -- where each copy starts -------------------------------------------------------------
    def _start_offset(self, reader: LogReader, p: int) -> int:
        """Set up partition p's replay; the offset its records are read from."""
        low, high = reader.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
        pos = partition_state.position(self.store, p)
        if pos is not None and pos.cseq >= 0 and low <= pos.offset + 1 <= high:
            self.replays[p] = Replay.resume(pos)
            self.consumed[p] = pos.offset + 1
            return pos.offset + 1
        if pos is not None:
            log.warning("standby: the copy of partition %d is at log offset %d, which the log "
                        "does not continue (it holds %d to %d); starting from its newest snapshot",
                        p, pos.offset, low, high - 1)
        partition_state.drop(self.store, p)
        self.replays[p] = Replay()
        start = newest_snapshot(reader, p, high) if high > low else None
        self.consumed[p] = low if start is None else start
        return OFFSET_BEGINNING if start is None else start

    def catch_up_starts(self) -> dict[int, int]:
        """Every copy's replay and start offset (read from the log, before following it)."""
        reader = LogReader(self.kafka, self.topic)
        try:
            return {p: self._start_offset(reader, p) for p in self.partitions}
        finally:
            reader.close()

    # -- following ----------------------------------------------------------------------------
    def apply(self, p: int, records: list[tuple[int, bytes, bytes]]) -> int:
        """Feed partition p's next records to its replay and apply what they confirm; the
        steps applied."""
        steps = [s for offset, kind, value in records for s in self.replays[p].feed(offset, kind, value)]
        if records:
            self.consumed[p] = records[-1][0] + 1
        if not steps:
            return 0
        partition_state.apply(self.store, p, steps)
        partition_state.set_position(self.store, p, steps[-1].position())
        self.applied += len(steps)
        STANDBY_APPLIED.inc(len(steps))
        return len(steps)

    def _run(self) -> None:
        consumer = None
        try:
            starts = self.catch_up_starts()
            consumer = clients.consumer(self.kafka, "hirflow-standby", **{"fetch.wait.max.ms": 100})
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
            log.info("standby: following partitions %s of %s", self.partitions, self.topic)
            last_lag = 0.0
            while not self.stop.is_set():
                msgs = consumer.consume(5000, timeout=self.poll_s)
                by_partition: dict[int, list] = defaultdict(list)
                for m in msgs:
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise RuntimeError(f"standby: reading {self.topic}: {m.error()}")
                    by_partition[m.partition()].append((m.offset(), m.key(), m.value()))
                for p, records in by_partition.items():
                    self.apply(p, records)
                if time.monotonic() - last_lag >= LAG_EVERY_S:
                    last_lag = time.monotonic()
                    STANDBY_LAG.set(self.lag(consumer))
        except BaseException as exc:     # a broken copy must not stop the worker: it only
            self.error = exc             # makes the next move slower (a restore instead)
            log.exception("standby: following the change log failed; standby copies stop here")
        finally:
            if consumer is not None:
                consumer.close()

    def lag(self, consumer) -> int:
        """Change-log records the copies have not read yet."""
        behind = 0
        for p in self.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)
            behind += max(0, high - self.consumed.get(p, 0))
        return behind

    def start(self) -> None:
        if not self.partitions:
            return
        self._thread = threading.Thread(target=self._run, name="hirflow-standby", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def position(self, p: int) -> Position | None:
        return partition_state.position(self.store, p)
