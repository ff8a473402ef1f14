"""Views sampled on one of two workers, reading the other's nodes from it, equal the views a
single store holding every partition gives; an owner that does not answer costs one batch
its nodes, not the worker; and another worker's changes show once their reads expire."""
from contextlib import contextmanager
from typing import Iterator

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state import partition_state
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.keys import partition_of
from hirflow.state.routed_reader import PeerUnavailable
from hirflow.state.schema import SchemaConfig
from hirflow.state.view_source import LocalViews
from hirflow.state.views import STUDENT, TEACHER, ViewSampler
from hirflow.streams.scaleout import peer_reads
from tests.state.helpers import apply_direct
from tests.state.view_world import DAY, ODD, T0, assert_same, random_events

PARTITIONS, WORKERS = 4, 2


def owner(node: str) -> int:
    return partition_of(node, PARTITIONS) % WORKERS


class StorePeers:
    """Worker `index`'s peers, answering from their stores as `/v1/internal/records` does."""

    def __init__(self, index: int, stores: list[GraphStore]) -> None:
        self.index, self.stores, self.down, self.asked = index, stores, False, 0

    def owner(self, node: str) -> int:
        return owner(node)

    def fetch(self, who: int, ids: list[str]):
        self.asked += 1
        if self.down:
            raise PeerUnavailable("connection refused")
        body = peer_reads.answer(self.stores[who].reader, owner, who, msgpack.packb(ids))
        return [tuple(pair) for pair in msgpack.unpackb(body)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@contextmanager
def split_stores(root, events, knowledge) -> Iterator[tuple[GraphStore, list[GraphStore]]]:
    """One store with every partition, and each worker's store with only its own."""
    full = GraphStore(root / "full", SchemaConfig(), PARTITIONS)
    stores = [full]
    try:
        apply_direct(full, events, GraphConfig(path=str(root / "full")))
        full.commit(knowledge=knowledge)
        for w in range(WORKERS):
            s = GraphStore(root / f"w{w}", SchemaConfig(), PARTITIONS)
            stores.append(s)
            apply_direct(s, events, GraphConfig(path=str(root / f"w{w}")))
            s.commit(knowledge=knowledge)
            for p in range(PARTITIONS):
                if p % WORKERS != w:
                    partition_state.drop(s, p)
        yield full, stores[1:]
    finally:
        for s in stores:
            s.close()


def knowledge_of(events, rng) -> dict[str, np.ndarray]:
    nodes = sorted({n for e in events for n in (e.src, e.dst)})
    return {n: rng.random(4).astype(np.float32) for n in nodes if rng.random() < 0.5}


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([STUDENT, TEACHER, ODD]), st.integers(1, 30))
def test_views_through_the_owners_equal_a_single_stores(tmp_path_factory, seed, config, day):
    rng = np.random.default_rng(seed)
    events = random_events(rng, 25, 15, 400, same_time=False)
    root = tmp_path_factory.mktemp("routed")
    with split_stores(root, events, knowledge_of(events, rng)) as (full, workers):
        cutoff = T0 + day * DAY
        for w in range(WORKERS):
            mine = sorted({n for e in events for n in (e.src, e.dst) if owner(n) == w})
            views = LocalViews(workers[w], SchemaConfig(), config, seed, peers=StorePeers(w, workers))
            got = views.sample(mine, cutoff)
            want = ViewSampler(full.reader, SchemaConfig(), config, seed=seed).sample(mine, cutoff)
            assert_same(got.views, want)
            seen = sorted({n for v in want for n in v.nodes})
            assert {n: v.tolist() for n, v in got.knowledge.items()} == \
                {n: v.tolist() for n, v in full.reader.knowledge(seen).items()}
            foreign = {n for v in want for n in v.nodes if owner(n) != w}
            assert got.peer_reads >= len(foreign) and got.peer_failures == 0
            # the local store alone cannot give those views, so the reads were needed
            alone = ViewSampler(workers[w].reader, SchemaConfig(), config, seed=seed).sample(mine, cutoff)
            if foreign and config.hops >= 2:
                assert any(a.nodes != b.nodes or a.stats.tolist() != b.stats.tolist()
                           for a, b in zip(alone, want))


def test_an_owner_that_does_not_answer_costs_one_batch_and_is_asked_again(tmp_path):
    rng = np.random.default_rng(3)
    events = random_events(rng, 25, 15, 600, same_time=False)
    with split_stores(tmp_path, events, {}) as (full, workers):
        peers = StorePeers(0, workers)
        views = LocalViews(workers[0], SchemaConfig(), STUDENT, 7, peers=peers)
        clock = views.routed.clock = Clock()
        mine = sorted({n for e in events for n in (e.src, e.dst) if owner(n) == 0})
        cutoff = T0 + 31 * DAY
        peers.down = True
        got = views.sample(mine, cutoff)
        alone = ViewSampler(workers[0].reader, SchemaConfig(), STUDENT, seed=7).sample(mine, cutoff)
        assert_same(got.views, alone)                 # as if the other worker's nodes were absent
        assert got.peer_failures > 0 and got.peer_reads == 0
        asked = peers.asked
        views.sample(mine, cutoff)                    # within retry_s: not asked again
        assert peers.asked == asked
        peers.down = False
        clock.t += views.routed.retry_s + 1
        got = views.sample(mine, cutoff, changed=[])  # nothing changed here: only the misses
        assert got.peer_reads > 0 and got.peer_failures == 0
        # the walks draw the same numbers whatever the graph: a sampler of the whole graph
        # in its third call is the reference
        reference = ViewSampler(full.reader, SchemaConfig(), STUDENT, seed=7)
        for _ in range(2):
            reference.sample(mine, cutoff)
        assert_same(got.views, reference.sample(mine, cutoff))


def test_another_workers_change_shows_once_its_read_expires(tmp_path):
    rng = np.random.default_rng(5)
    events = random_events(rng, 20, 10, 300, same_time=False)
    with split_stores(tmp_path, events, {}) as (full, workers):
        config = STUDENT
        peers = StorePeers(0, workers)
        views = LocalViews(workers[0], SchemaConfig(), config, 1, peers=peers)
        clock = views.routed.clock = Clock()
        cutoff = T0 + 40 * DAY
        # a user of this worker whose view holds an ad of the other worker
        for e in events:
            if owner(e.src) == 0 and owner(e.dst) == 1:
                user, ad = e.src, e.dst
                before = views.sample([user], cutoff).views[0]
                if ad in before.nodes:
                    break
        else:
            raise AssertionError("no view of a user here holds an ad of the other worker")
        # the other worker's ad gains an edge from a new user of its own; this worker's user
        # reaches it through its own edge to the ad
        newcomer = next(f"user:{i}" for i in range(100, 200) if owner(f"user:{i}") == 1)
        more = [type(events[0])(user, ad, "click", T0 + 35 * DAY),
                type(events[0])(newcomer, ad, "conversion", T0 + 36 * DAY)]
        for s in (full, workers[0], workers[1]):
            apply_direct(s, more, GraphConfig(path=str(s.path)))
        for p in range(PARTITIONS):
            if p % WORKERS != 1:
                partition_state.drop(workers[1], p)
            if p % WORKERS != 0:
                partition_state.drop(workers[0], p)
        stale = views.sample([user], cutoff).views[0]    # the user changed here: re-read
        assert ad in stale.nodes
        ad_row = stale.stats[stale.nodes.index(ad)]
        clock.t += views.routed.ttl_s + 1
        fresh = views.sample([user], cutoff, changed=[]).views[0]
        want = ViewSampler(full.reader, SchemaConfig(), config, seed=1).sample([user], cutoff)[0]
        assert fresh.stats[fresh.nodes.index(ad)].tolist() == want.stats[want.nodes.index(ad)].tolist()
        assert fresh.stats[fresh.nodes.index(ad)].tolist() != ad_row.tolist()   # its new edge


def test_the_owner_answers_only_for_its_own_nodes_and_refuses_bad_bodies(tmp_path):
    rng = np.random.default_rng(2)
    events = random_events(rng, 10, 5, 100, same_time=False)
    with split_stores(tmp_path, events, {}) as (full, workers):
        nodes = sorted({n for e in events for n in (e.src, e.dst)}) + ["user:nobody"]
        got = msgpack.unpackb(peer_reads.answer(full.reader, owner, 1, msgpack.packb(nodes)))
        for n, (record, vector) in zip(nodes, got):
            assert (record is not None) == (owner(n) == 1 and n != "user:nobody")
            assert vector is None
        for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1, 2]),
                    msgpack.packb(["x"] * (peer_reads.MAX_IDS + 1))):
            with pytest.raises(ValueError):
                peer_reads.answer(full.reader, owner, 1, bad)
