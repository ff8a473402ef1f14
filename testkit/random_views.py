"""Random views of valid structure (edges between distinct nodes of the view, codes in range),
so encoder tests and the attention benchmark run without a store."""
import numpy as np

from hirflow.state.views import N_STATS, View


def random_view(rng, n: int, e: int | None = None, prefix: str = "user", n_types: int = 6,
                n_actions: int = 9) -> View:
    e = 2 * n if e is None else e
    src = rng.integers(0, n, e).astype(np.int32)
    dst = rng.integers(0, n, e).astype(np.int32)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return View(anchor=f"{prefix}:0", cutoff=0, nodes=tuple(f"{prefix}:{i}" for i in range(n)),
                types=rng.integers(0, n_types, n).astype(np.int16),
                hop=rng.integers(0, 3, n).astype(np.int8),
                stats=rng.random((n, N_STATS)).astype(np.float32),
                edge_src=src, edge_dst=dst,
                edge_action=rng.integers(0, n_actions, len(src)).astype(np.int16),
                edge_weight=rng.standard_normal(len(src)).astype(np.float32),
                edge_age=(rng.random(len(src)) * 1e6).astype(np.float32))


def random_views(seed: int, count: int, lo: int = 4, hi: int = 40):
    rng = np.random.default_rng(seed)
    return [random_view(rng, int(n), prefix=f"v{i}") for i, n in enumerate(rng.integers(lo, hi, count))]
