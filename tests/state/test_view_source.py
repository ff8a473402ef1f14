"""Views sampled in a child process on a follower of the store (state.view_source)."""
import numpy as np
import pytest

from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.view_source import LocalViews, ViewProcess, ViewProcessError
from hirflow.state.views import STUDENT
from tests.state.helpers import apply_direct
from tests.state.view_world import DAY, T0, same_views, world

def test_the_child_samples_what_this_process_would_and_follows_new_commits(tmp_path):
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        writer = apply_direct(store, world(np.random.default_rng(3), 40, 30, 2000),
                              GraphConfig(path=str(tmp_path)))
        store.commit(knowledge={"ad:1": np.arange(384, dtype=np.float32)})
        anchors = [f"user:{i}" for i in range(12)] + ["ad:1", "ad:404"]
        cut = T0 + 31 * DAY
        child = ViewProcess(store, schema, STUDENT, seed=5)
        try:
            here = LocalViews(store, schema, STUDENT, seed=5).sample(anchors, cut)
            there = child.result(child.submit(anchors, cut))
            same_views(here.views, there.views)
            assert there.knowledge.keys() == here.knowledge.keys() and "ad:1" in there.knowledge
            np.testing.assert_array_equal(there.knowledge["ad:1"], here.knowledge["ad:1"])
            assert there.seconds > 0

            # committed after the child opened its follower: its next request sees it
            writer.apply(Engagement("user:999", "ad:1", "click", cut - 1000))
            writer.commit()
            first, second = child.submit(["user:999"], cut), child.submit(["ad:1"], cut)
            (ad,) = child.result(second).views       # answers may be taken out of order
            (user,) = child.result(first).views
            assert "user:999" in ad.nodes and user.nodes[:2] == ("user:999", "ad:1")
        finally:
            child.close()
        assert child.proc.returncode == 0


def test_a_dead_child_is_a_clear_error(tmp_path):
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        apply_direct(store, world(np.random.default_rng(4), n=200), GraphConfig(path=str(tmp_path)))
        child = ViewProcess(store, schema, STUDENT, seed=0)
        try:
            child.proc.kill()
            child.proc.wait()
            with pytest.raises(ViewProcessError, match="exited"):
                child.sample(["user:1"], T0 + 31 * DAY)
        finally:
            child.close()


def test_a_follower_never_creates_a_store(tmp_path):
    with pytest.raises(ViewProcessError, match="no state store"):
        class Missing:      # a store object whose directory holds no database
            path = tmp_path / "nothing"
            keys = type("K", (), {"num_partitions": 4})()
        ViewProcess(Missing(), SchemaConfig(), STUDENT, seed=0)
    assert not (tmp_path / "nothing").exists()


def test_the_child_packs_the_views_it_sampled_as_this_process_would(tmp_path):
    from hirflow.encoder.batching import PackConfig, Packer, pack_arrays
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        apply_direct(store, world(np.random.default_rng(4), 30, 20, 1000), GraphConfig(path=str(tmp_path)))
        store.commit(knowledge={"ad:2": np.ones(384, dtype=np.float32)})
        anchors, cut = [f"user:{i}" for i in range(10)] + ["ad:2"], T0 + 31 * DAY
        child = ViewProcess(store, schema, STUDENT, seed=5)
        try:
            there = child.sample(anchors, cut, prepare=Packer(PackConfig()))
            assert child.sample(anchors, cut).prepared is None      # no prepare, nothing made
        finally:
            child.close()
        here = LocalViews(store, schema, STUDENT, seed=5).sample(anchors, cut, Packer(PackConfig()))
    cfg, arrays = there.prepared
    assert cfg == PackConfig()
    for got in (arrays, here.prepared[1]):
        want = pack_arrays(there.views, cfg, there.knowledge)
        assert got.keys() == want.keys() and got["knowledge"][:, 0].any()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
