"""The refresh loop: dirty nodes -> views -> encoder -> index records, postings, super-graph
-> token changes on `hirflow.token-changes`. Also runs hot swaps (`streams.hotswap.watch` hands
it announcements), so every index write comes from this one thread and none can race.

This module is the orchestrator; its parts each own one job: `GenerationWriter` (encode and
stage records), `TokenOutbox` (produce and confirm token changes), `NeighborQueue`
(neighbours to refresh within a rate budget) and the forwarder of other workers' neighbours,
`HotSwapBuild` (build, switch, announce), `ServingSnapshot` (what queries read, and what a
worker starts with) and `refresh_metrics` (its Prometheus figures).

Views are sampled a batch ahead, by default in child processes on followers of the store
(`state.view_source`, `state.view_pool`, `refresh.sample_process` and `sample_processes`:
each child samples a consecutive part of every batch): while this thread encodes and writes
batch k, the children sample batch k+1, which was claimed when k's views arrived, and pack
it for the model in use (`ServingModel.packer`). The children also return the adjacencies
of the records they sampled from (`Sampled.edges`); the super-graph rows and the neighbour
queue are made from those, so this thread decodes no node record.

Crash safety, in order:
1. claim durable dirty nodes (`GraphWriter.claim_dirty`), encode them;
2. one RocksDB batch: records + postings + super-graph rows of the active generation (and
   of the generation being built, during a swap), the published (seq, tokens) per node,
   the token changes in the outbox, and the deletion of the dirty markers of nodes not
   touched again meanwhile;
3. produce the outbox to Kafka; wait for the acks and delete the outbox entries before the
   next batch is produced (the wait overlaps that batch's encoding) or when idle.
A crash before 2 leaves the markers (refreshed again on restart); after 2 the outbox is
sent again on restart, with the same seq and content, never a different one. A node claimed
again by the batch being sampled ahead keeps its marker until that batch commits.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from hirflow.encoder.serving import ServingModel, default_device, set_cpu_threads
from hirflow.state.graph import GraphStore
from hirflow.state.index import TokenIndex
from hirflow.state.supergraph import SuperGraph
from hirflow.state.view_pool import ViewPool
from hirflow.state.view_source import LocalViews, Sampled
from hirflow.state.views import STUDENT
from hirflow.state.writer import GraphWriter
from hirflow.streams import clients
from hirflow.streams.config import HirflowConfig
from hirflow.streams.worker.cores import default_sample_processes
from hirflow.streams.refresh.generation_writer import GenerationWriter
from hirflow.streams.hotswap.build import HotSwapBuild
from hirflow.streams.metrics import CHECKPOINTS_REFUSED, VIEW_WAIT_SECONDS
from hirflow.streams.refresh.neighbor_forward import NeighborInbox, neighbor_forwarder
from hirflow.streams.refresh.neighbor_queue import NeighborQueue
from hirflow.streams.scaleout.peer_reads import PeerRecords
from hirflow.streams.scaleout.routing import owner_of
from hirflow.streams.refresh.refresh_metrics import count_refreshed, count_sampled, serving_gauges
from hirflow.streams.refresh.serving_snapshot import ServingSnapshot, open_serving
from hirflow.streams.refresh.token_outbox import TokenOutbox
from hirflow.streams.topics import Topics
from hirflow.trainer.announcement import Announcement

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class _Batch:
    """A micro-batch whose views are being sampled: `claimed` dirty nodes (-> their oldest
    event) and `nodes`, those plus the neighbours taken with them."""
    claimed: dict[str, int]
    nodes: dict[str, int]
    ticket: int


def view_source(cfg: HirflowConfig, store: GraphStore, peers: PeerRecords | None
                ) -> ViewPool | LocalViews:
    """Where the loop's student views are sampled: child processes on followers of the store
    (`refresh.sample_process`), or this process; other workers' nodes read from `peers`."""
    routed = {"peers": peers, "peer_ttl_s": cfg.worker.peer_cache_s}
    if cfg.refresh.sample_process:
        processes = cfg.refresh.sample_processes or default_sample_processes()
        return ViewPool(store, cfg.schema, STUDENT, cfg.refresh.seed, processes, **routed)
    return LocalViews(store, cfg.schema, STUDENT, cfg.refresh.seed, **routed)


class RefreshLoop:
    def __init__(self, cfg: HirflowConfig, store: GraphStore, writer: GraphWriter,
                 topics: Topics) -> None:
        self.cfg, self.rcfg = cfg, cfg.refresh
        self.store, self.writer, self.topics = store, writer, topics
        self.types = list(cfg.schema.all_node_types)
        self.index = TokenIndex(store)
        self.supergraph = SuperGraph(self.index)
        self.device = default_device() if self.rcfg.device == "auto" else self.rcfg.device
        if str(self.device) == "cpu":
            set_cpu_threads(self.rcfg.cpu_threads)
        self.outbox = TokenOutbox(self.index, store.keys,
                                  lambda: clients.producer(cfg.kafka, **{"linger.ms": 1}),
                                  topics.token_changes)
        w, partitions = cfg.worker, cfg.kafka.partitions
        self.owns = None if w.count == 1 else (lambda n: owner_of(n, partitions, w.count) == w.index)
        self.neighbors = NeighborQueue(self.rcfg.neighbors_per_node, self.rcfg.neighbor_rate, self.owns)
        self.generations = GenerationWriter(self.index, self.supergraph)
        # with several workers, views read other workers' nodes from their owners, and
        # neighbour refreshes of their nodes are asked of them
        self.peers = PeerRecords.of(cfg)
        self.inbox = NeighborInbox()
        self.forward = neighbor_forwarder(self.peers, w.count)
        self.views = view_source(cfg, store, self.peers)
        self.swap = HotSwapBuild(self.rcfg, store, self.index, self.supergraph, self.views,
                                 self.generations, self.outbox, self._load, self.types)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.last_beat = time.monotonic()
        self.refreshed = 0
        self._thread: threading.Thread | None = None
        self._ahead: _Batch | None = None
        self.serving = self._open()

    # -- start-up -------------------------------------------------------------------------
    def _open(self) -> ServingSnapshot:
        serving = open_serving(self.index, self.types, self._load, self.rcfg.checkpoint)
        self.swap.resume(serving)
        self.outbox.resend_pending()
        self._gauges(serving)
        log.info("serving %s (generation %d, %d nodes)", serving.model.id, serving.gen,
                 len(serving.memory))
        return serving

    def _load(self, path: str) -> ServingModel | None:
        try:
            return ServingModel.from_checkpoint(path, self.device)
        except Exception as exc:        # whatever a checkpoint holds, the worker keeps serving
            CHECKPOINTS_REFUSED.inc()
            log.error("refusing checkpoint %s: %s; keeping the model in use", path, exc)
            return None

    # -- what other threads read ----------------------------------------------------------
    @property
    def active(self) -> ServingModel:
        return self.serving.model

    @property
    def gen(self) -> int:
        return self.serving.gen

    @property
    def memory(self):
        return self.serving.memory

    @property
    def building(self):
        return self.swap.building

    def request_swap(self, announcement: Announcement) -> None:
        """Called by the checkpoint watcher (another thread); acted on by this loop."""
        self.swap.request(announcement)

    # -- the loop -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hirflow-refresh", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.run_once()
                self.last_beat = time.monotonic()
        except BaseException as exc:
            self.error = exc
            log.exception("refresh loop failed; stopping the worker")
            self.stop.set()

    def close(self, timeout: float = 30.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._give_back_ahead()
        self.forward.close()
        self.outbox.confirm(replace=False)
        self.views.close()

    @property
    def idle(self) -> bool:
        """Nothing dirty, queued, sampled ahead, swapping or waiting for acks."""
        return not self.writer.dirty and not len(self.neighbors) and self._ahead is None \
            and not self.swap.busy and not self.outbox.unacknowledged

    def run_once(self) -> int:
        """One micro-batch of dirty nodes (+ budgeted neighbours), then a slice of swap work.
        Returns nodes refreshed."""
        cur, self._ahead = self._ahead or self._next_batch(wait=True), None
        done = 0
        if cur is not None:
            try:
                t = time.perf_counter()
                sampled = self.views.result(cur.ticket)
                VIEW_WAIT_SECONDS.observe(time.perf_counter() - t)
                self._ahead = self._next_batch(wait=False)   # sampled while `cur` encodes
                self.refresh(cur.nodes, cur.claimed, sampled)
            except BaseException:
                self.writer.dirty.unclaim(cur.claimed)
                self._give_back_ahead()
                raise
            done = len(cur.nodes)
        else:
            self.outbox.confirm()
        switched = self.swap.step(self.serving)
        if switched is not None:
            self.serving = switched                  # one assignment: readers see old or new
            self._gauges(switched)
        return done

    def _next_batch(self, wait: bool) -> _Batch | None:
        """Claim dirty nodes (+ budgeted neighbours) and submit them for sampling; `wait`:
        when there is no work at all, wait up to `batch_wait_ms` for the next ingest commit."""
        dirty = self.writer.dirty
        self.neighbors.add(self.inbox.drain())
        claimed = dirty.claim(self.rcfg.batch_max)
        if wait and not claimed and not len(self.neighbors) and not self.swap.busy:
            dirty.wait_for_commit(self.rcfg.batch_wait_ms / 1000)
            claimed = dirty.claim(self.rcfg.batch_max)
        nodes = dict(claimed)
        self.neighbors.served(claimed)
        # neighbours never fill a batch: the endpoints that arrive while it runs wait for it
        room = min(self.rcfg.batch_max - len(nodes), self.rcfg.neighbor_batch_max)
        for n, ts in self.neighbors.take(room):
            nodes.setdefault(n, ts)
        if not nodes:
            return None
        return _Batch(claimed, nodes, self.views.submit(list(nodes), now_ms(), self.active.packer))

    def _give_back_ahead(self) -> None:
        if self._ahead is not None:
            self.writer.dirty.unclaim(self._ahead.claimed)
            self._ahead = None

    # -- refresh --------------------------------------------------------------------------
    def refresh(self, nodes: dict[str, int], claimed: dict[str, int],
                sampled: Sampled | None = None) -> None:
        """Encode `nodes` (their views: `sampled`, else sampled now) and commit them; the
        dirty markers of `claimed` nodes not dirtied again meanwhile go in the same batch."""
        t0 = time.perf_counter()
        ids = list(nodes)
        serving, build = self.serving, self.swap.building
        sampled = sampled or self.views.sample(ids, now_ms(), serving.model.packer)
        count_sampled(sampled)
        ts = now_ms()
        batch = self.index.batch()
        out = self.generations.stage(batch, serving.gen, serving.model, serving.memory, ids,
                                     sampled, nodes, ts, publish=True)
        built = None
        if build is not None:          # a swap is building: its generation stays current too
            built = self.generations.stage(batch, build.gen, build.model, build.memory, ids,
                                           sampled, nodes, ts, publish=False)
        ahead = self._ahead.claimed if self._ahead is not None else {}

        def commit(settled: list[str]) -> None:
            batch.clear_dirty(settled)
            batch.commit()
        self.writer.dirty.clear_settled(claimed, ahead, commit)
        self.generations.apply(out, serving.memory)
        if build is not None:
            self.generations.apply(built, build.memory)
        moved = [i for i, (_, rec, change) in enumerate(out) if change is not None and rec is not None]
        self.neighbors.queue(moved, sampled.edges, nodes,
                             self._ahead.nodes if self._ahead is not None else {})
        self.forward.send(self.neighbors.take_foreign())
        self.outbox.send([c for _, _, c in out if c is not None])
        self.refreshed += len(ids)
        count_refreshed(len(claimed), len(ids), time.perf_counter() - t0)
        self._gauges(serving)

    # -- health and gauges ----------------------------------------------------------------
    def _gauges(self, serving: ServingSnapshot) -> None:
        serving_gauges(serving, swapping=self.swap.building is not None)

    def status(self) -> dict:
        serving = self.serving
        return {"model": serving.model.id, "model_quality": serving.model.quality,
                "generation": serving.gen,
                "index_nodes": len(serving.memory), "dirty_backlog": len(self.writer.dirty),
                "neighbor_backlog": len(self.neighbors), "refreshed": self.refreshed,
                "hot_swap": self.swap.status()}
