"""Encode benchmark: nodes re-encoded per second, end to end, with the default model.

Builds a real RocksDB store from the synthetic world, then per batch of anchors: sample
student views from the store (batched multi-gets), fetch world-knowledge vectors, pack,
run the encoder (compiled FlexAttention on this CPU, inference). The peer, measured in the
same run: a bare 2-layer d=64 `nn.TransformerEncoder` on the same number of tokens per view,
with no sampling, packing or graph biases.

    python bench/encode.py [--quick] [--events N] [--batch 512] [--device cpu|cuda]

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hirflow.encoder.batching import pack  # noqa: E402
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder  # noqa: E402
from hirflow.state.events import Engagement  # noqa: E402
from hirflow.state.graph import GraphConfig, GraphStore  # noqa: E402
from hirflow.state.schema import SchemaConfig  # noqa: E402
from hirflow.state.views import STUDENT, ViewSampler  # noqa: E402
from hirflow.state.writer import GraphWriter  # noqa: E402
from hirflow.streams.synth import SynthConfig, SynthWorld  # noqa: E402

warnings.filterwarnings("ignore")


def build_store(path: Path, events: int, schema: SchemaConfig) -> tuple[GraphStore, list[str], int]:
    world = SynthWorld(SynthConfig(events=events, users=max(500, events // 50), seed=1))
    store = GraphStore(path, schema, 8)
    w = GraphWriter(store, GraphConfig(path=str(path)))
    batch, last = [], 0
    for item in world.stream():
        if isinstance(item, Engagement):
            batch.append((item, 3))
            last = max(last, item.ts)
            if len(batch) >= 20_000:
                w.apply_batch(batch)
                w.commit()
                batch = []
    w.apply_batch(batch)
    w.commit()
    return store, list(store.reader.node_ids()), last


def bare_transformer_rate(tokens_per_view: int, views: int, device) -> float:
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(device).eval()
    x = torch.randn(views, tokens_per_view, 64, device=device)
    with torch.no_grad():
        enc(x)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            enc(x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    return views / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--events", type=int)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--batches", type=int)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    events = a.events or (60_000 if a.quick else 300_000)
    n_batches = a.batches or (6 if a.quick else 20)
    device = torch.device(a.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    schema = SchemaConfig()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        store, nodes, last = build_store(Path(tmp) / "state", events, schema)
        print(f"store: {len(nodes)} nodes from {events} events in {time.perf_counter() - t:.1f}s", flush=True)
        cfg = EncoderConfig.for_schema(schema)
        torch.manual_seed(0)
        model = HierarchicalEncoder(cfg).to(device).eval()
        sampler = ViewSampler(store.reader, schema, STUDENT, seed=0)
        rng = np.random.default_rng(0)
        parts = {"sample": [], "pack": [], "model": [], "total": []}
        sizes = []
        with torch.no_grad():
            for i in range(n_batches + 1):             # the first batch compiles (not timed)
                anchors = [nodes[j] for j in rng.integers(0, len(nodes), a.batch)]
                t0 = time.perf_counter()
                views = sampler.sample(anchors, last)
                t1 = time.perf_counter()
                ids = sorted({n for v in views for n in v.nodes})
                batch = pack(views, cfg.pack, knowledge=store.reader.knowledge(ids)).to(device)
                t2 = time.perf_counter()
                emb, logits = model(batch)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t3 = time.perf_counter()
                if i == 0:
                    backend = model.backend(max_view=max(batch.view_sizes))
                    print(f"first batch (compile) {t3 - t0:.1f}s, backend {backend}", flush=True)
                    continue
                sizes.append(np.mean([v.size for v in views]))
                for k, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                    parts[k].append(dt)
        store.close()
    med = {k: statistics.median(v) for k, v in parts.items()}
    rate = a.batch / med["total"]
    tokens = float(np.mean(sizes))
    peer = bare_transformer_rate(max(1, round(tokens)), a.batch, device)
    share = {k: med[k] / med["total"] for k in ("sample", "pack", "model")}
    print(f"median over {n_batches} batches of {a.batch}: {rate:,.0f} nodes/s end to end "
          f"(sample {share['sample']:.0%}, pack {share['pack']:.0%}, model {share['model']:.0%}); "
          f"model alone {a.batch / med['model']:,.0f} views/s; mean view {tokens:.1f} tokens; "
          f"bare 2-layer transformer {peer:,.0f} views/s on {device.type}")
    print(json.dumps({
        "nodes_per_s": {"value": round(rate), "unit": "nodes/s", "ratio_to_bare_transformer": round(rate / peer, 3)},
        "model_views_per_s": {"value": round(a.batch / med["model"]), "unit": "views/s",
                              "ratio_to_bare_transformer": round(a.batch / med["model"] / peer, 3)},
        "bare_transformer_views_per_s": {"value": round(peer), "unit": "views/s"},
        "share_sample": {"value": round(share["sample"], 3), "unit": "fraction"},
        "share_pack": {"value": round(share["pack"], 3), "unit": "fraction"},
        "share_model": {"value": round(share["model"], 3), "unit": "fraction"},
        "mean_view_tokens": {"value": round(tokens, 1), "unit": "tokens"},
        "device": device.type,
    }))


if __name__ == "__main__":
    main()
