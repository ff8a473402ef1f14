import multiprocessing as mp

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement, Entity
from hirflow.state.graph import (GraphConfig, GraphStore, IncompatibleStoreError, StoreLockedError,
                                 StoreMissingError)
from hirflow.state.keys import KeyCodec, partition_of
from hirflow.state.node import IN, OUT
from hirflow.state.schema import SchemaConfig
from hirflow.state.writer import SRC_SIDE, GraphWriter

T0 = 1_767_225_600_000
S = SchemaConfig()


def test_both_directions_and_stats(tmp_path):
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        w.apply(Engagement("user:1", "ad:1", "click", T0))
        w.apply(Engagement("user:1", "ad:1", "click", T0 + 1000))
        w.apply(Engagement("user:1", "ad:2", "not_interested", T0 + 2000))
        w.applied("eng", 0, 41)
        w.commit()
        r = store.reader
        u = r.node("user:1")
        assert (u.events, u.first_seen, u.last_seen, u.degree_out, u.degree_in) == (3, T0, T0 + 2000, 2, 0)
        edges = {(e.neighbor, e.action): e for e in r.neighbors("user:1")}
        assert edges[("ad:1", "click")].count == 2 and edges[("ad:1", "click")].direction == OUT
        assert edges[("ad:2", "not_interested")].weight < 0          # negative feedback
        back = r.neighbors("ad:1")
        assert [(e.neighbor, e.direction) for e in back] == [("user:1", IN)]
        assert r.offsets() == {("eng", 0): 41}
        assert r.dirty() == {"user:1": T0, "ad:1": T0, "ad:2": T0 + 2000}


def test_as_of_reads_hide_later_edges_and_decay(tmp_path):
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        w.apply(Engagement("user:1", "ad:1", "click", T0))
        w.apply(Engagement("user:1", "ad:2", "click", T0 + 86_400_000))
        w.commit()
        r = store.reader
        assert [e.neighbor for e in r.neighbors("user:1", as_of=T0 + 1)] == ["ad:1"]
        later = {e.neighbor: e.weight for e in r.neighbors("user:1", as_of=T0 + 3 * 86_400_000)}
        assert later["ad:1"] == pytest.approx(0.5)          # click half-life is 3 days
        assert r.node("user:1", as_of=T0 - 1) is None


def test_offsets_commit_atomically_with_state(tmp_path):
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        w.apply(Engagement("user:1", "ad:1", "click", T0))
        w.applied("eng", 1, 7)
        w.discard_uncommitted()            # a failed batch: neither state nor offset lands
        assert store.reader.offsets() == {} and store.reader.state("user:1") is None
        w.apply(Engagement("user:1", "ad:1", "click", T0), SRC_SIDE)
        w.applied("eng", 1, 7)
        w.commit()
    with GraphStore(tmp_path, S, 4) as store:
        assert store.reader.offsets() == {("eng", 1): 7}
        assert store.reader.state("ad:1") is None            # only the src side was applied
        assert GraphWriter(store, GraphConfig()).stored_offset("eng", 1) == 7


def test_entities_newest_wins(tmp_path):
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        assert w.entities.upsert(Entity("ad:1", T0 + 10, "new text"))
        w.entities.commit({("ent", 0): 1})
        assert not w.entities.upsert(Entity("ad:1", T0, "old text"))
        w.entities.commit({("ent", 0): 2})
        assert store.reader.entity("ad:1").text == "new text"
        assert store.reader.offsets() == {("ent", 0): 2}


def test_entity_commits_never_flush_pending_engagement_state(tmp_path):
    """Node records applied by ingest become durable only with their own offsets, even when
    the entity agent commits in between (else a crash would apply those events twice)."""
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        w.apply(Engagement("user:1", "ad:1", "click", T0))       # pending, offset not noted
        w.entities.upsert(Entity("ad:1", T0, "text"))
        w.entities.commit({("ent", 0): 0})
        assert store.reader.state("user:1") is None
        assert store.reader.offsets() == {("ent", 0): 0}
        w.applied("eng", 0, 5)
        w.commit()
        assert store.reader.state("user:1").events == 1


def _hold(path, ready, release):
    with GraphStore(path, S, 4):
        ready.set()
        release.wait(20)


def test_clear_errors_locked_missing_incompatible(tmp_path):
    with pytest.raises(StoreMissingError, match="no state store"):
        GraphStore(tmp_path / "nope", S, 4, create=False)
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path / "db", ready, release))
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(StoreLockedError, match="locked by another process"):
            GraphStore(tmp_path / "db", S, 4)
    finally:
        release.set()
        p.join(30)
    with pytest.raises(IncompatibleStoreError, match="4 partitions"):
        GraphStore(tmp_path / "db", S, 8)
    with GraphStore(tmp_path / "db", S, 4) as store:
        store.cf["meta"][b"schema_version"] = msgpack.packb(99)
    with pytest.raises(IncompatibleStoreError, match="schema version 99"):
        GraphStore(tmp_path / "db", S, 4)


def test_node_keys_group_a_partition():
    codec = KeyCodec(8)
    ids = [f"user:{i}" for i in range(200)]
    for n in ids:
        key = codec.key(n)
        assert len(key) == 10 and int.from_bytes(key[:2], "big") == partition_of(n, 8)
    assert len({codec.key(n) for n in ids}) == len(ids)


def test_a_node_state_round_trips_through_its_stored_form():
    from hirflow.state.node import NodeState
    s = NodeState("ad:9")
    assert NodeState.unpack(s.pack()).first is None                 # a node with no events yet
    assert NodeState.id_and_last(s.pack()) == ("ad:9", None)
    s.apply_sum("user:1", "click", OUT, 1.5, T0, 2, T0 - 5, T0, 1e-9)
    s.apply_sum("campaign:1", "runs", IN, 1, T0 + 7, 1, T0 + 7, T0 + 7, 0.0)   # an int weight
    back = NodeState.unpack(s.pack())
    assert (back.id, back.first, back.last, back.events) == (s.id, s.first, s.last, s.events)
    assert back.edges == s.edges and back.activity == s.activity
    assert NodeState.id_and_last(s.pack()) == (s.id, s.last)
    assert all(isinstance(k, tuple) and isinstance(v, tuple) for k, v in back.edges.items())


_ids = st.text("abc:123", min_size=1, max_size=6)
_edges = st.dictionaries(
    st.tuples(_ids, st.sampled_from(["click", "buy", "runs"]), st.sampled_from([IN, OUT])),
    st.tuples(st.floats(-1e6, 1e6), st.integers(0, 2**62), st.integers(1, 2**31),
              st.integers(0, 2**62)), max_size=40)
_activity = st.dictionaries(st.tuples(st.sampled_from(["click", "buy"]), st.sampled_from([IN, OUT])),
                            st.tuples(st.floats(0, 1e6), st.integers(0, 2**62)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(edges=_edges, activity=_activity, first=st.none() | st.integers(0, 2**62),
       events=st.integers(0, 2**40))
def test_any_node_record_round_trips_and_one_in_the_pairs_layout_still_reads(edges, activity,
                                                                                first, events):
    """Records keep their edges' order (views and trims follow it), and a record in the layout
    of earlier versions (each map as an array of [key, value] pairs, still in stores and
    change logs) reads back the same."""
    import msgspec
    from hirflow.state.node import NodeState
    s = NodeState("user:7")
    s.first, s.last, s.events, s.edges, s.activity = first, first, events, edges, activity
    pairs_layout = msgspec.msgpack.encode([s.id, s.first, s.last, s.events,
                                           list(activity.items()), list(edges.items())])
    for raw in (s.pack(), pairs_layout):
        back = NodeState.unpack(raw)
        assert (back.id, back.first, back.last, back.events) == (s.id, s.first, s.last, s.events)
        assert list(back.edges.items()) == list(edges.items())
        assert back.activity == activity and type(back.edges) is dict
        assert NodeState.id_and_last(raw) == (s.id, s.last)


def test_a_store_refuses_a_worker_of_another_topology(tmp_path):
    """State of worker 0 of 2 is not the state of worker 0 of 3, nor of worker 1 of 2."""
    with GraphStore(tmp_path / "s", SchemaConfig(), 8) as store:
        store.claim_worker(2, 0)
        store.claim_worker(2, 0)                       # the same worker again: fine
        for count, index in ((3, 0), (2, 1), (1, 0)):
            with pytest.raises(IncompatibleStoreError, match="belongs to worker 0 of 2"):
                store.claim_worker(count, index)


def test_the_write_back_cache_holds_its_edge_bound_and_counts_exactly(tmp_path):
    """After each commit the cache holds at most `cache_edges` edges (and `cache_nodes`
    records), and its running count is the true number of edges in it; evicted records
    are on disk, so the state is the same as with an unbounded cache."""
    import random

    from tests.state.helpers import digest
    rnd = random.Random(4)
    evs = [Engagement(f"user:{rnd.randrange(300)}", f"ad:{rnd.randrange(80)}", "click",
                      1_767_225_600_000 + i) for i in range(6000)]
    small = GraphConfig(path=str(tmp_path / "a"), cache_nodes=1000, cache_edges=400, top_k=4096)
    with GraphStore(small.path, SchemaConfig(), 4) as a, \
            GraphStore(tmp_path / "b", SchemaConfig(), 4) as b:
        wa, wb = GraphWriter(a, small), GraphWriter(b, GraphConfig(path=str(tmp_path / "b"), top_k=4096))
        for i in range(0, len(evs), 250):
            for w in (wa, wb):
                w.apply_batch([(e, 3) for e in evs[i:i + 250]])
                w.commit()
            assert wa._edges_cached == sum(len(s.edges) for s in wa._cache.values()) <= 400
        assert digest(a) == digest(b)


def test_a_batch_of_nothing_applies_nothing(tmp_path):
    """A consume call whose records were all skipped or dead-lettered hands the writer an
    empty batch (a restarted worker re-reading what it had applied)."""
    with GraphStore(tmp_path, S, 4) as store:
        w = GraphWriter(store, GraphConfig(path=str(tmp_path)))
        assert w.apply_batch([]) == set()
        w.commit()
        assert not list(store.reader.node_ids())
