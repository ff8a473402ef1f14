"""Edge columns carry every edge of each record, in the record's order, and nothing else."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.node import IN, OUT, NodeState

CODES = {"click": 0, "impression": 1}


def state(name, edges):
    s = NodeState(name)
    for nbr, action, d, w, t in edges:
        s.apply_sum(nbr, action, d, w, t, 1, t, t, 0.0)
    return s


def test_columns_hold_each_records_edges_in_order_and_absent_nodes_hold_none():
    a = state("user:a", [("ad:1", "click", OUT, 2.0, 10), ("ad:2", "impression", OUT, -0.5, 20),
                         ("ad:1", "impression", OUT, 1.0, 30)])
    b = state("ad:1", [("user:a", "click", IN, 2.0, 10)])
    cols = EdgeColumns.from_states(["user:a", "user:gone", "ad:1"],
                                   {"user:a": a, "ad:1": b, "user:gone": None}, CODES)
    assert cols.present.tolist() == [True, False, True]
    assert cols.bounds.tolist() == [0, 3, 3, 4]
    assert cols.owner.tolist() == [0, 0, 0, 2]
    got = [(cols.names[n], a_, w, t) for n, a_, w, t in
           zip(cols.nbr.tolist(), cols.action.tolist(), cols.w.tolist(), cols.t_ref.tolist())]
    assert got == [("ad:1", 0, 2.0, 10), ("ad:2", 1, -0.5, 20), ("ad:1", 1, 1.0, 30),
                   ("user:a", 0, 2.0, 10)]
    assert cols.names == ("ad:1", "ad:2", "user:a")


def test_heaviest_ranks_by_absolute_weight_with_ties_in_record_order():
    a = state("user:a", [("ad:1", "click", OUT, 1.0, 10), ("ad:2", "click", OUT, -3.0, 10),
                         ("ad:3", "click", OUT, 1.0, 10), ("ad:4", "impression", OUT, 0.1, 10)])
    cols = EdgeColumns.from_states(["user:a"], {"user:a": a}, CODES)
    assert cols.heaviest(0, 3) == ["ad:2", "ad:1", "ad:3"]
    assert cols.heaviest(0, 10) == ["ad:2", "ad:1", "ad:3", "ad:4"]
    empty = EdgeColumns.from_states(["x:1"], {}, CODES)
    assert empty.heaviest(0, 3) == [] and len(empty.nbr) == 0 and empty.w.dtype == np.float64


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(sorted(CODES)),
                                   st.sampled_from([IN, OUT]), st.floats(-5, 5), st.integers(0, 99)),
                         max_size=6), max_size=8),
       st.data())
def test_columns_of_parts_joined_equal_the_columns_of_the_whole(records, data):
    states = {f"n:{i}": state(f"n:{i}", [(f"m:{nb}", a, d, w, t) for nb, a, d, w, t in edges])
              for i, edges in enumerate(records)}
    nodes = list(states) + ["n:absent"]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(nodes)), max_size=3)))
    bounds = [0] + cuts + [len(nodes)]
    parts = [EdgeColumns.from_states(nodes[a:b], states, CODES) for a, b in zip(bounds[:-1], bounds[1:])]
    whole = EdgeColumns.from_states(nodes, states, CODES)
    joined = EdgeColumns.concat(parts)
    assert joined.nodes == whole.nodes and joined.names == whole.names
    for f in ("present", "bounds", "nbr", "action", "w", "t_ref"):
        got, want = getattr(joined, f), getattr(whole, f)
        assert got.dtype == want.dtype and np.array_equal(got, want), f
