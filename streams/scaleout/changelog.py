"""The change log: each owned partition's state changes on a Kafka topic, so that any worker
can take the partition over with exactly the bytes, offsets and sequences its owner had.

The record format and the replay rules are `state.partition_log`; this module does the
Kafka side:

- `ChangelogWriter` is the store's log hook (`GraphStore.attach_log`): each local commit's
  movable changes are produced to the partition's log and acknowledged *before* the local
  batch is written. It is also the fence: it knows the offset its last record got, so when
  its next record does not land right after it, another worker has claimed the partition
  meanwhile, and it raises `Fenced` before anything is written locally. A worker cut off
  from the broker cannot produce, so it cannot write either.
- `settle` runs at start-up for every partition the worker is assigned: claim it (which
  fences any former owner), then keep the local state when the log says nobody else wrote
  since, or drop it and replay the log. Partitions the store holds but the worker no
  longer owns are dropped.
- snapshots (`ChangelogWriter.snapshot`): every movable key of a partition, written when
  the partition first enters the log with state and then periodically, so a replay starts
  from the newest snapshot instead of the first commit and the topic may carry a retention.
- standby copies (`streams.scaleout.standby`): `settle` takes over a gained partition from a local
  copy and the log after it when there is one, and hands a lost partition to the standby
  store when this worker keeps a copy of it.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from hirflow.state import partition_state
from hirflow.state.graph import GraphStore, IncompatibleStoreError
from hirflow.state.partition_log import (CLAIM, SNAPSHOT, Op, Position, Replay, claim_record, decode,
                                         replay, set_records)
from hirflow.streams import clients
from hirflow.streams.config import KafkaConfig

log = logging.getLogger(__name__)

PART_BYTES = 900_000        # ops per record: under Kafka's default 1 MB message limit
STALL_S = 60.0              # a read of the log that gets nothing this long fails


class Fenced(RuntimeError):
    """Another worker claimed a partition this worker was writing: it must stop."""


class ChangelogError(RuntimeError):
    """The log did not take a record (broker down, unreachable, rejected)."""


class ChangelogWriter:
    """Produces commits and snapshots to `topic` and fences this worker's partitions."""

    def __init__(self, kafka: KafkaConfig, store: GraphStore, topic: str, worker: str,
                 timeout_s: float = 30.0, snapshot_every_s: float = 3600.0) -> None:
        self.store = store
        self.topic = topic
        self.worker = worker
        self.timeout_s = timeout_s
        self.snapshot_every_s = snapshot_every_s
        self.positions: dict[int, Position] = {}
        self._last_snapshot: dict[int, tuple[float, int]] = {}   # p -> (when, at which commit)
        self._lock = threading.RLock()     # one log write at a time: offsets are checked
        self.producer = clients.producer(kafka, **{"linger.ms": 1})

    # -- producing ------------------------------------------------------------------------
    def _produce(self, records: Iterable[tuple[int, bytes, bytes]]) -> list[tuple[int, int]]:
        """Produce (partition, key, value) records (made as they are sent) and wait for all:
        (partition, offset) of each, in offset order."""
        got: list[tuple[int, int]] = []
        errors: list[str] = []

        def done(err, msg) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                got.append((msg.partition(), msg.offset()))

        n = 0
        for partition, key, value in records:
            clients.produce_blocking(self.producer, self.topic, value, key=key,
                                     partition=partition, on_delivery=done)
            n += 1
        if self.producer.flush(self.timeout_s) or errors or len(got) != n:
            raise ChangelogError(f"change log {self.topic} did not take {n} records: "
                                 f"{errors[0] if errors else 'timed out'}")
        return sorted(got, key=lambda po: po[1])

    def _append(self, partition: int, records: Iterable[tuple[bytes, bytes]]) -> int:
        """Produce records right after this worker's last one; the last one's offset."""
        pos = self.positions[partition]
        offsets = [o for _, o in self._produce((partition, k, v) for k, v in records)]
        if offsets[0] != pos.offset + 1 or offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            raise Fenced(f"partition {partition}: another worker wrote to the change log after "
                         f"this worker's record at {pos.offset} (now at {offsets[0]}); it owns "
                         "the partition now, so this worker stops")
        return offsets[-1]

    def __call__(self, changes: dict[int, list[Op]]) -> dict[int, Position]:
        """The store's log hook: log each partition's changes as its next commit."""
        with self._lock:
            out = {}
            for p, ops in changes.items():
                pos = self.positions.get(p)
                if pos is None:
                    raise Fenced(f"partition {p} is not claimed by this worker")
                last = self._append(p, set_records(pos.epoch, pos.cseq + 1, ops, PART_BYTES))
                out[p] = self.positions[p] = Position(pos.epoch, pos.cseq + 1, last)
            return out

    def claim(self, bases: dict[int, int | None]) -> dict[int, int]:
        """Take the partitions (partition -> the base of its claim, see `state.partition_log`)
        in one round trip: their new epochs (each claim's offset)."""
        with self._lock:
            return dict(self._produce((p, *claim_record(b, self.worker)) for p, b in bases.items()))

    def snapshot(self, partition: int) -> None:
        """Log every movable key of the partition as of now (no commit in between)."""
        with self.store.log_lock, self._lock:   # the store's order: see GraphStore.write
            pos = self.positions[partition]
            keys = 0

            def ops():
                nonlocal keys
                for op in partition_state.movable_ops(self.store, partition):
                    keys += 1
                    yield op

            last = self._append(partition, set_records(pos.epoch, pos.cseq, ops(), PART_BYTES,
                                                       snapshot=True))
            self.positions[partition] = Position(pos.epoch, pos.cseq, last)
            partition_state.set_position(self.store, partition, self.positions[partition])
            self._last_snapshot[partition] = (time.monotonic(), pos.cseq)
        log.info("change log: snapshot of partition %d (%d keys, commit %d)", partition, keys, pos.cseq)

    def snapshot_due(self) -> None:
        """Snapshot the partitions whose last snapshot is older than `snapshot_every_s` and
        that changed since (called between commits by the ingest loop)."""
        now = time.monotonic()
        for p, pos in list(self.positions.items()):
            since, at = self._last_snapshot.setdefault(p, (now, pos.cseq))
            if now - since >= self.snapshot_every_s and pos.cseq > at:
                self.snapshot(p)

    def close(self) -> None:
        self.producer.flush(self.timeout_s)


# -- reading --------------------------------------------------------------------------------
class LogReader:
    """Reads ranges of the log's partitions with one consumer (no group offsets)."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self.topic = topic
        self.consumer = clients.consumer(kafka, "hirflow-changelog-reader", **{"fetch.wait.max.ms": 10})

    def read(self, partition: int, start: int, end: int):
        """(offset, kind, value) of the records in [start, end) of the partition (start may
        be OFFSET_BEGINNING); the record at `end - 1` must exist (or `end`: a claim just made)."""
        if start != OFFSET_BEGINNING and start >= end:
            return
        self.consumer.assign([TopicPartition(self.topic, partition, start)])
        last = time.monotonic()
        try:
            while True:
                msgs = self.consumer.consume(1000, timeout=0.01)
                if msgs:
                    last = time.monotonic()
                elif time.monotonic() - last > STALL_S:
                    raise ChangelogError(f"reading {self.topic}[{partition}]: nothing came for "
                                         f"{STALL_S:.0f} s before offset {end}")
                for m in msgs:
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise ChangelogError(f"reading {self.topic}[{partition}]: {m.error()}")
                    if m.offset() >= end:
                        return
                    yield m.offset(), m.key(), m.value()
                    if m.offset() == end - 1:
                        return
        finally:
            self.consumer.unassign()

    def close(self) -> None:
        self.consumer.close()


def newest_snapshot(reader: LogReader, partition: int, end: int) -> int | None:
    """The offset where the newest whole snapshot of the current owner's line starts (None:
    none), found by decoding only snapshot records: a replay starts there, not at the
    first commit."""
    epoch, best = -1, None
    building: tuple | None = None           # (start offset, epoch, cseq, next part)
    for offset, kind, value in reader.read(partition, OFFSET_BEGINNING, end):
        if kind == CLAIM:
            epoch, building = offset, None
        elif kind == SNAPSHOT:
            doc = decode(kind, value)
            if doc["i"] == 0 and doc["e"] >= epoch:
                epoch, building = doc["e"], (offset, doc["e"], doc["s"], 0)
            if building is not None and (doc["e"], doc["s"], doc["i"]) == building[1:]:
                building = building[:3] + (doc["i"] + 1,)
                if doc["end"]:
                    best, building = building[0], None
            else:
                building = None
    return best


def _others_wrote(records, epoch: int) -> bool:
    """Whether any state record in `records` comes from another epoch than `epoch`."""
    return any(kind != CLAIM and decode(kind, value)["e"] != epoch for _, kind, value in records)


@dataclass
class Settled:
    kept: list[int]
    restored: dict[int, int]        # partition -> ops replayed
    bootstrapped: list[int]
    dropped: dict[int, int]         # partition -> node records removed
    seconds: float
    promoted: dict[int, int] = field(default_factory=dict)   # from a standby copy: log ops after it
    handed: list[int] = field(default_factory=list)          # lost ones kept as standby copies


def settle(kafka: KafkaConfig, store: GraphStore, writer: ChangelogWriter,
           owned: list[int], num_partitions: int, standby: GraphStore | None = None,
           standby_parts: Iterable[int] = ()) -> Settled:
    """Claim every owned partition and bring its local state to the log's; drop the rest.

    With a standby store: a gained partition with a copy there is promoted (the copy plus
    the log after it), a lost partition in `standby_parts` becomes a copy there, and the
    store keeps only copies of `standby_parts`."""
    t0 = time.perf_counter()
    kept, restored, booted, dropped, promoted, handed = [], {}, [], {}, {}, []
    standby_parts = set(standby_parts) - set(owned)
    for p in range(num_partitions):
        if p in owned:
            continue
        logged = partition_state.position(store, p) is not None
        if not logged and partition_state.has_state(store, p, meta=False):
            raise IncompatibleStoreError(
                f"state store {store.path} holds partition {p}, which this worker does not own, "
                "and which never entered the change log: dropping it would lose it. Start the "
                "workers once with worker.changelog = true and the worker count this store was "
                "built with, then change the count.")
        if logged or partition_state.has_state(store, p):
            if standby is not None and p in standby_parts and _hand_to_standby(store, standby, p):
                handed.append(p)
            dropped[p] = partition_state.drop(store, p)
            log.info("change log: dropped partition %d (%d nodes): another worker owns it", p, dropped[p])
    positions = {p: partition_state.position(store, p) for p in owned}
    # a restore that did not finish (its position says commit -1) is started again
    positions = {p: pos if pos is not None and pos.cseq >= 0 else None for p, pos in positions.items()}
    epochs = writer.claim({p: pos.cseq if pos is not None else None for p, pos in positions.items()})
    reader = LogReader(kafka, writer.topic)
    try:
        for p in owned:
            what, n = _settle_owned(store, writer, reader, p, positions[p], epochs[p], standby)
            if what == "promoted":
                promoted[p] = n
            elif what == "kept":
                kept.append(p)
            elif what == "bootstrapped":
                booted.append(p)
            elif what == "restored":
                restored[p] = n
    finally:
        reader.close()
    if standby is not None:     # owned partitions' copies are spent; copies of others stale
        for p in range(num_partitions):
            if p not in standby_parts and (partition_state.position(standby, p) is not None
                                           or partition_state.has_state(standby, p)):
                partition_state.drop(standby, p)
    return Settled(kept, restored, booted, dropped, time.perf_counter() - t0, promoted, handed)


def _hand_to_standby(store: GraphStore, standby: GraphStore, p: int) -> bool:
    """Keep a partition this worker loses as a standby copy, at its position in the log (its
    last commit here is durable, so the log after it goes on from there)."""
    pos = partition_state.position(store, p)
    if pos is None or pos.cseq < 0:
        return False
    partition_state.set_position(standby, p, Position(pos.epoch, -1, pos.offset))   # unfinished
    partition_state.copy(store, standby, p)
    partition_state.set_position(standby, p, pos)
    log.info("change log: partition %d kept as a standby copy (commit %d)", p, pos.cseq)
    return True


def _promote(store: GraphStore, standby: GraphStore, writer: ChangelogWriter, reader: LogReader,
             p: int, base: int | None, epoch: int) -> tuple[str, int] | None:
    """Take partition p over from its standby copy and the log after it, or None when there
    is no whole copy or the log no longer holds what follows it."""
    copy_at = partition_state.position(standby, p)
    if copy_at is None or copy_at.cseq < 0:
        return None
    low, _ = reader.consumer.get_watermark_offsets(TopicPartition(writer.topic, p), timeout=30)
    if not low <= copy_at.offset + 1 <= epoch:
        log.warning("change log: the standby copy of partition %d is at log offset %d, which "
                    "the log does not continue (it holds %d to the claim at %d); replaying the "
                    "log instead", p, copy_at.offset, low, epoch)
        return None
    partition_state.drop(store, p)
    partition_state.set_position(store, p, Position(epoch, -1, epoch))    # unfinished, as a restore
    copied = partition_state.copy(standby, store, p)
    tail = Replay.resume(copy_at)
    steps = itertools.chain((s for offset, kind, value in reader.read(p, copy_at.offset + 1, epoch)
                             for s in tail.feed(offset, kind, value)), tail.end(base))
    cseq, n = partition_state.apply(store, p, steps)
    marked = partition_state.mark_dirty(store, p)
    writer.positions[p] = Position(epoch, cseq if cseq >= 0 else copy_at.cseq, epoch)
    partition_state.set_position(store, p, writer.positions[p])      # now it is whole
    log.info("change log: promoted the standby copy of partition %d (%d keys copied, %d changes "
             "replayed after it, commit %d, %d nodes to re-encode)", p, copied, n,
             writer.positions[p].cseq, marked)
    return "promoted", n


def _settle_owned(store: GraphStore, writer: ChangelogWriter, reader: LogReader, p: int,
                  pos: Position | None, epoch: int,
                  standby: GraphStore | None = None) -> tuple[str, int]:
    """Keep, promote, restore or enter the state of a partition just claimed at `epoch`,
    whose local position was `pos`: (what, ops replayed)."""
    if pos is not None:
        if not _others_wrote(list(reader.read(p, pos.offset + 1, epoch)), pos.epoch):
            writer.positions[p] = Position(epoch, pos.cseq, epoch)
            partition_state.set_position(store, p, writer.positions[p])
            return "kept", 0
        log.warning("change log: partition %d changed owner since this store held it; "
                    "replaying the log", p)
    if standby is not None:
        done = _promote(store, standby, writer, reader, p, pos.cseq if pos is not None else None, epoch)
        if done is not None:
            return done
    start = newest_snapshot(reader, p, epoch)
    records = reader.read(p, OFFSET_BEGINNING if start is None else start, epoch)
    first = next(records, None)
    if first is None:
        # a log without records: the state (if any) is this store's, from before the change
        # log was switched on; it enters the log as a snapshot
        writer.positions[p] = Position(epoch, 0, epoch)
        partition_state.set_position(store, p, writer.positions[p])
        if partition_state.has_state(store, p):
            writer.snapshot(p)
            return "bootstrapped", 0
        return "empty", 0
    steps = replay(itertools.chain([first], records), pos.cseq if pos is not None else None)
    partition_state.drop(store, p)
    # while the replay runs the partition is marked unfinished: a crash leaves it to be
    # replayed again (if owned) or dropped (if not), never kept half-restored
    partition_state.set_position(store, p, Position(epoch, -1, epoch))
    cseq, n = partition_state.apply(store, p, steps)
    marked = partition_state.mark_dirty(store, p)
    writer.positions[p] = Position(epoch, max(cseq, 0), epoch)
    partition_state.set_position(store, p, writer.positions[p])      # now it is whole
    log.info("change log: restored partition %d (%d changes, commit %d, %d nodes to re-encode)",
             p, n, cseq, marked)
    return "restored", n
