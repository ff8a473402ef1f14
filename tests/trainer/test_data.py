"""Reading up to a cutoff on the real (embedded) broker, chronological windows, chunk shuffles."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement, Validator
from hirflow.streams.tools.replay import produce
from hirflow.streams.topics import Topics
from hirflow.trainer.data import chronological_windows, read_topic, split

T0 = 1_767_225_600_000
HOUR = 3_600_000


def test_reads_exactly_the_events_up_to_the_cutoff(cfg):
    rng = np.random.default_rng(0)
    evs = sorted((Engagement(f"user:{rng.integers(50)}", f"ad:{rng.integers(20)}", "click",
                             int(T0 + rng.integers(0, 48 * HOUR))) for _ in range(3000)),
                 key=lambda e: e.ts)
    produce(cfg, evs, progress=False)
    cutoff, start = T0 + 30 * HOUR, T0 + 6 * HOUR
    stats = []
    got = list(read_topic({"bootstrap.servers": cfg.kafka.bootstrap}, Topics(cfg.kafka.topic_prefix).engagements,
                          Validator(cfg.schema), cutoff, start_ms=start, idle_s=1.0, stats_out=stats))
    want = [e for e in evs if start <= e.ts <= cutoff]
    assert sorted(got, key=lambda e: (e.ts, e.src, e.dst)) == sorted(want, key=lambda e: (e.ts, e.src, e.dst))
    assert all(e.ts <= cutoff for e in got)
    assert stats[0].used == len(want)


def test_windows_are_consecutive_and_chunks_only_shuffle_inside():
    ts = np.arange(0, 100 * HOUR, HOUR // 2)
    w = chronological_windows(ts.tolist(), train=0.7, val=0.1)
    assert w.start < w.train_end < w.val_end < w.end
    parts = split([Engagement("user:1", "ad:1", "click", int(t)) for t in ts], w)
    assert max(e.ts for e in parts["train"]) < min(e.ts for e in parts["val"])
    assert max(e.ts for e in parts["val"]) < min(e.ts for e in parts["test"])
    skewed = np.concatenate([[-1000 * HOUR], ts])          # one months-early outlier stamp
    ws = chronological_windows(skewed.tolist(), train=0.7, val=0.1)
    assert 0.65 < np.mean(skewed < ws.train_end) < 0.75       # still 70% of the events


def test_chunk_plan_passes_reshuffle_each_chunk():
    from hirflow.trainer.pipeline import chunk_plan
    evs = [Engagement(f"user:{i % 7}", f"ad:{i % 5}", "click", T0 + i * HOUR // 4) for i in range(400)]
    one = chunk_plan(evs, 24 * HOUR, 16, 100, seed=0)
    two = chunk_plan(evs, 24 * HOUR, 16, 100, seed=0, passes=2)
    assert len(one[0]) == 1 and len(two[0]) == 1                # the first chunk only builds state
    for a, b in zip(one[1:], two[1:]):
        assert (a[0] == b[0]).all() and len(b) - 1 == 2 * (len(a) - 1)
        n = len(a) - 1
        firsts, seconds = np.concatenate(b[1:1 + n]), np.concatenate(b[1 + n:])
        assert sorted(firsts) == sorted(seconds) == sorted(a[0])   # each pass covers the chunk once
        assert not (firsts == seconds).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 100 * HOUR), min_size=2, max_size=300),
       st.integers(1, 48), st.lists(st.integers(0, 100 * HOUR), max_size=3))
def test_chunks_are_time_ordered_at_most_chunk_long_and_begin_at_every_cut(offsets, hours, cuts):
    from hirflow.trainer.pipeline import chunk_plan
    evs = [Engagement(f"user:{i % 7}", f"ad:{i % 5}", "click", T0 + o)
           for i, o in enumerate(sorted(offsets))]
    cuts = [T0 + c for c in cuts]
    plan = chunk_plan(evs, hours * HOUR, 16, None, seed=0, cuts=cuts)
    chunks = [[evs[i].ts for i in p[0]] for p in plan]
    first = evs[0].ts                                            # chunks count from the first event
    assert sum(len(c) for c in chunks) == len(evs)
    for a, b in zip(chunks, chunks[1:]):
        assert max(a) < min(b)                                   # in time order
        assert (min(b) - first) // (hours * HOUR) > (max(a) - first) // (hours * HOUR) or \
            any(max(a) < c <= min(b) for c in cuts)              # a boundary or a cut between
    for c in chunks:
        assert (max(c) - first) // (hours * HOUR) == (min(c) - first) // (hours * HOUR)
        assert not any(min(c) < cut <= max(c) for cut in cuts)   # no chunk spans a cut
