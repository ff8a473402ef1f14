"""Build a store from events and a refresh loop over it, for refresh tests."""
from __future__ import annotations

import time

from hirflow.state.graph import GraphStore
from hirflow.state.writer import BOTH_SIDES, GraphWriter
from hirflow.streams.refresh.loop import RefreshLoop
from hirflow.streams.topics import Topics


def loop_over(cfg, events=(), store=None):
    store = store or GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions)
    writer = GraphWriter(store, cfg.graph)
    if events:
        writer.apply_batch([(e, BOTH_SIDES) for e in events])
        writer.commit()
    return store, writer, RefreshLoop(cfg, store, writer, Topics(cfg.kafka.topic_prefix))


def settle(loop, rounds: int = 50, seconds: float = 90.0) -> None:
    """Run the loop until no dirty node, neighbour or swap work is left.

    Neighbour refreshes are paced by `refresh.neighbor_rate` per second, so on a loaded
    machine fast rounds take few neighbours each: give up only after both `rounds` rounds and
    `seconds` of wall time."""
    deadline = time.monotonic() + seconds
    i = 0
    while i < rounds or time.monotonic() < deadline:
        loop.run_once()
        i += 1
        if loop.idle:
            return
    raise AssertionError(f"refresh did not settle in {i} rounds: {len(loop.writer.dirty)} dirty, "
                         f"{len(loop.neighbors)} neighbours queued, building {loop.building}")


def assert_index_matches_state(loop) -> None:
    """Every posting belongs to a node's current tokens and vice versa; memory == RocksDB."""
    ix, gen = loop.index, loop.gen
    recs = {r.node: r for r in ix.iter_records(gen)}
    want = sorted((gen, t, loop.store.keys.key(n)) for n, r in recs.items() for t in r.tokens)
    have = []
    for k, _ in ix._scan("postings", gen.to_bytes(2, "big")):
        have.append((gen, int.from_bytes(k[2:6], "big"), k[-10:]))
    assert sorted(have) == want
    assert set(loop.memory.live_ids()) == set(recs)
    for n, r in recs.items():
        row = loop.memory.row(n)
        assert loop.memory.tokens[row].tolist() == list(r.tokens)
        assert loop.memory.assign[row].tolist() == list(r.assign)
