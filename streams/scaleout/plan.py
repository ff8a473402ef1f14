"""The assignment plan: how many workers share the partitions, changed while they run.

`hirflow scale N` appends the plan `{"count": N}` to `hirflow.plan` (one partition, kept).
A worker with the change log on reads the newest plan when it starts, and the plan's count
replaces `worker.count` (partition p is worker `p % count`'s, as always); without a plan,
`worker.count` stands. A worker whose index the plan leaves out waits, owning nothing, until
a plan includes it. While a worker runs, `PlanWatcher` follows the topic; a plan with
another count stops the worker gracefully (its ingest and refresh commit, as on SIGTERM)
and starts it again in the same process (`restart_in_place`: exec), so it settles its
partitions through the change log exactly as a restart with the new count does: it claims
and restores the partitions it gains (fencing their former owner) and drops those it loses.

During the switch the workers hold different counts for a few seconds: forwarded queries
and peer reads can miss (a retry after the switch answers), nothing that was committed is
lost and nothing is applied twice (the change log's claims and positions see to that).
A plan needs the change log: a worker without it refuses a plan whose count is not its own.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from hirflow.streams import clients
from hirflow.streams.config import HirflowConfig
from hirflow.streams.topics import Topics
from hirflow.streams.worker.waiting_page import waiting_page

log = logging.getLogger(__name__)

KEY = b"workers"


class PlanError(ValueError):
    """A plan this worker cannot follow."""


@dataclass(frozen=True)
class Plan:
    count: int          # workers sharing the partitions
    offset: int         # where it stands in the topic: a later plan has a larger offset

    @staticmethod
    def encode(count: int) -> bytes:
        return json.dumps({"count": count}).encode()

    @classmethod
    def decode(cls, raw: bytes | None, offset: int) -> "Plan":
        try:
            count = json.loads(raw or b"")["count"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"not a plan ({{\"count\": N}}): {exc}") from None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise PlanError(f"a plan's count is a whole number >= 1, got {count!r}")
        return cls(count, offset)


def _plan_consumer(cfg: HirflowConfig, **extra):
    """A consumer of the whole (small) plan topic from its start, in a group of its own."""
    consumer = clients.consumer(cfg.kafka, f"{cfg.worker.app_id}-plan-{uuid.uuid4().hex[:8]}", **extra)
    consumer.assign([TopicPartition(Topics(cfg.kafka.topic_prefix).plan, 0, OFFSET_BEGINNING)])
    return consumer


def _read(msgs, latest: Plan | None) -> Plan | None:
    """The newest good plan among `msgs` (a bad record is logged and skipped)."""
    for m in msgs:
        if m.error() is not None:
            if m.error().code() not in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                log.warning("plan topic: %s", m.error())
            continue
        try:
            latest = Plan.decode(m.value(), m.offset())
        except PlanError as exc:
            log.error("bad plan record at offset %d, skipped: %s", m.offset(), exc)
    return latest


def newest_plan(cfg: HirflowConfig, timeout: float = 30.0) -> Plan | None:
    """The newest plan in the topic, None when it holds none (or does not exist)."""
    topic = Topics(cfg.kafka.topic_prefix).plan
    consumer = _plan_consumer(cfg)
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        latest, deadline = None, time.monotonic() + timeout
        while hi > lo:
            msgs = consumer.consume(100, timeout=0.5)
            latest = _read(msgs, latest)
            if any(m.error() is None and m.offset() >= hi - 1 for m in msgs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: could not read to offset {hi} in {timeout:.0f} s")
        return latest
    finally:
        consumer.close()


def publish_plan(cfg: HirflowConfig, count: int) -> None:
    """Append the plan of `count` workers (1 to the partition count)."""
    if not 1 <= count <= cfg.kafka.partitions:
        raise PlanError(f"a plan of {count} workers: 1 to {cfg.kafka.partitions} (the partitions) "
                        f"can share the partitions")
    producer = clients.producer(cfg.kafka)
    clients.produce_blocking(producer, Topics(cfg.kafka.topic_prefix).plan, Plan.encode(count), key=KEY)
    if producer.flush(30) != 0:
        raise TimeoutError("the plan was not acknowledged by the broker in 30 s")


def follow_plan(cfg: HirflowConfig, poll_s: float = 2.0) -> HirflowConfig:
    """`cfg` with the newest plan's worker count; waits (polling every `poll_s`) while the
    plan leaves this worker's index out. Raises PlanError for a plan this worker cannot follow."""
    w = cfg.worker
    plan = newest_plan(cfg)
    if plan is None or plan.count == w.count:
        return cfg
    if not w.changelog:
        raise PlanError(f"the plan says {plan.count} workers, this worker is configured for "
                        f"{w.count}: following a plan moves partitions, which needs the change "
                        f"log (worker.changelog = true)")
    told = None
    with waiting_page(w.web_host, w.web_port):
        while w.index >= plan.count:
            if plan != told:
                log.info("worker %d is not in the plan of %d workers: waiting for one that "
                         "includes it", w.index, plan.count)
                told = plan
            time.sleep(poll_s)
            plan = newest_plan(cfg) or plan
    log.info("following the plan: %d workers (worker.count %d)", plan.count, w.count)
    return dataclasses.replace(cfg, worker=dataclasses.replace(w, count=plan.count))


class PlanWatcher:
    """Follows the plan topic in a thread; `on_change(plan)` once for the first plan whose
    count differs from `count` (the worker then restarts and watches anew)."""

    def __init__(self, cfg: HirflowConfig, count: int, on_change, poll_s: float = 1.0) -> None:
        self.cfg, self.count, self.on_change, self.poll_s = cfg, count, on_change, poll_s
        # long fetch waits: an idle consumer at the default 10 ms costs the embedded broker CPU
        self.consumer = _plan_consumer(cfg, **{"fetch.wait.max.ms": int(poll_s * 1000)})
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PlanWatcher":
        self._thread = threading.Thread(target=self._run, name="hirflow-plan", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        latest = None
        try:
            while not self.stop.is_set():
                msgs = self.consumer.consume(100, timeout=self.poll_s)
                latest = _read(msgs, latest)
                if not msgs and latest is not None and latest.count != self.count:
                    log.info("new plan at offset %d: %d workers (this worker runs with %d)",
                             latest.offset, latest.count, self.count)
                    self.on_change(latest)
                    return
        except Exception:           # a worker that cannot follow the plan keeps its partitions
            log.exception("plan watcher failed; the worker keeps its current plan")

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self.consumer.close()


def restart_in_place() -> None:
    """Replace this process with a fresh start of the same command (exec: same PID, so a
    container does not restart); its start reads the plan anew."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
