"""Neighbour refresh requests across workers: the queue sets aside another worker's nodes,
the owner's inbox keeps only its own, and a malformed post is refused."""
import msgpack
import pytest

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.node import NodeState
from hirflow.state.schema import SchemaConfig
from hirflow.streams.refresh.neighbor_forward import MAX_REQUESTS, NeighborInbox
from hirflow.streams.refresh.neighbor_queue import NeighborQueue


def test_the_queue_keeps_its_own_neighbours_and_sets_the_others_aside():
    user = NodeState("user:1")
    for i, w in enumerate((3.0, 2.0, 1.0)):
        user.apply_sum(f"ad:{i}", "click", 0, w, 1_000, 1, 1_000, 1_000, 0.0)
    edges = EdgeColumns.from_states(["user:1"], {"user:1": user}, SchemaConfig().action_codes())
    mine = {"ad:0", "ad:2"}
    q = NeighborQueue(per_node=3, rate=1e9, owns=lambda n: n in mine)
    q.queue([0], edges, {"user:1": 5_000}, {})
    assert q.waiting() == {"ad:0": 5_000, "ad:2": 5_000}
    assert q.take_foreign() == {"ad:1": 5_000} and q.take_foreign() == {}
    q.add([("ad:7", 9_000), ("ad:0", 1)])            # from another worker; ad:0 waits already
    assert q.waiting() == {"ad:0": 5_000, "ad:2": 5_000, "ad:7": 9_000}


def test_the_inbox_keeps_only_this_workers_nodes_and_refuses_malformed_posts():
    inbox = NeighborInbox()
    body = msgpack.packb([["ad:1", 10], ["ad:2", 20], ["user:3", 30]])
    assert inbox.accept(body, lambda n: n != "ad:2") == 2
    assert inbox.drain() == [("ad:1", 10), ("user:3", 30)] and inbox.drain() == []
    for bad in (b"\xc1", msgpack.packb({"ad:1": 1}), msgpack.packb([["ad:1"]]),
                msgpack.packb([["ad:1", "soon"]]), msgpack.packb([[1, 2]]),
                msgpack.packb([["ad:1", 1]] * (MAX_REQUESTS + 1))):
        with pytest.raises(ValueError):
            inbox.accept(bad, lambda n: True)
    assert inbox.drain() == []
