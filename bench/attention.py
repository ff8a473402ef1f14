"""Attention benchmark: FlexAttention with all of hirflow's graph biases vs the dense
reference (materialised S x S bias + SDPA), forward, on packed views of 16-128 nodes.

Each (path, length) runs in its own process so its peak memory is its own: peak RSS of the
process, and its growth (peak minus the RSS after the warm-up call). Time per call is the
median of several calls after warm-up (the flex path includes building its block mask from
the view offsets, its pair layout and its pair-bias table).

    python bench/attention.py [--quick] [--sizes 1024,4096,8192,16384] [--dense-16k]

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H, D = 4, 32


def child(mode: str, S: int, reps: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import resource
    import warnings

    import numpy as np
    import torch

    from hirflow.encoder import attention as A
    from hirflow.encoder.batching import PackConfig, pack
    from testkit.random_views import random_view
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rng = np.random.default_rng(S)
    views, total = [], 0
    while True:
        n = int(rng.integers(16, 129))
        if total + n > S:
            break
        views.append(random_view(rng, n, 3 * n, prefix=f"v{len(views)}"))
        total += n
    cfg = PackConfig()
    batch = pack(views, cfg)
    bias = A.GraphBias(H, cfg.n_spd, 9, cfg.recency_buckets, 6)
    q, k, v = (torch.randn(1, H, batch.seq_len, D) for _ in range(3))

    def call():
        if mode == "flex":
            bm = A.build_block_mask(batch, "cpu")
            return A.attend_flex(q, k, v, batch, bias, bm, compiled=True)
        return A.attend_dense_packed(q, k, v, batch, bias)

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    with torch.no_grad():
        t0 = time.perf_counter()
        call()                                   # compile / warm-up
        warm = time.perf_counter() - t0
        base = rss_mb()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        mask_times = []
        for _ in range(20):
            t = time.perf_counter()
            A.build_block_mask(batch, "cpu")
            mask_times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "S": batch.seq_len, "views": len(views), "ms": statistics.median(times) * 1e3,
            "warmup_s": warm, "peak_mb": peak, "delta_mb": max(0.0, peak - base),
            "block_mask_ms": statistics.median(mask_times) * 1e3}


def run(mode: str, S: int, reps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(S), str(reps)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            return json.loads(line)
    return {"mode": mode, "S": S, "error": (out.stderr or out.stdout)[-400:]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", help="comma-separated token counts")
    ap.add_argument("--dense-16k", action="store_true", help="also try dense at 16k (needs >8 GB)")
    ap.add_argument("--reps", type=int)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else ([1024, 4096] if a.quick else [1024, 4096, 8192, 16384])
    reps = a.reps or (3 if a.quick else 5)
    figures = {}
    print(f"{'tokens':>7} {'path':>6} {'ms/call':>9} {'peak MB':>8} {'+MB':>7} {'mask ms':>8}")
    for S in sizes:
        row = {}
        for mode in ("flex", "dense"):
            if mode == "dense" and S >= 16384 and not a.dense_16k:
                row[mode] = {"skipped": f"bias alone would be {H * S * S * 4 / 2**30:.1f} GB"}
                print(f"{S:>7} {mode:>6}   skipped: materialised bias alone {H * S * S * 4 / 2**30:.1f} GB")
                continue
            r = run(mode, S, reps)
            row[mode] = r
            if "error" in r:
                print(f"{S:>7} {mode:>6}   failed: {r['error']}")
            else:
                print(f"{r['S']:>7} {mode:>6} {r['ms']:>9.1f} {r['peak_mb']:>8.0f} {r['delta_mb']:>7.0f}"
                      f" {r['block_mask_ms']:>8.2f}", flush=True)
        f, d = row.get("flex", {}), row.get("dense", {})
        entry = {"flex_ms": {"value": round(f.get("ms", float("nan")), 2), "unit": "ms"},
                 "flex_peak_mb": {"value": round(f.get("peak_mb", float("nan"))), "unit": "MB"},
                 "block_mask_ms": {"value": round(f.get("block_mask_ms", float("nan")), 3), "unit": "ms"}}
        if "ms" in d and "ms" in f:
            entry["dense_ms"] = {"value": round(d["ms"], 2), "unit": "ms"}
            entry["dense_peak_mb"] = {"value": round(d["peak_mb"]), "unit": "MB"}
            entry["speedup_vs_dense"] = {"value": round(d["ms"] / f["ms"], 2), "unit": "x"}
            entry["memory_ratio_vs_dense"] = {"value": round(d["peak_mb"] / f["peak_mb"], 2), "unit": "x"}
            # what the attention itself allocates (torch and the compiler excluded)
            entry["growth_ratio_vs_dense"] = {"value": round(d["delta_mb"] / max(f["delta_mb"], 1.0), 2),
                                              "unit": "x"}
        else:
            entry["dense"] = d.get("skipped") or d.get("error", "n/a")
        figures[f"S{S}"] = entry
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
