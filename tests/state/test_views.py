import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, TEACHER, ViewSampler
from tests.state.helpers import apply_direct
from tests.state.view_world import DAY, T0, world



@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 30))
def test_no_edge_newer_than_the_cutoff(tmp_path_factory, seed, cutoff_day):
    rng = np.random.default_rng(seed)
    evs = world(rng)
    cutoff = T0 + cutoff_day * DAY
    first_seen = {}
    for e in evs:
        k = (e.src, e.dst, e.action)
        first_seen[k] = min(first_seen.get(k, e.ts), e.ts)
    path = tmp_path_factory.mktemp("views")
    with GraphStore(path, SchemaConfig(), 4) as store:
        apply_direct(store, evs, GraphConfig(path=str(path)))
        actions = sorted(SchemaConfig().all_actions)
        for cfg in (STUDENT, TEACHER):
            sampler = ViewSampler(store.reader, SchemaConfig(), cfg, seed=seed)
            for v in sampler.sample([f"user:{i}" for i in range(5)] + ["ad:1"], cutoff):
                assert v.nodes[0] == v.anchor and v.size <= cfg.max_nodes
                assert len(set(v.nodes)) == v.size
                for s, d, a, age in zip(v.edge_src, v.edge_dst, v.edge_action, v.edge_age):
                    key = (v.nodes[s], v.nodes[d], actions[a])
                    assert first_seen[key] <= cutoff          # never an edge from the future
                    assert age >= 0
                assert v.hop[0] == 0 and (v.hop[1:] >= 1).all()


def test_teacher_views_are_broader_than_student_views(tmp_path):
    rng = np.random.default_rng(1)
    with GraphStore(tmp_path, SchemaConfig(), 4) as store:
        apply_direct(store, world(rng, 60, 40, 3000), GraphConfig(path=str(tmp_path)))
        anchors = [f"user:{i}" for i in range(10)]
        cut = T0 + 31 * DAY
        t = ViewSampler(store.reader, SchemaConfig(), TEACHER).sample(anchors, cut)
        s = ViewSampler(store.reader, SchemaConfig(), STUDENT).sample(anchors, cut)
        assert np.mean([v.size for v in t]) > 2 * np.mean([v.size for v in s])
        assert max(v.size for v in s) <= STUDENT.max_nodes


def test_a_cold_view_is_the_anchor_alone_without_behaviour(tmp_path):
    from hirflow.encoder.batching import PackConfig, pack
    from hirflow.state.views import cold_view
    rng = np.random.default_rng(2)
    with GraphStore(tmp_path, SchemaConfig(), 4) as store:
        apply_direct(store, world(rng, 20, 10, 800), GraphConfig(path=str(tmp_path)))
        full = ViewSampler(store.reader, SchemaConfig(), STUDENT).sample(["ad:1"], T0 + 31 * DAY)[0]
    cold = cold_view(full)
    assert full.size > 1 and full.stats[0].any()
    assert cold.nodes == ("ad:1",) and cold.types[0] == full.types[0] and len(cold.edge_src) == 0
    assert not cold.stats.any()
    b = pack([cold, full], PackConfig())
    assert not bool(b.frequent[0]) and bool(b.frequent[1])      # no hash-id embedding when cold


def test_deferred_invalidation_samples_the_new_state_and_frees_on_release(tmp_path):
    rng = np.random.default_rng(3)
    evs = world(rng, 20, 10, 800)
    with GraphStore(tmp_path, SchemaConfig(), 4) as store:
        apply_direct(store, evs[:400], GraphConfig(path=str(tmp_path)))
        anchors = [f"user:{i}" for i in range(8)]
        cut = T0 + 31 * DAY
        now = ViewSampler(store.reader, SchemaConfig(), STUDENT, seed=5)
        later = ViewSampler(store.reader, SchemaConfig(), STUDENT, seed=5)
        for s in (now, later):
            s.sample(anchors, cut)                     # fills the caches
        apply_direct(store, evs[400:], GraphConfig(path=str(tmp_path)))
        now.invalidate(anchors)
        later.invalidate(anchors, defer_free=True)
        assert len(later.cache.retired) == len(anchors)     # set aside, not freed yet
        a, b = now.sample(anchors, cut), later.sample(anchors, cut)
        for x, y in zip(a, b):                         # the new state, as if freed at once
            assert x.nodes == y.nodes and np.array_equal(x.edge_weight, y.edge_weight)
        assert sum(x.edge_weight.size for x in a) > 0
        later.release()
        assert later.cache.retired == []


def test_table_rows_match_their_definition_edge_by_edge(tmp_path):
    """What sampling knows of a node as of a cutoff, restated one edge at a time: only edges
    that existed then, weights decayed to it, each neighbour ranked by its best edge's
    |weight| x recency (ties by name, descending; only the head kept), the edges sorted by
    neighbour, degrees, and the recent-edges stat (each edge's recency summed)."""
    import math

    from hirflow.state.adjacency_table import EDGE_DTYPE
    from hirflow.state.node import IN, OUT
    rng = np.random.default_rng(3)
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        apply_direct(store, world(rng, 8, 30, 1500), GraphConfig(path=str(tmp_path)))
        sampler = ViewSampler(store.reader, schema, STUDENT)
        table = sampler.table
        rates = {a: spec.decay_rate for a, spec in schema.all_actions.items()}
        codes = schema.action_codes()
        rec = math.log(2) / (STUDENT.recency_half_life_s * 1000.0)
        nodes = [f"user:{i}" for i in range(8)] + ["ad:3"]
        for cutoff in (T0 + 3 * DAY, T0 + 15 * DAY, T0 + 40 * DAY):
            states = store.reader.states(nodes)
            ids = table.intern(nodes)
            table.compute(ids, states, cutoff)
            for s, i in zip(states, ids):
                best, rows, deg, recent = {}, [], {OUT: 0, IN: 0}, 0.0
                for (nbr, action, d), (w, tref, _, first) in s.edges.items():
                    if first > cutoff:
                        continue
                    dt = max(0, cutoff - tref)
                    wt = w * math.exp(-rates[action] * dt)
                    imp = abs(wt) * math.exp(-rec * dt)
                    recent += math.exp(-rec * dt)
                    if imp > best.get(nbr, 0.0):
                        best[nbr] = imp
                    rows.append((nbr, codes[action], d, wt, dt / 1000.0))
                    deg[d] += 1
                want = sorted(((v, n) for n, v in best.items()), reverse=True)[:table.width]
                n_top = table.top_len[i]
                assert n_top == len(want)
                assert [table.names[x] for x in table.top[i, :n_top]] == [n for _, n in want]
                assert np.allclose(table.importance[i, :n_top], [v for v, _ in want], rtol=1e-12)
                assert np.allclose(table.cumulative[i, :n_top], np.cumsum([v for v, _ in want]), rtol=1e-12)
                got = table.edges[i].view(EDGE_DTYPE).reshape(-1)
                names = [table.names[x] for x in got["nbr"]]
                assert names == sorted(names, key=table.ids.__getitem__)      # by neighbour
                got_rows = sorted(zip(names, got["action"].tolist(), got["dir"].tolist()))
                assert got_rows == sorted((r[0], r[1], r[2]) for r in rows)
                by_key = {(r[0], r[1], r[2]): r for r in rows}
                for n, a, d, w, age in zip(names, got["action"], got["dir"], got["weight"], got["age"]):
                    r = by_key[(n, int(a), int(d))]
                    assert np.isclose(w, r[3], rtol=1e-6) and np.isclose(age, r[4], rtol=1e-6)
                st = table.stats[i]
                assert np.isclose(st[1], math.log1p(deg[OUT])) and np.isclose(st[2], math.log1p(deg[IN]))
                assert np.isclose(st[6], math.log1p(recent), rtol=1e-6)
                assert st[0] == np.float32(math.log1p(s.events))


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 6), requests=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=10),
                                                  min_size=1, max_size=6))
def test_the_record_cache_answers_every_request_whatever_its_size(size, requests):
    """A request holding cached ids that are the oldest, or more ids than the cache holds,
    still gets every record (the cache forgets after answering)."""
    from hirflow.state.views import RecordCache

    class Reader:
        def states(self, ids):
            return [f"state of {n}" for n in ids]

    cache = RecordCache(Reader(), size)
    for req in requests:
        ids = [f"n:{i}" for i in req]
        assert cache.get(ids) == {n: f"state of {n}" for n in ids}
        assert len(cache._records) <= size
