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

Staged = list[tuple[IndexRecord, "changes.TokenChange | None"]]


class GenerationWriter:
    def __init__(self, index: TokenIndex, supergraph: SuperGraph) -> None:
        self.index, self.supergraph = index, supergraph

    def stage(self, batch: IndexBatch, gen: int, model: ServingModel, memory: MemoryIndex,
              ids: list[str], sampled: Sampled, event_ts, ts: int, publish: bool) -> Staged:
        """Encode `ids` (views in `sampled`) with `model`, put their records into `batch` for
        generation `gen`, and with `publish` their token changes too -> (record, change or
        None) per node, in order. `memory` supplies the neighbours' primitive assignments."""
        if sampled.edges is None or sampled.edges.nodes != tuple(ids):
            raise RuntimeError("the sampled adjacencies are not those of the batch's nodes")
        emb, assign, tokens = model.encode(sampled.views, sampled.knowledge, sampled.prepared)
        olds = self.index.records(gen, ids)
        pubs = self.index.published(ids) if publish else [None] * len(ids)
        out: Staged = []
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
    def apply(out: Staged, memory: MemoryIndex) -> None:
        """After the batch committed: the same records into the in-memory index."""
        for rec, _ in out:
            memory.upsert(rec.node, rec.emb, rec.tokens, rec.assign, rec.seq)
