"""Retrieval from the in-memory index: candidates keep the true neighbours, the IVF layout
stays consistent through updates and compactions."""
import numpy as np

from hirflow.encoder.quantize import BoMQuantizer
from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.state.memindex import MemoryIndex
from testkit.memindex import bulk_load


def _world(n=6000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, d)).astype(np.float32)
    x = centres[rng.integers(0, 64, n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    quant = BoMQuantizer(d, QuantizerConfig(m=4, nbits=6, train_size=n)).train(x)
    return x, quant


def _index(x, quant, codebooks=True):
    ix = MemoryIndex(0, "t", x.shape[1], 4, 1, ["ad"], nbits=6,
                     codebooks=quant.codebooks_array() if codebooks else None)
    bulk_load(ix, [f"ad:{i}" for i in range(len(x))], x, quant.tokens(x), np.zeros((len(x), 1), np.int32))
    return ix


def _recall(ix, x, quant, queries, k, **kw):
    hits = []
    for q in queries:
        got = {int(i.split(":")[1]) for i, _ in ix.search(x[q], quant.tokens(x[q:q + 1])[0].tolist(), k, **kw)}
        want = set(np.argsort(-(x @ x[q]))[:k].tolist())
        hits.append(len(got & want) / k)
    return float(np.mean(hits))


def test_probed_cells_and_postings_keep_the_neighbours_under_a_small_cut():
    x, quant = _world()
    ix = _index(x, quant)
    queries = range(0, 6000, 150)
    # all 64 first-codebook cells probed: every row scored exactly, whatever the cut
    assert _recall(ix, x, quant, queries, 20, probes=64, max_candidates=120) == 1.0
    # no probes: the query's own cell, plus the postings of its other tokens, all scored
    # exactly and cut to 2% of the items
    cut = _recall(ix, x, quant, queries, 20, probes=0, max_candidates=120)
    assert cut >= 0.9, cut
    # cutting by shared tokens before scoring (no codebooks: cold start) is the weaker rule
    weak = _recall(_index(x, quant, codebooks=False), x, quant, queries, 20, max_candidates=120)
    assert cut > weak


def test_compaction_lays_each_cell_out_contiguously_and_keeps_every_node():
    x, quant = _world(n=3000)
    ix = _index(x, quant)
    first = ix.tokens[:ix.n, 0]
    assert (np.diff(first) >= 0).all()                  # rows ordered by first token
    for c in np.unique(first)[:5]:
        s, e = ix.cells.block(c)
        assert (first[s:e] == c).all() and e - s == (first == c).sum()
    for i in range(0, 3000, 97):                        # ids, rows and arrays still agree
        got = ix.get(f"ad:{i}")
        assert np.allclose(got["embedding"], x[i]) and got["tokens"] == quant.tokens(x[i:i + 1])[0].tolist()


def test_results_are_sorted_by_exact_inner_product_and_exclude_the_query():
    x, quant = _world(n=2000)
    ix = _index(x, quant)
    res = ix.search(x[5], quant.tokens(x[5:6])[0].tolist(), 10, exclude=["ad:5"], probes=8)
    scores = [s for _, s in res]
    assert "ad:5" not in [i for i, _ in res] and scores == sorted(scores, reverse=True)
    for node, s in res:
        assert abs(float(x[int(node.split(":")[1])] @ x[5]) - s) < 1e-5


def test_updates_between_compactions_are_found_and_stale_cells_are_not():
    """Rows that move to another cell, change other tokens or arrive after the last compaction
    are retrieved with their current tokens; the cell they left does not return them."""
    x, quant = _world(n=3000)
    ix = _index(x, quant)
    toks = quant.tokens(x)
    rng = np.random.default_rng(3)
    moved = rng.choice(3000, 300, replace=False)
    new = x[rng.choice(3000, 300, replace=False)] + 0.01      # new positions near other items
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    for r, v in zip(moved, new):
        ix.upsert(f"ad:{r}", v, quant.tokens(v[None])[0].tolist(), [0], 1)
        x[r], toks[r] = v, quant.tokens(v[None])[0]
    fresh = x[rng.choice(3000, 50, replace=False)] + 0.01
    fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
    for i, v in enumerate(fresh):
        ix.upsert(f"ad:{3000 + i}", v, quant.tokens(v[None])[0].tolist(), [0], 1)
    x = np.concatenate([x, fresh])
    assert ix.postings.pending and ix.cells.laid         # not compacted: both paths in use
    for q in list(moved[:20]) + list(range(3000, 3020)):
        res = ix.search(x[q], quant.tokens(x[q:q + 1])[0].tolist(), 10, probes=64,
                        max_candidates=10_000)
        assert len({i for i, _ in res}) == len(res)     # a row left behind in a cell: twice
        exact = np.sort(x @ x[q])[::-1][:10]            # near-copies tie: compare scores
        assert np.allclose([s for _, s in res], exact, atol=1e-5)
        for node, s in res:                              # scored with current embeddings
            assert abs(float(x[int(node.split(":")[1])] @ x[q]) - s) < 1e-5


def test_a_row_that_leaves_its_cell_and_returns_is_found_once():
    x, quant = _world(n=2000)
    ix = _index(x, quant)
    toks = quant.tokens(x)
    r = 7
    other = int(np.flatnonzero(toks[:, 0] != toks[r, 0])[0])
    ix.upsert(f"ad:{r}", x[other], toks[other].tolist(), [0], 1)     # moves to another cell
    ix.upsert(f"ad:{r}", x[r], toks[r].tolist(), [0], 2)             # and back
    res = ix.search(x[r], toks[r].tolist(), 50, probes=64, max_candidates=10_000)
    nodes = [i for i, _ in res]
    assert nodes.count(f"ad:{r}") == 1 and len(set(nodes)) == len(nodes)
    assert ix.cells.in_cell[ix.row(f"ad:{r}")]                          # back in its block


def test_rows_upserted_before_any_compaction_are_found():
    x, quant = _world(n=500)
    ix = MemoryIndex(0, "t", x.shape[1], 4, 1, ["ad"], nbits=6, codebooks=quant.codebooks_array())
    ix.compact()                                        # empty: no layout yet
    toks = quant.tokens(x)
    for i in range(50):
        ix.upsert(f"ad:{i}", x[i], toks[i].tolist(), [0], 1)
    res = ix.search(x[3], toks[3].tolist(), 5, probes=64)
    assert res[0][0] == "ad:3" and abs(res[0][1] - 1.0) < 1e-5


def test_assignments_of_many_nodes_after_compaction_reordered_the_rows():
    x, quant = _world(n=500)
    ix = MemoryIndex(0, "t", x.shape[1], 4, 2, ["ad"], nbits=6, codebooks=quant.codebooks_array())
    assign = np.stack([np.arange(500), np.arange(500) % 7], 1).astype(np.int32)
    bulk_load(ix, [f"ad:{i}" for i in range(500)], x, quant.tokens(x), assign)
    got = ix.assignments(["ad:3", "ad:499", "ad:nope"])
    assert got.tolist() == [[3, 3], [499, 2], [-1, -1]]
    assert ix.assignments(["ad:nope"]).tolist() == [[-1, -1]]
    assert ix.assignments([]).shape == (0, 2)


def test_members_and_cosines_measure_nodes_less_their_types_mean():
    """Prototypes live in the type-centred space: members are ranked, and a node's cosine to a
    prototype is taken, after its type's mean is removed (as the model assigns them)."""
    d = 8
    e = np.eye(d, dtype=np.float32)
    centres = np.stack([3 / 10 ** 0.5 * e[0], np.zeros(d, np.float32)])   # "ad" leans on axis 0
    proto = [e[1:2]]                                                  # one primitive, axis 1
    ix = MemoryIndex(0, "t", d, 2, 1, ["ad", "user"], prototypes=proto, centres=centres)
    near, far = e[0] * 3 + e[1], e[0] * 3 + e[2]
    emb = np.stack([far, near, e[1] + e[2]])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    bulk_load(ix, ["ad:far", "ad:near", "user:u"], emb, np.zeros((3, 2), np.int64), np.zeros((3, 1), np.int32))
    got = ix.members(0, 0)
    assert [n for n, _ in got] == ["ad:near", "user:u", "ad:far"]
    assert abs(got[0][1] - 1.0) < 1e-6 and abs(ix.prototype_cosine("ad:near", 0, 0) - 1.0) < 1e-6
    assert abs(ix.prototype_cosine("user:u", 0, 0) - 2 ** -0.5) < 1e-6
    assert ix.prototype_cosine("ad:none", 0, 0) is None


def test_removed_nodes_answer_nothing_and_leave_at_compaction():
    """An expired node is in no result (search with and without codebooks, similar, members)
    from its removal on; compaction drops its row; it can come back."""
    x, quant = _world(n=2000)
    for codebooks in (True, False):
        ix = _index(x, quant, codebooks)
        gone = [f"ad:{i}" for i in range(0, 2000, 3)]
        for n in gone:
            ix.remove(n)
        assert len(ix) == 2000 - len(gone) and set(ix.live_ids()).isdisjoint(gone)
        for q in range(0, 2000, 97):
            hits = {n for n, _ in ix.search(x[q], quant.tokens(x[q:q + 1])[0].tolist(), 50, probes=64)}
            assert hits and hits.isdisjoint(gone)
        assert ix.get("ad:0") is None
        assert set(n for n, _ in ix.members(0, 0, k=5000)).isdisjoint(gone)
        ix.compact()
        assert ix.n == len(ix) == 2000 - len(gone) and len(ix.ids) == ix.n
        hits = {n for n, _ in ix.search(x[1], quant.tokens(x[1:2])[0].tolist(), 10, probes=64)}
        assert "ad:1" in hits
        ix.upsert("ad:0", x[0], quant.tokens(x[:1])[0], [0], 7)
        assert ix.get("ad:0")["seq"] == 7
