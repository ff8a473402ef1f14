"""Encode a batch of nodes with one model and stage what it produces for one generation of
the index: records, postings, super-graph rows, and (for the serving generation) the token
changes with their published seq. Staged into a caller's RocksDB batch, so the caller
commits them together with the dirty markers it clears."""
from __future__ import annotations

from hirflow.encoder.serving import ServingModel
from hirflow.state.index import IndexBatch, IndexRecord, TokenIndex
from hirflow.state.memindex import MemoryIndex
from hirflow.state.supergraph import SuperGraph
from hirflow.state.view_source import Sampled
from hirflow.streams import changes

# per node: (node, its record or None when it left the index, the change to publish or None)
Staged = list[tuple[str, "IndexRecord | None", "changes.TokenChange | None"]]


class GenerationWriter:
    def __init__(self, index: TokenIndex, supergraph: SuperGraph) -> None:
        self.index, self.supergraph = index, supergraph

    def stage(self, batch: IndexBatch, gen: int, model: ServingModel, memory: MemoryIndex,
              ids: list[str], sampled: Sampled, event_ts, ts: int, publish: bool) -> Staged:
        """Encode `ids` (views in `sampled`) with `model`, put their records into `batch` for
        generation `gen`, and with `publish` their token changes too -> (node, record,
        change or None) per node, in order. `memory` supplies the neighbours' primitive
        assignments. A node with neither a node record nor an entity (expired by retention)
        leaves the generation instead, and subscribers are told (a change without tokens)."""
        if sampled.edges is None or sampled.edges.nodes != tuple(ids):
            raise RuntimeError("the sampled adjacencies are not those of the batch's nodes")
        emb, assign, tokens = model.encode(sampled.views, sampled.knowledge, sampled.prepared,
                                           sampled.edges)
        olds = self.index.records(gen, ids)
        pubs = self.index.published(ids) if publish else [None] * len(ids)
        reader = self.index.store.reader
        gone = {n for n, present in zip(ids, sampled.edges.present.tolist())
                if not present and reader.entity(n) is None}
        out: Staged = []
        for i, n in enumerate(ids):
            old, pub = olds[i], pubs[i]
            seq = pub[0] if pub is not None else (old.seq if old is not None else 0)
            if n in gone:
                out.append((n, None, self._leave(batch, gen, n, model, old, pub, seq, publish,
                                                 event_ts[n], ts)))
                continue
            change = None
            if publish:
                change = changes.diff(n, model.id, seq + 1, tokens[i], assign[i], pub,
                                      event_ts[n], ts)
                seq = self._publish(batch, seq, change)
            rec = IndexRecord(n, model.id, seq, emb[i], tuple(int(t) for t in tokens[i]),
                              tuple(int(a) for a in assign[i]), event_ts[n], ts)
            batch.put_record(gen, rec, old)
            out.append((n, rec, change))
        if gone:
            self.supergraph.remove(batch, gen, sorted(gone))
        if model.encoder is not None:                  # primitives exist only with a checkpoint
            mine = {rec.node: rec.assign for _, rec, _ in out if rec is not None}

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
    def _leave(batch: IndexBatch, gen: int, node: str, model: ServingModel, old, pub, seq: int,
               publish: bool, event_ts: int, ts: int) -> "changes.TokenChange | None":
        if old is not None:
            batch.delete_record(gen, old)
        if not publish or pub is None or not pub[2]:     # subscribers know no tokens of it
            return None
        change = changes.removal(node, model.id, seq + 1, pub[2], event_ts, ts)
        GenerationWriter._publish(batch, seq, change)
        return change

    @staticmethod
    def _publish(batch: IndexBatch, seq: int, change: "changes.TokenChange | None") -> int:
        """Stage `change` (made with seq + 1; None: nothing to tell subscribers) for publishing.
        The one place a node's seq moves on. -> the node's seq after it."""
        if change is None:
            return seq
        assert change.seq == seq + 1, "a node's changes are numbered one after another"
        batch.publish(change.node, change.seq, change.model, change.tokens, change.assign,
                      changes.encode(change))
        return change.seq

    @staticmethod
    def apply(out: Staged, memory: MemoryIndex) -> None:
        """After the batch committed: the same records into the in-memory index."""
        for node, rec, _ in out:
            if rec is None:
                memory.remove(node)
            else:
                memory.upsert(rec.node, rec.emb, rec.tokens, rec.assign, rec.seq)
