"""Retrieval before the first checkpoint: a user's co-users vote for their other items."""
import time

from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, ViewSampler
from hirflow.state.writer import BOTH_SIDES, GraphWriter
from hirflow.streams.api.neighbourhood import neighbourhood_items


def sampler_of(tmp_path, events):
    schema = SchemaConfig()
    store = GraphStore(tmp_path / "s", schema, 1)
    w = GraphWriter(store, GraphConfig(path=str(tmp_path / "s")))
    w.apply_batch([(e, BOTH_SIDES) for e in events])
    w.commit()

    def view_of(node, cutoff, seed):
        return ViewSampler(store.reader, schema, STUDENT, seed=seed).sample([node], cutoff)[0]
    return store, view_of, list(schema.all_node_types)


def test_co_users_items_come_first_and_the_users_own_never(tmp_path):
    now = int(time.time() * 1000)
    evs = [Engagement("user:me", "ad:a", "click", now - 5000), Engagement("user:me", "ad:b", "click", now - 4000)]
    # two users who share both of my ads and like ad:x; one who shares one and likes ad:y;
    # a stranger who likes ad:z only
    for u in ("user:p", "user:q"):
        evs += [Engagement(u, "ad:a", "click", now - 3000), Engagement(u, "ad:b", "click", now - 3000),
                Engagement(u, "ad:x", "click", now - 2000)]
    evs += [Engagement("user:r", "ad:a", "click", now - 3000), Engagement("user:r", "ad:y", "click", now - 2000),
            Engagement("user:s", "ad:z", "click", now - 1000)]
    store, view_of, types = sampler_of(tmp_path, evs)
    try:
        got = neighbourhood_items(view_of, "user:me", now, 10, ("ad",), types)
        names = [n for n, _ in got]
        assert names[:2] == ["ad:x", "ad:y"] and got[0][1] == 1.0 > got[1][1] > 0
        assert not {"ad:a", "ad:b", "ad:z"} & set(names)
        assert neighbourhood_items(view_of, "user:s", now, 10, ("ad",), types) == []    # nobody shares
        assert neighbourhood_items(view_of, "user:me", now, 1, ("ad",), types) == got[:1]
    finally:
        store.close()
