"""What one worker process holds: the store, its writer, the ingest loop and their health.

Kept apart from the faust app so the hot path runs (and is tested) without faust.
"""
from __future__ import annotations

import gc
import logging
import threading
import time

from hirflow.state.events import Validator
from hirflow.state.graph import GraphStore
from hirflow.state.writer import GraphWriter
from hirflow.streams.scaleout import standby
from hirflow.streams.scaleout.changelog import ChangelogWriter, settle
from hirflow.streams.config import HirflowConfig
from hirflow.streams.ingest.loop import IngestLoop, owned_partitions
from hirflow.streams.ingest.knowledge import EntityApplier
from hirflow.streams.metrics import (DIRTY_NODES, PARTITIONS_OWNED, PROMOTED_PARTITIONS,
                                     RESTORED_CHANGES, SETTLE_SECONDS, STATE_BYTES)
from hirflow.streams.ingest.topic_identity import check_topic_identity
from hirflow.streams.topics import Topics

log = logging.getLogger(__name__)

# ready once no record came for this long: one empty consume call is not enough, since a
# call waits only `ingest.batch_wait_ms` and may come back empty between two fetches of a
# backlog the consumer is still reading
CAUGHT_UP_QUIET_S = 0.05


def tune_gc() -> None:
    """Fewer cyclic-GC passes: the worker allocates many short-lived objects per event, and
    each young-generation pass costs more than it frees here (measured in bench/ingest.py)."""
    gc.set_threshold(100_000, 50, 100)


def freeze_startup_objects() -> None:
    """Move what start-up allocated (torch and its modules, the model, the index) out of the
    cyclic GC's reach: it lives as long as the process, and every full collection would
    otherwise walk it (measured in bench/freshness.py: a 0.7 s full collection in the worker)."""
    gc.collect()
    gc.freeze()


class WorkerRuntime:
    def __init__(self, cfg: HirflowConfig) -> None:
        tune_gc()
        self.cfg = cfg
        self.topics = Topics(cfg.kafka.topic_prefix)
        self.store = GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions,
                                sync_writes=cfg.graph.sync_writes)
        self.owned = frozenset(owned_partitions(cfg))
        PARTITIONS_OWNED.set(len(self.owned))
        self.changelog: ChangelogWriter | None = None
        self.standby_store = None
        self.standby: standby.StandbyFollower | None = None
        try:
            if not cfg.worker.changelog:
                self.store.claim_worker(cfg.worker.count, cfg.worker.index)
            keyed = [self.topics.engagements, self.topics.reverse, self.topics.entities]
            check_topic_identity(self.store, cfg.kafka,
                                 keyed + ([self.topics.changelog] if cfg.worker.changelog else []))
            if cfg.worker.changelog:
                self._settle_partitions()          # the store is this worker's set only now
                self.store.claim_worker(cfg.worker.count, cfg.worker.index, movable=True)
        except Exception:
            self._close_standby()
            if self.changelog is not None:
                self.changelog.close()
            self.store.close()
            raise
        self.writer = GraphWriter(self.store, cfg.graph)
        self.validator = Validator(cfg.schema)
        self.stop = threading.Event()
        self.ingest: IngestLoop | None = None
        self.last_beat = 0.0
        self.caught_up = False
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.entities = EntityApplier(self.store, self.writer, self.validator, self.owned, cfg.kafka,
                                      self.topics.dead_letter, cfg.worker.knowledge)
        self.refresh = None
        self.watcher = None
        self.query = None
        self.replan = None      # a new assignment plan (`streams.scaleout.plan`): stop, then start anew

    def _settle_partitions(self) -> None:
        """Claim the owned partitions in the change log, restore what this store lacks, drop
        what another worker owns now; from then on every commit goes through the log."""
        w = self.cfg.worker
        self.changelog = ChangelogWriter(self.cfg.kafka, self.store, self.topics.changelog,
                                         f"{w.index}/{w.count}", snapshot_every_s=w.changelog_snapshot_s)
        parts = self.cfg.kafka.partitions
        self.standby_store = standby.open_store(self.cfg.graph.path, self.cfg.schema, parts,
                                                w.standby_replicas)
        copies = standby.standby_partitions(w.index, w.count, w.standby_replicas, parts)
        done = settle(self.cfg.kafka, self.store, self.changelog, sorted(self.owned), parts,
                      standby=self.standby_store, standby_parts=copies)
        log.info("change log: %d partitions kept, %d promoted from standby copies (%d changes), "
                 "%d restored (%d changes), %d entered the log, %d dropped (%d kept as standby "
                 "copies), in %.1f s", len(done.kept), len(done.promoted), sum(done.promoted.values()),
                 len(done.restored), sum(done.restored.values()), len(done.bootstrapped),
                 len(done.dropped), len(done.handed), done.seconds)
        RESTORED_CHANGES.set(sum(done.restored.values()) + sum(done.promoted.values()))
        PROMOTED_PARTITIONS.set(len(done.promoted))
        SETTLE_SECONDS.set(done.seconds)
        self.store.attach_log(self.owned, self.changelog)
        if self.standby_store is not None and w.standby_replicas == 0:
            standby.remove_store(self.standby_store)
            self.standby_store = None
        elif self.standby_store is not None:
            self.standby = standby.StandbyFollower(self.cfg.kafka, self.standby_store,
                                                   self.topics.changelog, copies)
            self.standby.start()

    def standby_partitions(self) -> list[int]:
        """The partitions this worker keeps standby copies of (`/v1/status`)."""
        return list(self.standby.partitions) if self.standby is not None else []

    def _close_standby(self) -> None:
        if self.standby is not None:
            self.standby.close()
            self.standby = None
        if self.standby_store is not None:
            self.standby_store.close()
            self.standby_store = None

    # -- ingest thread --------------------------------------------------------------------
    def start_ingest(self) -> None:
        self.ingest = IngestLoop(self.cfg, self.writer, self.topics)
        self._thread = threading.Thread(target=self._run_ingest, name="hirflow-ingest", daemon=True)
        self._thread.start()

    def _run_ingest(self) -> None:
        try:
            last_records = last_snapshot_check = time.monotonic()
            while not self.stop.is_set():
                n = self.ingest.poll_once()
                self.last_beat = now = time.monotonic()
                if self.changelog is not None and now - last_snapshot_check >= 1.0:
                    last_snapshot_check = now
                    self.changelog.snapshot_due()
                if n:
                    last_records = now
                elif now - last_records >= CAUGHT_UP_QUIET_S:
                    self.caught_up = True
            self.ingest.flush()
        except BaseException as exc:   # surfaced by /health; the process must not hang silently
            self.error = exc
            log.exception("ingest loop failed; stopping the worker")
            self.stop.set()

    # -- refresh thread and checkpoint watcher --------------------------------------------
    def start_refresh(self) -> None:
        """Refresh loop + hot-swap watcher + query service (skipped when refresh.enabled is
        false, e.g. an ingest-only benchmark)."""
        if not self.cfg.refresh.enabled:
            return
        from hirflow.streams.hotswap.watch import CheckpointWatcher
        from hirflow.streams.api.query import QueryService
        from hirflow.streams.refresh.loop import RefreshLoop
        self.refresh = RefreshLoop(self.cfg, self.store, self.writer, self.topics)
        self.query = QueryService.of(self.refresh)
        freeze_startup_objects()
        self.refresh.start()
        self.watcher = CheckpointWatcher(self.cfg, self.refresh.request_swap)
        self.watcher.start()

    def stop_refresh(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        if self.refresh is not None:
            self.refresh.close()

    def stop_ingest(self, timeout: float = 30.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.ingest is not None:
            self.ingest.close()

    # -- health and gauges ----------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        if self.error is not None:
            return False, f"ingest failed: {self.error}"
        if self.entities.error is not None:
            return False, f"entity commit failed: {self.entities.error}"
        if self.watcher is not None and self.watcher.error is not None:
            return False, f"checkpoint watcher failed: {self.watcher.error}"
        if self._thread is None or not self._thread.is_alive():
            return False, "ingest thread not running"
        if time.monotonic() - self.last_beat > 60:
            return False, "ingest loop stalled for over 60 s"
        r = self.refresh
        if r is not None:
            if r.error is not None:
                return False, f"refresh failed: {r.error}"
            if time.monotonic() - r.last_beat > 120:
                return False, "refresh loop stalled for over 120 s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        ok, why = self.healthy()
        if not ok:
            return ok, why
        return (True, "ok") if self.caught_up else (False, "catching up")

    def update_gauges(self) -> None:
        DIRTY_NODES.set(len(self.writer.dirty))
        STATE_BYTES.set(self.store.reader.size_bytes())

    def close(self) -> None:
        self.stop_refresh()
        self.stop_ingest()
        self.entities.close()
        self._close_standby()
        if self.changelog is not None:
            self.changelog.close()
        self.store.close()
