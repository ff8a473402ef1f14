"""The refresh loop on a real broker and store: records, postings, token changes, seq."""
from __future__ import annotations

import numpy as np
import pytest

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.events import Engagement, Entity
from hirflow.state.index import NO_PRIMITIVE
from hirflow.state.view_source import LocalViews
from hirflow.streams.subscribe import Subscriber
from tests.conftest import replace_section
from tests.streams.refresh_helpers import assert_index_matches_state, loop_over, settle


@pytest.fixture
def world_clock(monkeypatch, tiny_world):
    """The refresh loop's clock stopped 45 days after the tiny world's last event. Views see
    time-decayed weights as of that clock, and the world's dates are fixed, so with the wall
    clock what a move shows depends on the day the test runs: ten months on, a user's new
    engagements no longer change its tokens; within a week of the events, the tiny model's
    neighbour refreshes keep moving each other's tokens and do not come to rest in the
    test's time (measured with the clock stopped at 7, 30, 60 and 300 days: only 30 and 60
    pass). Stopped rather than running, so a node refreshed again from the same state gets
    the same tokens."""
    from hirflow.streams.refresh import loop as refresh
    origin = max(e.ts for e in tiny_world) + 45 * 86_400_000
    monkeypatch.setattr(refresh, "now_ms", lambda: origin)


def _collect(sub, want, tries=40):
    got = []
    for _ in range(tries):
        got += sub.poll(0.5)
        if want(got):
            break
    return got


def test_cold_start_serves_world_knowledge_and_type_and_publishes(cfg, tiny_world):
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        writer.entities.upsert(Entity("ad:a0", 1, "trail running shoes", None, None))
        writer.entities.set_knowledge("ad:a0", np.ones(384, np.float32))
        writer.entities.commit({})
        settle(loop)
        rec = loop.index.records(loop.gen, ["ad:a0"])[0]
        assert rec.model == "cold-start" and all(a == NO_PRIMITIVE for a in rec.assign)
        assert np.isclose(np.linalg.norm(rec.emb), 1.0) and len(rec.tokens) == loop.active.m
        assert not store.reader.dirty() and not writer.dirty
        assert_index_matches_state(loop)
        with Subscriber(cfg, group_id="t-cold") as sub:
            got = _collect(sub, lambda g: any(c.node == "ad:a0" for c in g))
        c = next(c for c in got if c.node == "ad:a0")
        assert c.seq == 1 and c.tokens == list(rec.tokens) and sorted(c.added) == sorted(c.tokens)
        assert c.ts >= c.event_ts
        assert not list(loop.index.outbox())
    finally:
        loop.close()
        store.close()


def _strongest(loop, node, t, level=1):
    w = loop.supergraph.node_primitives(loop.gen, node, level, t)
    return max(w, key=w.get) if w else None


def _by_assignment(loop, engagements, level=1):
    """The engagements' weights summed by where their ads are assigned now."""
    out: dict[int, float] = {}
    for e in engagements:
        p = int(loop.memory.assign[loop.memory.row(e.dst), level])
        out[p] = out.get(p, 0.0) + e.w
    return out


def _follows_the_ads(loop, user, engagements, t):
    """The user's super-graph row is its edges' weights by their ads' current primitives,
    and its strongest primitive is one of the heaviest of those (the tiny model can split
    the ads evenly over several primitives)."""
    want = _by_assignment(loop, engagements)
    got = loop.supergraph.node_primitives(loop.gen, user, 1, t)
    assert got == pytest.approx(want, rel=1e-3)
    top = max(want.values())
    assert _strongest(loop, user, t) in {p for p, w in want.items() if w > top * (1 - 1e-3)}


def test_user_moving_to_a_new_interest_changes_tokens_and_assignment(cfg, tiny_world, tiny_checkpoints,
                                                                      world_clock):
    """A new user engages ads of primitive A, then far more ads of primitive B: its strongest
    super-graph primitive follows, its tokens change and a subscriber receives each change
    in seq order. (The tiny test model puts every user in one coarse primitive whatever it
    engages with, and re-assigns the B ads once they share a user with A, so the test
    follows where the engaged ads are assigned now, through the super-graph.)"""
    cfg = replace_section(cfg, "refresh", checkpoint=str(tiny_checkpoints[0]))
    store, writer, loop = loop_over(cfg, tiny_world)
    try:
        settle(loop, 200)
        assert loop.active.id == tiny_checkpoints[0].name
        assert_index_matches_state(loop)
        ads = [n for n in loop.memory.ids if n.startswith("ad:")]
        by_prim: dict[int, list[str]] = {}
        for a in ads:                                 # groups of ads by their fine primitive
            by_prim.setdefault(int(loop.memory.assign[loop.memory.row(a), 1]), []).append(a)
        (p_a, ads_a), (p_b, ads_b) = sorted(by_prim.items(), key=lambda kv: -len(kv[1]))[:2]
        t = max(e.ts for e in tiny_world)
        user = "user:newcomer"
        first = [Engagement(user, a, "conversion", t + i, 5.0) for i, a in enumerate(ads_a[:8])]
        writer.apply_batch([(e, 3) for e in first])
        writer.commit()
        settle(loop)
        before = loop.index.records(loop.gen, [user])[0]
        _follows_the_ads(loop, user, first, t + 10)
        later = [Engagement(user, a, "conversion", t + 1000 + i, 50.0)
                 for i, a in enumerate(ads_b[:8]) for _ in range(3)]
        writer.apply_batch([(e, 3) for e in later])
        writer.commit()
        settle(loop)
        after = loop.index.records(loop.gen, [user])[0]
        _follows_the_ads(loop, user, first + later, t + 2000)
        assert after.seq > before.seq         # once as an endpoint, then as a neighbour of moved ads
        assert set(after.tokens) != set(before.tokens) or after.assign != before.assign
        p = _strongest(loop, user, t + 2000)
        assert loop.supergraph.related(loop.gen, 1, int(after.assign[1]), t + 2000, k=50) \
            or int(after.assign[1]) == p             # the user's primitive links to the ads'
        with Subscriber(cfg, group_id="t-move") as sub:
            got = _collect(sub, lambda g: any(c.node == user and c.seq == after.seq for c in g))
        mine = [c for c in got if c.node == user]
        seqs = [c.seq for c in mine]
        assert seqs == sorted(set(seqs)) and seqs[0] == 1 and seqs[-1] == after.seq
        assert mine[-1].assign == list(after.assign) and mine[-1].model == loop.active.id
        assert mine[-1].tokens == list(after.tokens)
        # each change after the move carries the time of an event of the move that caused it
        # (as an endpoint, or as a neighbour of an ad the move changed)
        moved = [c for c in mine if c.seq > before.seq]
        assert moved and all(later[0].ts <= c.event_ts <= later[-1].ts for c in moved)
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()


def test_no_change_is_published_when_nothing_visible_changed(cfg, tiny_world, tiny_checkpoints):
    cfg = replace_section(cfg, "refresh", checkpoint=str(tiny_checkpoints[0]), neighbor_rate=0.0)
    store, writer, loop = loop_over(cfg, tiny_world[:400])
    try:
        settle(loop, 100)
        seqs = {n: loop.index.published([n])[0][0] for n in loop.memory.ids[:20]}
        node = loop.memory.ids[0]
        loop.refresh({node: 1}, {})             # same state, same model: same tokens
        assert loop.index.published([node])[0][0] == seqs[node]
        assert not list(loop.index.outbox())
    finally:
        loop.close()
        store.close()


def test_a_node_dirtied_again_while_it_is_encoded_stays_dirty(cfg, tiny_world):
    store, writer, loop = loop_over(cfg, tiny_world[:200])
    try:
        claimed = writer.dirty.claim(10_000)
        node = next(iter(claimed))
        e = Engagement(node, "ad:late", "click", max(claimed.values()) + 10, 1.0)
        writer.apply_batch([(e, 3)])             # arrives while the batch is being encoded
        writer.commit()
        loop.refresh(claimed, claimed)
        assert node in writer.dirty and node in store.reader.dirty()
        settle(loop)
        assert not store.reader.dirty()
    finally:
        loop.close()
        store.close()


def test_a_node_claimed_again_by_the_batch_sampled_ahead_keeps_its_marker(cfg, tiny_world):
    """The next batch is claimed (and sampled by the child) while this one is encoded: a node
    in both keeps its durable marker until the later batch commits, so a crash in between
    loses nothing."""
    store, writer, loop = loop_over(cfg, tiny_world[:200])
    try:
        cur = loop._next_batch(wait=False)
        node = next(iter(cur.claimed))
        e = Engagement(node, "ad:late", "click", max(cur.claimed.values()) + 10, 1.0)
        writer.apply_batch([(e, 3)])
        writer.commit()
        sampled = loop.views.result(cur.ticket)
        loop._ahead = loop._next_batch(wait=False)
        assert node in loop._ahead.claimed and node not in writer.dirty
        loop.refresh(cur.nodes, cur.claimed, sampled)
        assert node in store.reader.dirty()
        assert not set(store.reader.dirty()) - {node, "ad:late"}
        ahead = loop._ahead
        assert loop.run_once() == len(ahead.nodes)
        assert loop.index.records(loop.gen, [node])[0].event_ts == e.ts
        settle(loop)
        assert not store.reader.dirty()
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()


def test_a_hub_touched_between_every_two_commits_is_refreshed_for_its_durable_part(cfg, tiny_world):
    """A node with uncommitted changes is claimed for what is already committed and stays
    dirty (durably too) for the rest; a node whose every pending event is uncommitted waits."""
    store, writer, loop = loop_over(cfg, tiny_world[:200])
    try:
        settle(loop)
        hub, t = loop.memory.ids[0], max(e.ts for e in tiny_world[:200])
        writer.apply_batch([(Engagement(hub, "ad:x1", "click", t + 10, 1.0), 3)])
        writer.commit()
        writer.apply_batch([(Engagement(hub, "ad:x2", "click", t + 20, 1.0), 3)])   # not durable
        claimed = writer.dirty.claim(10_000)
        assert claimed[hub] == t + 10 and writer.dirty[hub] == t + 20
        assert "ad:x1" in claimed and "ad:x2" not in claimed
        loop.refresh(claimed, claimed)
        assert loop.index.records(loop.gen, [hub])[0].event_ts == t + 10
        assert hub in store.reader.dirty() and "ad:x1" not in store.reader.dirty()
        writer.commit()
        writer.apply_batch([(Engagement("ad:x3", "ad:x4", "click", t + 30, 1.0), 3)])
        again = writer.dirty.claim(10_000)
        assert again[hub] == t + 20 and not {"ad:x3", "ad:x4"} & set(again)
        writer.dirty.unclaim(again)
        writer.commit()
        settle(loop)
        assert loop.index.records(loop.gen, [hub])[0].event_ts == t + 20
        assert not store.reader.dirty() and not writer.dirty
    finally:
        loop.close()
        store.close()


def test_refresh_on_cpu_uses_the_configured_torch_threads(cfg):
    import torch
    for threads, want in ((1, 1), (0, 2)):
        torch.set_num_threads(2)
        store, _, loop = loop_over(replace_section(cfg, "refresh", cpu_threads=threads, device="cpu"))
        try:
            assert torch.get_num_threads() == want
        finally:
            loop.close()
            store.close()


def test_cli_subscribe_prints_changes_and_export_writes_the_index(cfg, tiny_world, tmp_path):
    import json

    from click.testing import CliRunner

    from hirflow.streams.tools.cli import cli
    store, writer, loop = loop_over(cfg, tiny_world[:200])
    try:
        settle(loop)
        n = len(loop.memory)
    finally:
        loop.close()
        store.close()
    base = ["--bootstrap", cfg.kafka.bootstrap, "--topic-prefix", cfg.kafka.topic_prefix,
            "--partitions", str(cfg.kafka.partitions), "--state", cfg.graph.path]
    r = CliRunner().invoke(cli, base + ["subscribe", "--count", "3", "--idle-stop", "10"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 3 and all({"node", "seq", "tokens", "event_ts", "ts"} <= set(x) for x in lines)
    r = CliRunner().invoke(cli, base + ["export", "--out", str(tmp_path / "e.npz"), "--type", "user"])
    assert r.exit_code == 0, r.output
    d = np.load(tmp_path / "e.npz")
    assert 0 < len(d["ids"]) < n and all(i.startswith("user:") for i in d["ids"])
    assert d["emb"].shape == (len(d["ids"]), 64) and d["tokens"].shape[1] == 8
    r = CliRunner().invoke(cli, base + ["export", "--out", str(tmp_path / "e.jsonl")])
    assert r.exit_code == 0 and len((tmp_path / "e.jsonl").read_text().splitlines()) == n


def test_neighbours_of_a_moved_node_are_queued_once_and_served_by_a_dirty_claim(cfg, tiny_world):
    """The heaviest neighbours of a node whose tokens moved are queued with its event time,
    except those refreshed in the same batch (their views already see the event); a queued
    neighbour that turns dirty is refreshed once, as an endpoint (its own event time)."""
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        settle(loop)
        states = store.reader.states(loop.memory.ids)
        hub = max((s for s in states if s is not None), key=lambda s: len(s.edges))
        heavy = [nbr for (nbr, _a, _d), _ in
                 sorted(hub.edges.items(), key=lambda kv: -abs(kv[1][0]))][:loop.rcfg.neighbors_per_node]
        heavy = list(dict.fromkeys(heavy))
        assert len(heavy) >= 2
        edges = EdgeColumns.from_states([hub.id], {hub.id: hub}, store.schema.action_codes())
        loop.neighbors.queue([0], edges, {hub.id: 5, heavy[0]: 5}, skip={})
        waiting = loop.neighbors.waiting()
        assert list(waiting) == heavy[1:] and set(waiting.values()) == {5}
        nbr = heavy[1]
        writer.apply_batch([(Engagement(nbr, "ad:fresh", "click", 9_000, 1.0), 3)])
        writer.commit()
        loop.run_once()
        assert nbr not in loop.neighbors
        assert loop.index.records(loop.gen, [nbr])[0].event_ts == 9_000
    finally:
        loop.close()
        store.close()


def test_sampling_in_the_refresh_thread_gives_the_same_pipeline(cfg, tiny_world):
    """`refresh.sample_process: false`: the same claims, batch ahead and markers, with the
    views sampled in the refresh thread (no child process)."""
    cfg = replace_section(cfg, "refresh", sample_process=False)
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        assert isinstance(loop.views, LocalViews)
        settle(loop)
        assert loop.refreshed and not store.reader.dirty() and not writer.dirty
        assert not list(loop.index.outbox())
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()


def test_two_sampling_processes_share_each_batch_and_encode_as_one(cfg, tiny_world, tiny_checkpoints):
    """`refresh.sample_processes: 2`: each batch is sampled in two parts, packed where it was
    sampled and encoded part by part; the embeddings are those of encoding the whole batch's
    views at once, and the pipeline settles as with one process."""
    from hirflow.state.view_pool import PreparedParts, ViewPool
    cfg = replace_section(cfg, "refresh", sample_processes=2, checkpoint=str(tiny_checkpoints[1]))
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        assert isinstance(loop.views, ViewPool) and len(loop.views) == 2
        ids = sorted(store.reader.node_ids())[:120]
        sampled = loop.views.sample(ids, max(e.ts for e in tiny_world[:300]), loop.active.packer)
        assert isinstance(sampled.prepared, PreparedParts) and len(sampled.prepared.parts) == 2
        parts = loop.active.encode(sampled.views, sampled.knowledge, sampled.prepared, sampled.edges)
        whole = loop.active.encode(sampled.views, sampled.knowledge, None, sampled.edges)
        assert np.allclose(parts[0], whole[0], atol=1e-5)
        assert np.array_equal(parts[1], whole[1])
        settle(loop)
        assert loop.refreshed and not store.reader.dirty() and not writer.dirty
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()


def test_spent_idle_nodes_expire_with_their_index_entries_and_come_back_with_the_next_seq(
        cfg, tiny_world, tiny_checkpoints):
    """Retention: nodes idle for `expire_after_days` whose edges have all decayed leave the
    store and the index (records, postings, memberships, super-graph rows, the in-memory
    index), subscribers get a change without tokens, a node with an entity keeps serving,
    and a node that is engaged again returns with the next seq."""
    import time

    from hirflow.state.supergraph import _node_key
    cfg = replace_section(cfg, "graph", expire_after_days=30.0)
    cfg = replace_section(cfg, "refresh", checkpoint=str(tiny_checkpoints[0]))
    events = tiny_world[:400]                     # January 2026: long idle, all decayed
    store, writer, loop = loop_over(cfg, events)
    try:
        writer.entities.upsert(Entity("ad:a0", events[0].ts, "catalogue text"))
        writer.entities.commit({})
        settle(loop, 100, 5)
        before = set(loop.memory.live_ids())
        seqs = dict(zip(before, (p[0] for p in loop.index.published(sorted(before)))))
        expired = []
        for _ in range(50):                       # the sweep walks the store a slice at a time
            expired += writer.expire_slice(int(time.time() * 1000))
            if writer.retention.after is None and expired:
                break
        assert expired and not set(expired) & set(store.reader.node_ids())   # "owns" edges
        # never decay, so owners stay; users' and items' clicks and views are spent
        settle(loop, 100, 5)
        gone = set(expired) - {"ad:a0"}                            # its entity keeps it served
        assert not set(loop.memory.live_ids()) & gone
        assert "ad:a0" in loop.memory.live_ids()
        assert all(r is None for r in loop.index.records(loop.gen, sorted(gone)))
        keys = {store.keys.key(n) for n in gone}
        assert not [k for k, _ in loop.index._scan("postings", b"") if k[-10:] in keys]
        assert not [n for n in gone if loop.supergraph.cf.get(_node_key(loop.gen, store.keys.key(n)))]
        for n, pub in zip(sorted(gone), loop.index.published(sorted(gone))):
            assert pub[0] == seqs[n] + 1 and pub[2] == []          # told: no tokens
        back = next(iter(sorted(gone & {e.src for e in events})))
        writer.apply_batch([(Engagement(back, "ad:new", "click", int(time.time() * 1000)), 3)])
        writer.commit()
        settle(loop, 100, 5)
        assert loop.index.published([back])[0][0] == seqs[back] + 2 and back in loop.memory.live_ids()
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()


def test_token_changes_survive_a_broker_that_comes_back_without_its_state(tmp_path, tiny_world,
                                                                          monkeypatch):
    """The broker killed while changes are on their way and started again empty (the
    embedded broker keeps nothing): the refresh loop never stops; past the acknowledgement
    deadline a new producer sends the outbox again, and once the broker answers every change
    is acknowledged and delivered."""
    import os
    import signal

    from hirflow.streams.refresh import token_outbox
    from hirflow.streams.broker import EmbeddedBroker
    from hirflow.streams.metrics import OUTBOX_RESENDS
    from hirflow.streams.topics import Topics, ensure_topics
    from tests.conftest import make_config
    monkeypatch.setattr(token_outbox, "ACK_DEADLINE_S", 1.0)
    b = EmbeddedBroker().start()
    cfg = make_config(tmp_path, bootstrap=b.bootstrap, partitions=1)
    ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        settle(loop)
        resends = OUTBOX_RESENDS._value.get()
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
        for i in range(3):
            writer.entities.upsert(Entity(f"ad:x{i}", 1, f"new product {i}", None, None))
            writer.entities.set_knowledge(f"ad:x{i}", np.full(384, i + 1.0, np.float32))
        writer.entities.commit({})
        for _ in range(4):
            loop.run_once()                     # changes into the outbox, no acks: no stop
        assert list(loop.index.outbox()) and OUTBOX_RESENDS._value.get() > resends
        b.start()
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
        settle(loop, seconds=60)
        assert not list(loop.index.outbox())
        with Subscriber(cfg, group_id="t-back") as sub:
            got = _collect(sub, lambda g: {f"ad:x{i}" for i in range(3)} <= {c.node for c in g})
        assert {f"ad:x{i}" for i in range(3)} <= {c.node for c in got}
    finally:
        loop.close()
        store.close()
        b.stop()
