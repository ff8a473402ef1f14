"""A hot swap, run a slice at a time by the refresh thread: a new checkpoint's generation is
built beside the serving one, switched to in one write, and its token changes announced.

1. start: check and load the announced checkpoint (refused with a log line and a metric when
   `refusal` finds a reason, it does not load, or its content id differs from the announced
   one), mark the generation being built in RocksDB;
2. build: re-encode every node within `swap_rate` nodes per second, listed from the store a
   slice at a time (`NodeList`: a large graph is never listed at once), then the indexed
   nodes without a node record (entity-only); meanwhile the refresh of dirty nodes writes
   both generations (`RefreshLoop.refresh`), so none goes stale;
3. switch: one RocksDB write makes the new generation the serving one; the old is dropped;
4. announce: token changes for every node under the new model, a micro-batch at a time;
   idempotent (nodes whose published model already matches are skipped), so a restart can
   run it again.
A swap cut short by a restart starts over from step 1 (`resume`).
"""
from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hirflow.encoder.checkpoint import MANIFEST, sha256_file
from hirflow.encoder.serving import ServingModel
from hirflow.state.graph import GraphStore
from hirflow.state.index import (ACTIVE_KEY, ANNOUNCE_PASS_KEY, ANNOUNCED_TS_KEY, BUILDING_KEY, IndexRecord,
                                 TokenIndex)
from hirflow.state.memindex import MemoryIndex
from hirflow.state.supergraph import SuperGraph
from hirflow.streams import changes
from hirflow.streams.config import RefreshConfig
from hirflow.streams.refresh.generation_writer import GenerationWriter
from hirflow.streams.metrics import (CHECKPOINTS_REFUSED, INDEX_SWITCHES, MODEL_COLLAPSED, MODEL_INFO,
                                     NODES_REFRESHED, SWAP_PROGRESS)
from hirflow.streams.refresh.rate_budget import RateBudget
from hirflow.streams.refresh.serving_snapshot import ServingSnapshot, empty_memory
from hirflow.streams.refresh.token_outbox import TokenOutbox
from hirflow.trainer.announcement import Announcement

log = logging.getLogger(__name__)


class NodeList:
    """Every node to re-encode, a slice at a time: the store's node records in key order
    (resumed after the last key read, so no iterator is held between slices), then the
    nodes of the serving index that have no node record."""

    def __init__(self, store: GraphStore, indexed: list[str]) -> None:
        self.store, self.indexed = store, indexed
        self.after: bytes | None = None
        self.phase = 0                          # 0: node records, 1: indexed only, 2: done
        self.pos = 0

    def take(self, n: int) -> list[str]:
        if self.phase == 0:
            ids, self.after = self.store.reader.node_ids_after(self.after, n)
            if self.after is None:
                self.phase = 1
            if ids:
                return ids
        while self.phase == 1 and self.pos < len(self.indexed):
            chunk = self.indexed[self.pos:self.pos + n]
            self.pos += len(chunk)
            keys = [self.store.keys.key(i) for i in chunk]
            ids = [i for i, raw in zip(chunk, self.store.cf["nodes"].get(keys)) if raw is None]
            if ids:
                return ids
        self.phase = 2
        return []

    @property
    def exhausted(self) -> bool:
        return self.phase == 2


@dataclass
class Build:
    """A generation being built for a new checkpoint."""
    gen: int
    model: ServingModel
    memory: MemoryIndex
    nodes: NodeList
    total: int                               # estimate, for progress: nodes indexed at start
    done: int = 0
    started: float = field(default_factory=time.monotonic)


def _data_end(checkpoint: Path) -> int | None:
    """The last event time of a checkpoint's training data (its manifest), if it says."""
    try:
        window = json.loads((checkpoint / MANIFEST).read_text()).get("data_window")
        return int(window[1])
    except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError):
        return None


class HotSwapBuild:
    """Owned by the refresh thread; `request` is the one call other threads make."""

    def __init__(self, rcfg: RefreshConfig, store: GraphStore, index: TokenIndex,
                 supergraph: SuperGraph, views, writer: GenerationWriter, outbox: TokenOutbox,
                 load: Callable[[str], ServingModel | None], types: list[str]) -> None:
        self.rcfg, self.store, self.index, self.supergraph = rcfg, store, index, supergraph
        self.views, self.writer, self.outbox, self.load, self.types = views, writer, outbox, load, types
        self.requests: deque[Announcement] = deque()   # appended by the watcher's thread
        self.building: Build | None = None
        self._announce: list[str] = []
        self.budget = RateBudget(rcfg.swap_rate)
        self.last_ts = index.announced_ts()      # newest announcement acted on

    def request(self, announcement: Announcement) -> None:
        self.requests.append(announcement)

    def resume(self, serving: ServingSnapshot) -> None:
        """At start-up: a swap cut short starts over; an announce pass left unfinished runs."""
        building = self.index.building()
        if building is not None:
            log.info("resuming the hot swap to %s (generation %d) from the start",
                     building.model, building.gen)
            self.requests.append(Announcement(building.model, building.path))
        if self.index.announce_pending() == serving.gen:
            self._announce = serving.memory.live_ids()

    @property
    def busy(self) -> bool:
        return bool(self.requests) or self.building is not None or bool(self._announce)

    def step(self, serving: ServingSnapshot) -> ServingSnapshot | None:
        """One slice of swap work -> the new serving snapshot when this slice switched."""
        if self.requests and self.building is None:
            self._start(self.requests.pop(), serving)
            self.requests.clear()                # only the newest announcement matters
        if self.building is not None:
            return self._build_step(serving)
        if self._announce:
            self._announce_step(serving)
        return None

    def refusal(self, ann: Announcement, serving: ServingSnapshot) -> str | None:
        """Why an announcement must not be acted on, or None. Announcements come from
        whoever can write the topic: the path must lie under `refresh.checkpoints_root`
        (when set), the manifest must be the one announced, the announcement must be newer
        than the one the serving model came from (an older one, replayed, would roll back),
        and the checkpoint must not be trained on older data than the serving one unless
        `refresh.allow_rollback` is set."""
        root = self.rcfg.checkpoints_root
        path = Path(ann.path)
        if root and not path.resolve().is_relative_to(Path(root).resolve()):
            return f"{ann.path} is outside refresh.checkpoints_root {root}"
        if ann.ts and ann.ts < self.last_ts:     # equal: the same announcement, read again
            return f"announced at {ann.ts}, before the serving model's announcement ({self.last_ts})"
        if ann.sha256 is not None:
            try:
                actual = sha256_file(path / MANIFEST)
            except OSError as exc:
                return f"manifest unreadable: {exc}"
            if actual != ann.sha256:
                return "its manifest is not the one announced (sha256 differs)"
        new, old = _data_end(path), _data_end(Path(serving.model.path)) if serving.model.path else None
        if new is not None and old is not None and new < old and not self.rcfg.allow_rollback:
            return (f"trained on data up to {new}, older than the serving model's ({old}); "
                    f"set refresh.allow_rollback to roll back")
        return None

    def _start(self, ann: Announcement, serving: ServingSnapshot) -> None:
        ck_id, path = ann.id, ann.path
        if ck_id == serving.model.id and self.index.building() is None:
            return
        why = self.refusal(ann, serving)
        if why is not None:
            CHECKPOINTS_REFUSED.inc()
            log.error("refusing checkpoint %s (%s): %s", ck_id, path, why)
            return
        model = self.load(path)
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
        gen = (serving.gen + 1) & 0xFFFF
        self.index.clear_generation(gen)
        self.supergraph.clear_generation(gen)
        b = self.index.batch()
        b.set_meta(BUILDING_KEY, [gen, model.id, model.path])
        if ann.ts:
            b.set_meta(ANNOUNCED_TS_KEY, ann.ts)
            self.last_ts = ann.ts
        b.commit()
        nodes = NodeList(self.store, serving.memory.live_ids())
        self.building = Build(gen, model, empty_memory(gen, model, self.types), nodes,
                              total=len(serving.memory))
        self.budget.reset()
        SWAP_PROGRESS.set(0.0)
        log.info("hot swap to %s started: re-encoding about %d nodes into generation %d",
                 model.id, len(serving.memory), gen)

    def _build_step(self, serving: ServingSnapshot) -> ServingSnapshot | None:
        b = self.building
        n = min(self.rcfg.batch_max, self.budget.available())
        ids = b.nodes.take(n) if n > 0 else []
        if ids:
            n = len(ids)
            ts = int(time.time() * 1000)
            sampled = self.views.sample(ids, ts, b.model.packer)
            olds = {r.node: r for r in self.index.records(serving.gen, ids) if r is not None}
            event_ts = {i: (olds[i].event_ts if i in olds else ts) for i in ids}
            batch = self.index.batch()
            out = self.writer.stage(batch, b.gen, b.model, b.memory, ids, sampled,
                                    event_ts, ts, publish=False)
            batch.commit()
            self.writer.apply(out, b.memory)
            b.done += n
            self.budget.spend(n)
            NODES_REFRESHED.labels("hot_swap").inc(n)
        b.total = max(b.total, b.done)
        SWAP_PROGRESS.set(min(0.99, b.done / max(1, b.total)) if not b.nodes.exhausted else 1.0)
        return self._switch(serving) if b.nodes.exhausted else None

    def _switch(self, old: ServingSnapshot) -> ServingSnapshot:
        """Flip the serving generation in one write, then queue the announce pass."""
        b = self.building
        batch = self.index.batch()
        batch.set_meta(ACTIVE_KEY, [b.gen, b.model.id, b.model.path])
        batch.set_meta(BUILDING_KEY, None)
        batch.set_meta(ANNOUNCE_PASS_KEY, b.gen)
        batch.commit()
        b.memory.compact()
        self.building = None
        self._announce = b.memory.live_ids()
        INDEX_SWITCHES.inc()
        for gauge in (MODEL_INFO, MODEL_COLLAPSED):
            try:
                gauge.remove(old.model.id)
            except KeyError:
                pass
        self.index.clear_generation(old.gen)
        self.supergraph.clear_generation(old.gen)
        log.info("switched to %s: generation %d serving %d nodes (hot swap took %.1fs)",
                 b.model.id, b.gen, len(b.memory), time.monotonic() - b.started)
        return ServingSnapshot(b.gen, b.model, b.memory)

    def _announce_step(self, serving: ServingSnapshot) -> None:
        """Token changes for the new model, one micro-batch of nodes."""
        ids, self._announce = self._announce[:self.rcfg.batch_max], self._announce[self.rcfg.batch_max:]
        recs = self.index.records(serving.gen, ids)
        pubs = self.index.published(ids)
        ts = int(time.time() * 1000)
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
            batch.put_record(serving.gen, IndexRecord(rec.node, rec.model, c.seq, rec.emb, rec.tokens,
                                                      rec.assign, rec.event_ts, rec.ts), rec)
            out.append(c)
        if not self._announce:
            batch.set_meta(ANNOUNCE_PASS_KEY, None)
        batch.commit()
        for c in out:
            serving.memory.set_seq(c.node, c.seq)
        self.outbox.send(out, fresh=False)

    def status(self) -> dict | None:
        b = self.building
        return None if b is None else {"model": b.model.id, "generation": b.gen,
                                       "done": b.done, "total_estimate": b.total}
