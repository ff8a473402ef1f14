"""Retrieval benchmark: the BoM inverted index at scale against exact and ANN search.

N clustered unit embeddings (a mixture of directions, like trained embeddings: users and
items share interests), a residual quantizer trained on them (the checkpoint's quantizer),
tokens for every item, the serving `MemoryIndex`. Per query (a user vector): p50/p99 latency
and Recall@100 against exact inner-product search (faiss IndexFlatIP) and the same for a
faiss HNSW index on the same embeddings, all in the same run.

    python bench/retrieve.py [--quick] [--n 1000000] [--queries 200] [--probes 48]
                             [--d 64] [--beam 1]

Also times encoding 512 embeddings into tokens at the configured beam against the wide
beam 4 and, for beam 1, against faiss's own beam search at width 1 (one thread): the cost of
making tokens in every refresh batch.

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from hirflow.encoder.quantize import BoMQuantizer  # noqa: E402
from hirflow.encoder.quantizer_config import QuantizerConfig  # noqa: E402
from hirflow.state.memindex import MemoryIndex  # noqa: E402
from testkit.memindex import bulk_load  # noqa: E402


def clustered(n: int, d: int, clusters: int, rng) -> np.ndarray:
    centres = rng.standard_normal((clusters, d)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(fn, queries):
    out, lat = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        lat.append((time.perf_counter() - t) * 1000)
    return out, np.array(lat)


def encode_times(quant: BoMQuantizer, x: np.ndarray, reps: int = 7) -> dict:
    """Median ms to make the tokens of `x` at the quantizer's beam, its ratio to beam 4 and,
    at beam 1, to faiss's beam search at width 1 (which `BoMQuantizer` replaces there)."""
    import torch
    threads, torch_threads = faiss.omp_get_max_threads(), torch.get_num_threads()
    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    beam = quant.cfg.beam
    wide = BoMQuantizer.from_codebooks(quant.codebooks_array(), replace(quant.cfg, beam=4))

    def median_ms(fn) -> float:
        return float(np.median([timed(lambda _: fn(), [None])[1][0] for _ in range(reps)]))
    try:
        ms = {beam: median_ms(lambda: quant.tokens(x)), 4: median_ms(lambda: wide.tokens(x))}
        out = {"value": round(ms[beam], 2), "unit": "ms", "ratio_to_beam_4": round(ms[beam] / ms[4], 3)}
        if beam == 1:
            wide.rq.max_beam_size = 1
            faiss_ms = median_ms(lambda: wide.rq.compute_codes(x))
            out["ratio_to_faiss_beam_1"] = round(ms[1] / faiss_ms, 3)
            print(f"faiss's beam search at width 1: {faiss_ms:.1f} ms")
    finally:
        faiss.omp_set_num_threads(threads)
        torch.set_num_threads(torch_threads)
    print(f"tokens of 512 embeddings: {ms[beam]:.1f} ms at beam {beam}, {ms[4]:.1f} ms at beam 4")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--probes", type=int, default=48)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--d", type=int, default=64, help="embedding width (the default served "
                    "vector with its collaborative block: 192)")
    ap.add_argument("--beam", type=int, default=QuantizerConfig().beam,
                    help="encoding beam of the tokens (default: the quantizer's)")
    a = ap.parse_args()
    n = a.n or (100_000 if a.quick else 1_000_000)
    d, k = a.d, a.k
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    items = clustered(n, d, 2048, rng)
    users = clustered(a.queries, d, 2048, np.random.default_rng(1))
    quant = BoMQuantizer(d, QuantizerConfig(train_size=min(n, 65_536), beam=a.beam)).train(items)
    tokens = np.concatenate([quant.tokens(items[i:i + 100_000]) for i in range(0, n, 100_000)])
    utok = quant.tokens(users)
    ix = MemoryIndex(0, "bench", d, 8, 1, ["user", "ad"], codebooks=quant.codebooks_array())
    bulk_load(ix, [f"ad:{i}" for i in range(n)], items, tokens, np.zeros((n, 1), np.int32))
    print(f"built: {n:,} items, quantizer + tokens + index in {time.perf_counter() - t:.0f}s", flush=True)
    flat = faiss.IndexFlatIP(d)
    flat.add(items)
    exact, lat_exact = timed(lambda q: flat.search(q[None], k)[1][0], users)
    t = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 40
    hnsw.add(items)
    hnsw.hnsw.efSearch = 128
    print(f"HNSW built in {time.perf_counter() - t:.0f}s", flush=True)
    approx, lat_hnsw = timed(lambda q: hnsw.search(q[None], k)[1][0], users)
    qs = list(zip(users, utok))
    bom, lat_bom = timed(lambda qt: [int(x.split(":")[1]) for x, _ in ix.search(qt[0], qt[1], k, ["ad"], probes=a.probes)], qs)

    def recall(got):
        return float(np.mean([len(set(g) & set(e)) / k for g, e in zip(got, exact)]))

    figs = {}
    for name, got, lat in (("bom", bom, lat_bom), ("hnsw", approx, lat_hnsw), ("exact", exact, lat_exact)):
        p50, p99 = np.percentile(lat, [50, 99])
        r = recall(got)
        print(f"{name:6} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  Recall@{k} {r:.3f}")
        figs[f"{name}_p50_ms"] = {"value": round(float(p50), 2), "unit": "ms"}
        figs[f"{name}_p99_ms"] = {"value": round(float(p99), 2), "unit": "ms"}
        figs[f"{name}_recall_at_{k}"] = {"value": round(r, 3), "unit": "fraction"}
    figs["bom_p99_ms"]["ratio_to_exact"] = round(figs["bom_p99_ms"]["value"] / figs["exact_p99_ms"]["value"], 3)
    figs["bom_p99_ms"]["ratio_to_hnsw"] = round(figs["bom_p99_ms"]["value"] / figs["hnsw_p99_ms"]["value"], 3)
    figs[f"bom_recall_at_{k}"]["ratio_to_hnsw"] = round(figs[f"bom_recall_at_{k}"]["value"] / max(1e-9, figs[f"hnsw_recall_at_{k}"]["value"]), 3)
    figs["items"] = {"value": n, "unit": "items"}
    figs["beam"] = {"value": a.beam, "unit": "beam"}
    figs["encode_ms_per_512"] = encode_times(quant, items[:512])
    print(json.dumps(figs))


if __name__ == "__main__":
    main()
