"""The super-graph's bulk update equals its definition: each node's row is the decay-algebra
sum of its edges per (level, neighbour primitive, action), and each primitive pair's row is
the sum of the rows of the nodes assigned to it, however often nodes move between updates."""
import numpy as np
import pytest

from hirflow.state.decay import add, value_at
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.graph import GraphStore
from hirflow.state.index import NO_PRIMITIVE, TokenIndex
from hirflow.state.node import NodeState
from hirflow.state.schema import SchemaConfig
from hirflow.state.supergraph import (NodeContribution, SuperGraph, _dec_node, _enc, _node_key, _pair_keys)

HOUR = 3_600_000
ACTIONS = ["impression", "click", "conversion", "owns"]        # decaying and structural


def reference_rows(state, assign_of, rates):
    """(level, q, action) -> (w, t_ref): one edge at a time with `state.decay.add`."""
    out = {}
    for (nbr, action, _d), (w, tref, _n, _f) in state.edges.items():
        a = assign_of(nbr)
        for level, q in enumerate(a):
            if q == NO_PRIMITIVE:
                continue
            k = (level, int(q), action)
            cur = out.get(k)
            out[k] = (w, tref) if cur is None else add(cur[0], cur[1], w, tref, rates[action])
    return out


def columns(states, store, absent=()):
    """The batch's adjacencies as the sampling process ships them (plus `absent` nodes)."""
    by_id = {s.id: s for s in states}
    return EdgeColumns.from_states([s.id for s in states] + list(absent), by_id,
                                   store.schema.action_codes())


def random_state(rng, name, others, t0):
    s = NodeState(name)
    for _ in range(int(rng.integers(0, 12))):
        action = ACTIONS[int(rng.integers(len(ACTIONS)))]
        t = t0 + int(rng.integers(0, 48 * HOUR))
        s.apply_sum(others[int(rng.integers(len(others)))], action, int(rng.integers(2)),
                    float(rng.normal()), t, 1, t, t, 0.0)
    return s


@pytest.fixture
def graph(tmp_path):
    with GraphStore(tmp_path, SchemaConfig(), 4) as store:
        yield store, SuperGraph(TokenIndex(store))


def test_rows_follow_nodes_through_moves_and_new_edges(graph):
    store, sg = graph
    rates = store.rates
    rng = np.random.default_rng(1)
    names = [f"user:{i}" for i in range(30)] + [f"ad:{i}" for i in range(30)]
    assign = {n: [int(rng.integers(0, 3)), int(rng.integers(0, 9))] for n in names}
    assign["ad:0"] = [NO_PRIMITIVE, NO_PRIMITIVE]                 # an unassigned neighbour
    stored: dict[str, tuple[list[int], dict]] = {}
    t_eval = 60 * HOUR
    for round_ in range(4):
        # some nodes move, then a random subset is refreshed with fresh edges
        for n in rng.choice(names, 10, replace=False):
            assign[n] = [int(rng.integers(0, 3)), int(rng.integers(0, 9))]
        chosen = list(rng.choice(names, 25, replace=False))
        states = [random_state(rng, n, names, round_ * HOUR) for n in chosen]
        batch = sg.ix.batch()
        # a node without a record (never engaged) rides along: it gets no row
        sg.update(batch, 0, columns(states, store, absent=["user:none"]),
                  np.array([assign[s.id] for s in states] + [[0, 0]], np.int64),
                  lambda ns: np.array([assign[n] for n in ns], np.int64))
        batch.commit()
        assert sg.cf.get(_node_key(0, sg.ix.key("user:none"))) is None
        for s in states:
            stored[s.id] = (list(assign[s.id]), reference_rows(s, assign.get, rates))
        for s in states:                                           # node rows
            got = {(lv, q, a): (w, t) for lv, q, a, w, t in
                   zip(*_dec_node(sg.cf.get(_node_key(0, sg.ix.key(s.id)))).columns())}
            want = stored[s.id][1]
            assert got.keys() == want.keys()
            for k in want:
                assert got[k][1] == want[k][1]
                assert got[k][0] == pytest.approx(want[k][0], rel=1e-9, abs=1e-12)
        for level in range(2):                                     # pair rows
            for p in range(9 if level else 3):
                want: dict[int, float] = {}
                for a, rows in stored.values():
                    if a[level] != p:
                        continue
                    for (lv, q, action), (w, t) in rows.items():
                        if lv == level and q != p:
                            want[q] = want.get(q, 0.0) + value_at(w, t, t_eval, rates[action])
                got = dict(sg.related(0, level, p, t_eval, k=100))
                for q in set(want) | set(got):
                    assert got.get(q, 0.0) == pytest.approx(want.get(q, 0.0), rel=1e-6, abs=1e-9)


def test_a_stored_row_is_subtracted_from_the_old_primitive_when_its_node_moves(graph):
    store, sg = graph
    s = NodeState("user:1")
    s.apply_sum("ad:1", "owns", 0, 2.0, 10, 1, 10, 10, 0.0)
    old = NodeContribution([0], [0], [5], ["owns"], [2.0], [10])
    batch = sg.ix.batch()
    batch.put_raw("supergraph", _node_key(0, sg.ix.key("user:1")), _enc(old))
    batch.put_raw("supergraph", _pair_keys(0, [0], [0], [5])[0], _enc({"owns": [2.0, 10]}))
    batch.commit()
    assert dict(sg.related(0, 0, 0, 10)) == {5: 2.0}
    batch = sg.ix.batch()
    sg.update(batch, 0, columns([s], store), [[1]], lambda ns: np.array([[5]] * len(ns)))  # 0 -> 1
    batch.commit()
    assert dict(sg.related(0, 0, 0, 10)) == {5: 0.0}
    assert dict(sg.related(0, 0, 1, 10)) == {5: 2.0}
