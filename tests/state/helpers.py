"""Helpers for state tests: apply events directly and take a canonical digest of a store."""
from __future__ import annotations

from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.writer import GraphWriter


def apply_direct(store: GraphStore, events, config: GraphConfig | None = None, batch: int = 1000):
    w = GraphWriter(store, config or GraphConfig(path=str(store.path)))
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        w.prefetch([n for e in chunk for n in (e.src, e.dst)])
        for e in chunk:
            w.apply(e)
        w.commit()
    return w


def digest(store: GraphStore) -> dict:
    """node -> (first, last, events, activity, edges) with floats kept for tolerance checks."""
    out = {}
    for node_id in store.reader.node_ids():
        s = store.reader.state(node_id)
        out[node_id] = (s.first, s.last, s.events,
                        {k: tuple(v) for k, v in s.activity.items()},
                        {k: tuple(v) for k, v in s.edges.items()})
    return out


def assert_same_state(a: dict, b: dict, rel: float = 1e-9) -> None:
    assert a.keys() == b.keys()
    for node in a:
        fa, la, na, acta, ea = a[node]
        fb, lb, nb, actb, eb = b[node]
        assert (fa, la, na) == (fb, lb, nb), node
        assert acta.keys() == actb.keys() and ea.keys() == eb.keys(), node
        for k in acta:
            assert acta[k][1] == actb[k][1]
            assert abs(acta[k][0] - actb[k][0]) <= rel * max(1.0, abs(acta[k][0])), (node, k)
        for k in ea:
            (wa, ta, ca, fa_), (wb, tb, cb, fb_) = ea[k], eb[k]
            assert (ta, ca, fa_) == (tb, cb, fb_), (node, k, ea[k], eb[k])
            assert abs(wa - wb) <= rel * max(1.0, abs(wa)), (node, k, wa, wb)
