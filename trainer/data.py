"""Training data, time-honest: events up to a strict cutoff, chronological windows, batches
shuffled only inside fixed time chunks.

Reading a topic up to the cutoff does not trust the watermark alone (the embedded broker
reports it short): a partition is finished when it delivers a record stamped after the
cutoff (+ allowed lateness), or when it has been idle for `idle_s` with its position at or
past the reported high watermark. Time ranges start with `offsets_for_times` where the
broker supports it; every record is also filtered by its event time, which covers brokers
(tansu) that answer the earliest offset. hirflow's producers stamp Kafka timestamps with
event time, so both agree.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from hirflow.state.events import Engagement, Entity, EventError, Validator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadStats:
    records: int
    used: int
    after_cutoff: int
    before_start: int
    invalid: int


def read_topic(conf: dict, topic: str, validator: Validator, cutoff_ms: int,
               start_ms: int | None = None, entities: bool = False, idle_s: float = 3.0,
               lateness_ms: int = 0, timeout_s: float = 600.0,
               stats_out: list | None = None) -> Iterator[Engagement | Entity]:
    """Yield valid events of `topic` with start_ms <= ts <= cutoff_ms, partition by partition
    as they arrive. `conf` holds librdkafka settings (bootstrap.servers, security)."""
    c = Consumer({**conf, "group.id": f"hirflow-trainer-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False})
    try:
        parts = _assign_from(c, topic, start_ms)
        open_parts = set(parts)
        last_seen = {p: time.monotonic() for p in parts}
        counts = dict(records=0, used=0, after_cutoff=0, before_start=0, invalid=0)
        decode = validator.decode_entity if entities else validator.decode_engagement
        deadline = time.monotonic() + timeout_s
        while open_parts:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(open_parts)} not read to the cutoff in {timeout_s}s")
            msgs = c.consume(5000, timeout=0.2)
            now = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    continue
                p = m.partition()
                if p not in open_parts:
                    continue
                last_seen[p] = now
                counts["records"] += 1
                kts = m.timestamp()[1]
                if kts > cutoff_ms + lateness_ms:      # stamped after the cutoff: done
                    open_parts.discard(p)
                    c.pause([TopicPartition(topic, p)])
                try:
                    ev = decode(m.value())
                except EventError:
                    counts["invalid"] += 1
                    continue
                if ev.ts > cutoff_ms:
                    counts["after_cutoff"] += 1
                elif start_ms is not None and ev.ts < start_ms:
                    counts["before_start"] += 1
                else:
                    counts["used"] += 1
                    yield ev
            open_parts -= _idle_at_end(c, topic, [p for p in open_parts if now - last_seen[p] >= idle_s])
        if stats_out is not None:
            stats_out.append(ReadStats(**counts))
        log.info("read %s up to %d: %s", topic, cutoff_ms, counts)
    finally:
        c.close()


def _assign_from(c: Consumer, topic: str, start_ms: int | None) -> list[int]:
    """Assign every partition of `topic` from its first record at or after `start_ms` (from
    its beginning when None, or when no record is that late); -> the partitions."""
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    tps = [TopicPartition(topic, p, start_ms if start_ms is not None else OFFSET_BEGINNING)
           for p in parts]
    if start_ms is not None:
        tps = [tp if tp.offset >= 0 else TopicPartition(topic, tp.partition, OFFSET_BEGINNING)
               for tp in c.offsets_for_times(tps, timeout=10)]
    c.assign(tps)
    return parts


def _idle_at_end(c: Consumer, topic: str, idle: list[int]) -> set[int]:
    """Of the idle partitions, those read to their high watermark (the hinted end)."""
    done = set()
    for p in idle:
        pos = c.position([TopicPartition(topic, p)])[0].offset
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
        if pos < 0 or pos >= high:
            done.add(p)
    return done


@dataclass(frozen=True)
class Windows:
    """Consecutive time windows [start, train_end) [train_end, val_end) [val_end, end]."""
    start: int
    train_end: int
    val_end: int
    end: int

    def which(self, ts: int) -> str:
        return "train" if ts < self.train_end else "val" if ts < self.val_end else "test"


def chronological_windows(timestamps: Sequence[int], train: float = 0.7, val: float = 0.1) -> Windows:
    """Windows by time taken from the data: training ends at the time by which the first
    `train` share of the events happened, validation after the next `val` share, the rest is
    for testing. Cutting at time quantiles rather than at shares of the span keeps a few
    outlying timestamps (real logs have them: Taobao's carry months-early stamps) from
    leaving one window nearly empty."""
    if not 0 < train < 1 or not 0 <= val < 1 - train:
        raise ValueError(f"need 0 < train < 1 and 0 <= val < 1 - train, got {train}, {val}")
    ts = np.sort(np.asarray(timestamps, np.int64))
    if len(ts) == 0:
        raise ValueError("no timestamps to take windows from")
    lo, hi = int(ts[0]), int(ts[-1])
    cut = np.quantile(ts, [train, train + val], method="higher")
    train_end = max(lo + 1, int(cut[0]))
    val_end = max(train_end, int(cut[1]))
    return Windows(lo, train_end, val_end, hi)


def split(events: Iterable[Engagement], windows: Windows) -> dict[str, list[Engagement]]:
    out: dict[str, list[Engagement]] = {"train": [], "val": [], "test": []}
    for e in events:
        out[windows.which(e.ts)].append(e)
    return out


def world_knowledge(entities: Iterable[Entity], cutoff_ms: int, encode) -> dict[str, np.ndarray]:
    """node -> world-knowledge vector of its newest text up to the cutoff, as the knowledge
    agent stores it for serving (so training sees what serving will). `encode` maps a list
    of texts to (n, dim) vectors (`encoder.knowledge.TextEncoder.encode`)."""
    newest: dict[str, Entity] = {}
    for e in entities:
        if e.ts <= cutoff_ms and e.text and (e.node not in newest or e.ts >= newest[e.node].ts):
            newest[e.node] = e
    nodes = sorted(newest)
    if not nodes:
        return {}
    vecs = encode([newest[n].text for n in nodes])
    return dict(zip(nodes, np.asarray(vecs, np.float32)))
