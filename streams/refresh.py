"""The refresh loop: dirty nodes -> views -> encoder -> index records, postings, super-graph
-> token changes on `hirflow.token-changes`. Also runs hot swaps (`streams.hotswap` hands
it announcements), so every index write comes from this one thread and none can race.

Views are sampled a batch ahead, by default in a child process on a follower of the store
(`state.view_source`, `refresh.sample_process`): while this thread encodes and writes batch
k, the child samples batch k+1, which was claimed when k's views arrived, and packs it for
the model in use (`ServingModel.packer`). The child also returns the adjacencies of the
records it sampled from (`Sampled.edges`); the super-graph rows and the neighbour queue are
made from those, so this thread decodes no node record.

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

import functools
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from encoder.checkpoint import CheckpointError
from encoder.serving import ServingModel, default_device, set_cpu_threads
from state.edge_columns import EdgeColumns
from state.graph import GraphStore
from state.index import (ACTIVE_KEY, ANNOUNCE_PASS_KEY, BUILDING_KEY, IndexRecord, TokenIndex,
                         delete_outbox)
from state.memindex import MemoryIndex
from state.supergraph import SuperGraph
from state.view_source import LocalViews, Sampled, ViewProcess
from state.views import STUDENT
from state.writer import GraphWriter
from streams import changes, clients
from streams.config import HirflowConfig
from streams.metrics import (CHECKPOINTS_REFUSED, FRESHNESS, INDEX_GENERATION, INDEX_NODES,
                             INDEX_SWITCHES, MODEL_INFO, NEIGHBOR_BACKLOG, NODES_REFRESHED,
                             REFRESH_BATCH, REFRESH_SECONDS, SWAP_PROGRESS, TOKEN_CHANGES,
                             VIEW_SAMPLE_SECONDS, VIEW_WAIT_SECONDS)
from streams.topics import Topics

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


@dataclass
class _Build:
    """A generation being built for a new checkpoint."""
    gen: int
    model: ServingModel
    memory: MemoryIndex
    todo: list[str]
    done: int = 0
    started: float = field(default_factory=time.monotonic)


class RefreshLoop:
    def __init__(self, cfg: HirflowConfig, store: GraphStore, writer: GraphWriter,
                 topics: Topics, producer=None) -> None:
        self.cfg, self.rcfg = cfg, cfg.refresh
        self.store, self.writer, self.topics = store, writer, topics
        self.types = list(cfg.schema.all_node_types)
        self.index = TokenIndex(store)
        self.supergraph = SuperGraph(self.index)
        self.device = default_device() if self.rcfg.device == "auto" else self.rcfg.device
        if str(self.device) == "cpu":
            set_cpu_threads(self.rcfg.cpu_threads)
        self.producer = producer or clients.producer(cfg.kafka, **{"linger.ms": 1})
        self._delivery_errors: list[str] = []
        self._unacked: list[bytes] = []          # outbox keys produced, acks not yet checked
        self.swap_requests: deque[dict] = deque()
        self._neighbors: OrderedDict[str, int] = OrderedDict()
        self._budget, self._budget_t = 0.0, time.monotonic()
        self._swap_budget, self._swap_t = 0.0, time.monotonic()
        self.building: _Build | None = None
        self._announce: list[str] | None = None
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.last_beat = time.monotonic()
        self.refreshed = 0
        self._thread: threading.Thread | None = None
        self._ahead: _Batch | None = None
        self._open()
        if self.rcfg.sample_process:
            self.views = ViewProcess(store, cfg.schema, STUDENT, self.rcfg.seed)
        else:
            self.views = LocalViews(store, cfg.schema, STUDENT, self.rcfg.seed)

    # -- start-up -------------------------------------------------------------------------
    def _open(self) -> None:
        gen, model_id, path = self.index.active()
        model = None
        if path:
            model = self._load(path)
        elif self.rcfg.checkpoint:
            model = self._load(self.rcfg.checkpoint)
            if model is not None:
                b = self.index.batch()
                b.set_meta(ACTIVE_KEY, [gen, model.id, model.path])
                b.commit()
        self.active = model or ServingModel.cold_start(self.types)
        self.gen = gen
        self.memory = self._memory_for(gen, self.active)
        for rec in self.index.iter_records(gen):
            self.memory.upsert(rec.node, rec.emb, rec.tokens, rec.assign, rec.seq)
        self.memory.compact()
        building = self.index.building()
        if building is not None:                       # a swap was cut short: start it over
            log.info("resuming the hot swap to %s (generation %d) from the start", building[1], building[0])
            self.swap_requests.append({"id": building[1], "path": building[2]})
        pending = self.index.announce_pending()
        if pending is not None and pending == self.gen:
            self._announce = list(self.memory.ids)
        self._resend_outbox()
        self._gauges()
        log.info("serving %s (generation %d, %d nodes)", self.active.id, self.gen, len(self.memory))

    def _load(self, path: str) -> ServingModel | None:
        try:
            return ServingModel.from_checkpoint(path, self.device)
        except (CheckpointError, OSError, ValueError, KeyError) as exc:
            CHECKPOINTS_REFUSED.inc()
            log.error("refusing checkpoint %s: %s; keeping the model in use", path, exc)
            return None

    def _memory_for(self, gen: int, model: ServingModel) -> MemoryIndex:
        return MemoryIndex(gen, model.id, model.d, model.m, model.levels, self.types,
                           nbits=model.nbits, codebooks=model.codebooks,
                           prototypes=model.prototypes(), centres=model.type_centres())

    def _resend_outbox(self) -> None:
        pending = list(self.index.outbox())
        if pending:
            log.info("re-sending %d token changes that were not acknowledged before a restart", len(pending))
            self._send([(k, v, None) for k, v in pending])
            self._confirm_sent()

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
        try:
            self._confirm_sent()
        except RuntimeError as exc:
            log.warning("%s; they are sent again on restart", exc)
        self.views.close()

    @property
    def idle(self) -> bool:
        """Nothing dirty, queued, sampled ahead or being swapped."""
        return not self.writer.dirty and not self._neighbors and self._ahead is None \
            and self.building is None and not self._announce and not self.swap_requests \
            and not self._unacked

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
                self.writer.unclaim(cur.claimed)
                self._give_back_ahead()
                raise
            done = len(cur.nodes)
        else:
            self._confirm_sent()
        if self.swap_requests and self.building is None:
            self._start_swap(self.swap_requests.pop())
            self.swap_requests.clear()
        if self.building is not None:
            self._build_step()
        elif self._announce:
            self._announce_step()
        return done

    def _next_batch(self, wait: bool) -> _Batch | None:
        """Claim dirty nodes (+ budgeted neighbours) and submit them for sampling; `wait`:
        when there is no work at all, wait up to `batch_wait_ms` for the next ingest commit."""
        claimed = self.writer.claim_dirty(self.rcfg.batch_max)
        if wait and not claimed and not self._neighbors and self.building is None \
                and not self._announce and not self.swap_requests:
            with self.writer.committed:                # wait for the next ingest commit
                self.writer.committed.wait(self.rcfg.batch_wait_ms / 1000)
            claimed = self.writer.claim_dirty(self.rcfg.batch_max)
        nodes = dict(claimed)
        for n in claimed:             # refreshed now anyway: its neighbour request is served
            self._neighbors.pop(n, None)   # too; the change carries the node's own event time
        # neighbours never fill a batch: the endpoints that arrive while it runs wait for it
        room = min(self.rcfg.batch_max - len(nodes), self.rcfg.neighbor_batch_max)
        for n, ts in self._take_neighbors(room):
            nodes.setdefault(n, ts)
        if not nodes:
            return None
        return _Batch(claimed, nodes, self.views.submit(list(nodes), now_ms(), self.active.packer))

    def _give_back_ahead(self) -> None:
        if self._ahead is not None:
            self.writer.unclaim(self._ahead.claimed)
            self._ahead = None

    # -- refresh --------------------------------------------------------------------------
    def refresh(self, nodes: dict[str, int], claimed: dict[str, int],
                sampled: Sampled | None = None) -> None:
        """Encode `nodes` (their views: `sampled`, else sampled now) and commit them; the
        dirty markers of `claimed` nodes not dirtied again meanwhile go in the same batch."""
        t0 = time.perf_counter()
        ids = list(nodes)
        sampled = sampled or self.views.sample(ids, now_ms(), self.active.packer)
        VIEW_SAMPLE_SECONDS.observe(sampled.seconds)
        ts = now_ms()
        batch = self.index.batch()
        out = self._write(batch, self.gen, self.active, self.memory, ids, sampled,
                          nodes, ts, publish=True)
        build = self.building
        built = None
        if build is not None:
            built = self._write(batch, build.gen, build.model, build.memory, ids, sampled,
                                nodes, ts, publish=False)
        ahead = self._ahead.claimed if self._ahead is not None else {}
        with self.writer.lock:
            batch.clear_dirty([n for n in self.writer.settled(claimed) if n not in ahead])
            batch.commit()
        self._apply_memory(out, self.memory)
        if build is not None:
            self._apply_memory(built, build.memory)
        moved = [i for i, (_, change) in enumerate(out) if change is not None]
        self._queue_neighbors(moved, sampled.edges, nodes)
        self._send([(self._outbox_key(c), changes.encode(c), c) for _, c in out if c is not None])
        self.refreshed += len(ids)
        NODES_REFRESHED.labels("dirty").inc(len(claimed))
        NODES_REFRESHED.labels("neighbor").inc(len(ids) - len(claimed))
        REFRESH_BATCH.observe(len(ids))
        REFRESH_SECONDS.observe(time.perf_counter() - t0)
        self._gauges()

    def _write(self, batch, gen, model: ServingModel, memory: MemoryIndex, ids,
               sampled: Sampled, event_ts, ts, publish: bool):
        """Encode with `model` and put records (+ changes when `publish`) into `batch`."""
        if sampled.edges is None or sampled.edges.nodes != tuple(ids):
            raise RuntimeError("the sampled adjacencies are not those of the batch's nodes")
        emb, assign, tokens = model.encode(sampled.views, sampled.knowledge, sampled.prepared)
        olds = self.index.records(gen, ids)
        pubs = self.index.published(ids) if publish else [None] * len(ids)
        out = []
        for i, n in enumerate(ids):
            old, pub = olds[i], pubs[i]
            seq = pub[0] if pub is not None else (old.seq if old is not None else 0)
            change = None
            if publish:
                change = changes.diff(n, model.id, seq + 1, tokens[i], assign[i], pub,
                                      event_ts[n], ts)
                if change is not None:
                    seq += 1
                    batch.publish(n, seq, model.id, change.tokens, change.assign, changes.encode(change))
            rec = IndexRecord(n, model.id, seq, emb[i], tuple(int(t) for t in tokens[i]),
                              tuple(int(a) for a in assign[i]), event_ts[n], ts)
            batch.put_record(gen, rec, old)
            out.append((rec, change))
        if model.encoder is not None:                  # primitives exist only with a checkpoint
            mine = {rec.node: rec.assign for rec, _ in out}

            def assignments(names: list[str]):
                """Each neighbour's: this batch's own, else the index's (one gather)."""
                a = memory.assignments(names)
                for j, n in enumerate(names):
                    if (own := mine.get(n)) is not None:
                        a[j] = own
                return a
            self.supergraph.update(batch, gen, sampled.edges, assign, assignments)
        return out

    @staticmethod
    def _apply_memory(out, memory: MemoryIndex) -> None:
        for rec, _ in out:
            memory.upsert(rec.node, rec.emb, rec.tokens, rec.assign, rec.seq)

    def _outbox_key(self, c: changes.TokenChange) -> bytes:
        return self.store.keys.key(c.node) + c.seq.to_bytes(8, "big")

    # -- neighbours within a rate budget --------------------------------------------------
    def _queue_neighbors(self, moved: list[int], edges: EdgeColumns, event_ts) -> None:
        """Queue the heaviest neighbours of nodes whose tokens moved (their indices in
        `edges`). Nodes of this batch and of the one sampled ahead are skipped: their views
        were sampled after the event, so they already see it."""
        k = self.rcfg.neighbors_per_node
        if not k or not self.rcfg.neighbor_rate:
            return
        ahead = self._ahead.nodes if self._ahead is not None else {}
        for i in moved:
            n = edges.nodes[i]
            for nbr in edges.heaviest(i, k):
                if nbr not in self._neighbors and nbr not in event_ts and nbr not in ahead:
                    self._neighbors[nbr] = event_ts[n]
        while len(self._neighbors) > 100_000:          # bounded: oldest requests go first
            self._neighbors.popitem(last=False)
        NEIGHBOR_BACKLOG.set(len(self._neighbors))

    def _take_neighbors(self, room: int) -> list[tuple[str, int]]:
        t = time.monotonic()
        rate = self.rcfg.neighbor_rate
        self._budget = min(rate, self._budget + (t - self._budget_t) * rate)   # 1 s burst
        self._budget_t = t
        take = min(room, int(self._budget), len(self._neighbors))
        out = [self._neighbors.popitem(last=False) for _ in range(max(0, take))]
        self._budget -= len(out)
        NEIGHBOR_BACKLOG.set(len(self._neighbors))
        return out

    # -- emitting -------------------------------------------------------------------------
    def _on_delivery(self, event_ts: int | None, produced_ms: int, err, msg) -> None:
        if err is not None:
            self._delivery_errors.append(str(err))
        elif event_ts is not None:     # from an event: event -> acknowledged by the broker
            acked = produced_ms + 1000 * (msg.latency() or 0.0)
            FRESHNESS.observe(max(0.0, acked - event_ts) / 1000)

    def _send(self, items: list[tuple[bytes, bytes, changes.TokenChange | None]],
              fresh: bool = True) -> None:
        """Produce; the acks are checked, and the outbox entries dropped, by `_confirm_sent`
        before the next send (one batch later: the wait no longer holds the loop) or when
        idle. `fresh`: the changes come from events, so their latency counts in the
        freshness histogram."""
        if not items:
            return
        self._confirm_sent()
        topic, t = self.topics.token_changes, now_ms()
        for key, value, c in items:
            node = (c or changes.decode(value)).node
            ets = c.event_ts if fresh and c is not None else None
            clients.produce_blocking(self.producer, topic, value, key=node.encode(),
                                     on_delivery=functools.partial(self._on_delivery, ets, t))
        self._unacked += [k for k, _, _ in items]

    def _confirm_sent(self) -> None:
        """Wait for the acks of what was produced, then drop those outbox entries."""
        if not self._unacked:
            return
        if self.producer.flush(30) or self._delivery_errors:
            errs, self._delivery_errors = self._delivery_errors, []
            raise RuntimeError(f"token changes were not acknowledged: {errs[:3]}")
        delete_outbox(self.index, self._unacked)
        TOKEN_CHANGES.inc(len(self._unacked))
        self._unacked = []

    # -- hot swap -------------------------------------------------------------------------
    def request_swap(self, announcement: dict) -> None:
        """Called by the checkpoint watcher (another thread); acted on by this loop."""
        self.swap_requests.append(announcement)

    def _start_swap(self, ann: dict) -> None:
        ck_id, path = ann.get("id"), ann.get("path")
        if ck_id == self.active.id and self.index.building() is None:
            return
        model = self._load(path)
        if model is None:
            b = self.index.batch()
            b.set_meta(BUILDING_KEY, None)
            b.commit()
            return
        if ck_id and model.id != ck_id:
            CHECKPOINTS_REFUSED.inc()
            log.error("refusing checkpoint %s: announced as %s but its content id is %s",
                      path, ck_id, model.id)
            return
        gen = (self.gen + 1) & 0xFFFF
        self.index.clear_generation(gen)
        self.supergraph.clear_generation(gen)
        b = self.index.batch()
        b.set_meta(BUILDING_KEY, [gen, model.id, model.path])
        b.commit()
        todo = sorted(set(self.memory.ids) | set(self.store.reader.node_ids()))
        self.building = _Build(gen, model, self._memory_for(gen, model), todo)
        self._swap_budget, self._swap_t = 0.0, time.monotonic()
        SWAP_PROGRESS.set(0.0)
        log.info("hot swap to %s started: re-encoding %d nodes into generation %d",
                 model.id, len(todo), gen)

    def _build_step(self) -> None:
        b = self.building
        t = time.monotonic()
        rate = self.rcfg.swap_rate
        self._swap_budget = min(rate, self._swap_budget + (t - self._swap_t) * rate)
        self._swap_t = t
        n = min(self.rcfg.batch_max, int(self._swap_budget), len(b.todo) - b.done)
        if n > 0:
            ids = b.todo[b.done:b.done + n]
            ts = now_ms()
            sampled = self.views.sample(ids, ts, b.model.packer)
            olds = {r.node: r for r in self.index.records(self.gen, ids) if r is not None}
            event_ts = {i: (olds[i].event_ts if i in olds else ts) for i in ids}
            batch = self.index.batch()
            out = self._write(batch, b.gen, b.model, b.memory, ids, sampled,
                              event_ts, ts, publish=False)
            batch.commit()
            self._apply_memory(out, b.memory)
            b.done += n
            self._swap_budget -= n
            NODES_REFRESHED.labels("hot_swap").inc(n)
        SWAP_PROGRESS.set(b.done / max(1, len(b.todo)))
        if b.done >= len(b.todo):
            self._switch()

    def _switch(self) -> None:
        """Flip the serving generation in one write, then announce the new tokens."""
        b, old_gen, old_model = self.building, self.gen, self.active.id
        batch = self.index.batch()
        batch.set_meta(ACTIVE_KEY, [b.gen, b.model.id, b.model.path])
        batch.set_meta(BUILDING_KEY, None)
        batch.set_meta(ANNOUNCE_PASS_KEY, b.gen)
        batch.commit()
        b.memory.compact()
        self.active, self.gen, self.memory = b.model, b.gen, b.memory
        self.building = None
        self._announce = list(b.memory.ids)
        INDEX_SWITCHES.inc()
        try:
            MODEL_INFO.remove(old_model)
        except KeyError:
            pass
        self.index.clear_generation(old_gen)
        self.supergraph.clear_generation(old_gen)
        log.info("switched to %s: generation %d serving %d nodes (hot swap took %.1fs)",
                 b.model.id, b.gen, len(b.memory), time.monotonic() - b.started)
        self._gauges()

    def _announce_step(self) -> None:
        """Token changes for the new model, a micro-batch at a time (idempotent: nodes whose
        published model already matches are skipped, so a restart can run it again)."""
        ids, self._announce = self._announce[:self.rcfg.batch_max], self._announce[self.rcfg.batch_max:]
        recs = self.index.records(self.gen, ids)
        pubs = self.index.published(ids)
        ts = now_ms()
        batch = self.index.batch()
        out = []
        for rec, pub in zip(recs, pubs):
            if rec is None:
                continue
            seq = pub[0] if pub is not None else rec.seq
            c = changes.diff(rec.node, rec.model, seq + 1, rec.tokens, rec.assign, pub, ts, ts)
            if c is None:
                continue
            batch.publish(rec.node, c.seq, rec.model, c.tokens, c.assign, changes.encode(c))
            new = IndexRecord(rec.node, rec.model, c.seq, rec.emb, rec.tokens, rec.assign,
                              rec.event_ts, rec.ts)
            batch.put_record(self.gen, new, rec)
            self.memory.seq[self.memory.row(rec.node)] = c.seq
            out.append(c)
        if not self._announce:
            batch.set_meta(ANNOUNCE_PASS_KEY, None)
        batch.commit()
        self._send([(self._outbox_key(c), changes.encode(c), c) for c in out], fresh=False)

    # -- health and gauges ----------------------------------------------------------------
    def _gauges(self) -> None:
        INDEX_NODES.set(len(self.memory))
        INDEX_GENERATION.set(self.gen)
        MODEL_INFO.labels(self.active.id).set(1)
        if self.building is None:
            SWAP_PROGRESS.set(1.0)

    def status(self) -> dict:
        b = self.building
        return {"model": self.active.id, "generation": self.gen, "index_nodes": len(self.memory),
                "dirty_backlog": len(self.writer.dirty), "neighbor_backlog": len(self._neighbors),
                "refreshed": self.refreshed,
                "hot_swap": None if b is None else {"model": b.model.id, "generation": b.gen,
                                                    "done": b.done, "total": len(b.todo)}}

