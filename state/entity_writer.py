"""The entity side of the write path: entities (text, attributes, image vectors) and their
world-knowledge vectors, applied by the entity agent and committed with the entity topic's
offsets in one batch. It shares the `GraphWriter`'s lock, dirty queue and offsets, and never
writes the engagement side's pending node records: those become durable only together with
the engagement offsets that produced them."""
from __future__ import annotations

import threading

from hirflow.state.dirty_queue import DirtyQueue
from hirflow.state.events import Entity
from hirflow.state.graph import GraphStore


class EntityWriter:
    def __init__(self, store: GraphStore, dirty: DirtyQueue, lock: threading.RLock,
                 offsets: dict[tuple[str, int], int]) -> None:
        self.store, self.dirty, self.lock = store, dirty, lock
        self.offsets = offsets                 # the writer's applied offsets, updated in place
        self._entities: dict[str, Entity] = {}
        self._knowledge: dict = {}

    def upsert(self, ent: Entity) -> bool:
        """Keep the newest entity record per node (idempotent, so replays are harmless)."""
        with self.lock:
            cur = self._entities.get(ent.node) or self.store.reader.entity(ent.node)
            if cur is not None and cur.ts > ent.ts:
                return False
            self._entities[ent.node] = ent
            self.dirty.touch_entity(ent.node, ent.ts)
            return True

    def set_knowledge(self, node_id: str, vector) -> None:
        """A world-knowledge vector, written with the next `commit`."""
        with self.lock:
            self._knowledge[node_id] = vector

    def commit(self, offsets: dict[tuple[str, int], int]) -> int:
        """Pending entities, their vectors and dirty markers with the entity topic's offsets,
        in one batch -> entities written."""
        with self.lock:
            self.dirty.commit_entities_with(lambda markers: self.store.commit(
                entities=self._entities.values(), knowledge=self._knowledge,
                dirty_put=markers, offsets=offsets))
            self.offsets.update(offsets)
            n = len(self._entities)
            self._entities, self._knowledge = {}, {}
            return n

    def discard(self) -> None:
        """Forget what was applied since the last commit (a commit failed)."""
        with self.lock:
            self._entities, self._knowledge = {}, {}
            self.dirty.drop_entities()
