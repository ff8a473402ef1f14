"""Several sampling processes sampling one batch together (state.view_pool)."""
import numpy as np
import pytest

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.view_pool import PreparedParts, ViewPool
from hirflow.state.view_source import LocalViews
from hirflow.state.views import STUDENT
from tests.state.helpers import apply_direct
from tests.state.view_world import DAY, T0, same_views, world


def test_each_process_samples_its_part_and_the_batch_comes_back_in_order(tmp_path):
    """Two processes, seeds 5 and 6: each part equals what a sampler of that seed makes of
    it here, the joined adjacencies equal the whole batch's, a small batch goes to one."""
    from hirflow.encoder.batching import PackConfig, Packer
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        apply_direct(store, world(np.random.default_rng(3), 40, 30, 2000), GraphConfig(path=str(tmp_path)))
        store.commit(knowledge={"ad:1": np.arange(384, dtype=np.float32)})
        ids = [f"user:{i}" for i in range(40)] + [f"ad:{i}" for i in range(30)] + ["ad:404"]
        cut = T0 + 31 * DAY
        pool = ViewPool(store, schema, STUDENT, seed=5, processes=2, min_chunk=8)
        try:
            got = pool.result(pool.submit(ids, cut, Packer(PackConfig())))
            half = round(len(ids) / 2)
            for seed, part in ((5, ids[:half]), (6, ids[half:])):
                here = LocalViews(store, schema, STUDENT, seed=seed).sample(part, cut)
                mine = got.views[:half] if seed == 5 else got.views[half:]
                same_views(mine, here.views)
            assert [v.anchor for v in got.views] == ids
            assert "ad:1" in got.knowledge
            assert isinstance(got.prepared, PreparedParts) and got.prepared.sizes == [half, len(ids) - half]
            local = LocalViews(store, schema, STUDENT, seed=5)
            whole = EdgeColumns.from_states(ids, local.sampler.records(ids), schema.action_codes())
            assert got.edges.nodes == whole.nodes and np.array_equal(got.edges.bounds, whole.bounds)
            assert [got.edges.names[i] for i in got.edges.nbr] == [whole.names[i] for i in whole.nbr]

            small = pool.sample(ids[:10], cut, Packer(PackConfig()))   # under two chunks: one part
            assert [v.anchor for v in small.views] == ids[:10] and not isinstance(small.prepared, PreparedParts)
        finally:
            pool.close()
        assert all(c.proc.returncode == 0 for c in pool.children)


def test_a_changed_node_is_read_again_by_every_process(tmp_path):
    """A node that changed is dropped from every process's cache, also from one that only
    holds it as a neighbour of an earlier view and samples nothing of this batch."""
    schema = SchemaConfig()
    with GraphStore(tmp_path, schema, 4) as store:
        writer = apply_direct(store, [Engagement("user:a", "ad:x", "click", T0),
                                      Engagement("user:b", "ad:x", "click", T0)],
                              GraphConfig(path=str(tmp_path)))
        cut = T0 + DAY
        pool = ViewPool(store, schema, STUDENT, seed=0, processes=2, min_chunk=1)
        try:
            first = pool.sample(["user:a", "user:b"], cut)       # process 1 caches ad:x
            before = first.views[1].stats[first.views[1].nodes.index("ad:x")]
            for i in range(5):
                writer.apply(Engagement(f"user:n{i}", "ad:x", "click", T0 + 1000 + i))
            writer.commit()
            pool.sample(["ad:x"], cut)                           # process 0 alone samples it
            again = pool.sample(["user:a", "user:b"], cut, None)
            view = again.views[1]
            after = view.stats[view.nodes.index("ad:x")]
            assert after[0] > before[0]                          # its events count moved on
        finally:
            pool.close()


def test_a_pool_needs_a_process():
    with pytest.raises(ValueError, match="at least one process"):
        ViewPool(None, SchemaConfig(), STUDENT, seed=0, processes=0)
