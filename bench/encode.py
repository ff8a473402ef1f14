"""Encode benchmark: nodes re-encoded per second with the default model, and view sampling
alone.

Builds a real RocksDB store from the synthetic world, then:

1. **Sampling alone**, one process: student views per second of the batched sampler
   (`state.views.ViewSampler`) on random anchors of a warm store, and with each batch's
   anchors changed (their records read and their rows computed again, as a refresh does);
   the peer is the plain-Python statement of the same rules (`testkit/reference_views.py`),
   on the same anchors in the same run; the goal is 20,000 views/s per process.
2. **In one process, step by step**, per batch of anchors: sample, fetch world-knowledge
   vectors, pack, run the encoder (inference); the shares of each step. The peer: a bare
   2-layer d=64 `nn.TransformerEncoder` on the same number of tokens per view, with no
   sampling, packing or graph biases.
3. **The refresh pipeline** with 1 and with 2 sampling processes (`state.view_pool`): the
   processes sample and pack batch k+1 on store followers while this process encodes batch
   k (one torch thread, the refresh's default); each batch's anchors count as changed, as in
   a refresh; nodes per second and the CPU each side used (on a 2-core machine 2 processes
   share the cores with the encoder: the machine, not the design, bounds their ratio).

    python bench/encode.py [--quick] [--events N] [--batch 512] [--device cpu|cuda]
                           [--processes 1,2]

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.proc_cpu import CpuMeter  # noqa: E402
from hirflow.encoder.batching import PackedBatch, Packer, pack  # noqa: E402
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder  # noqa: E402
from hirflow.state.events import Engagement  # noqa: E402
from hirflow.state.graph import GraphConfig, GraphStore  # noqa: E402
from hirflow.state.schema import SchemaConfig  # noqa: E402
from hirflow.state.view_pool import PreparedParts, ViewPool  # noqa: E402
from hirflow.state.views import STUDENT, ViewSampler  # noqa: E402
from hirflow.state.writer import GraphWriter  # noqa: E402
from hirflow.streams.tools.synth import SynthConfig, SynthWorld  # noqa: E402
from testkit.reference_views import ReferenceSampler  # noqa: E402

SAMPLING_GOAL = 20_000      # student views/s per sampling process

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


def sampling_rates(store: GraphStore, schema: SchemaConfig, nodes: list[str], last: int,
                   batch: int, batches: int) -> dict[str, float]:
    """Median student views/s of the batched and the reference sampler on the same anchors:
    warm (anchors' rows cached) and changed (anchors invalidated before each batch)."""
    rng = np.random.default_rng(1)
    anchor_sets = [[nodes[j] for j in rng.integers(0, len(nodes), batch)] for _ in range(batches + 1)]
    out = {}
    for name, cls in (("batched", ViewSampler), ("reference", ReferenceSampler)):
        for mode in ("warm", "changed"):
            sampler = cls(store.reader, schema, STUDENT, seed=0)
            sampler.sample(anchor_sets[0], last)                   # fills the caches
            times = []
            for anchors in anchor_sets[1:]:
                if mode == "changed":
                    sampler.invalidate(anchors)
                t = time.perf_counter()
                sampler.sample(anchors, last)
                times.append(time.perf_counter() - t)
            out[f"{name}_{mode}"] = batch / statistics.median(times)
    return out


def encode_prepared(model: HierarchicalEncoder, prepared, device) -> None:
    """Run the encoder on what a sampling process packed (one batch or its parts)."""
    parts = prepared.parts if isinstance(prepared, PreparedParts) else [prepared]
    for _, arrays in parts:
        model(PackedBatch.from_arrays(arrays).to(device))
    if device.type == "cuda":
        torch.cuda.synchronize()


def pipeline_rate(store: GraphStore, schema: SchemaConfig, nodes: list[str], last: int,
                  model: HierarchicalEncoder, processes: int, batch: int, batches: int,
                  device) -> dict[str, float]:
    """Nodes/s of sampling + packing in `processes` processes one batch ahead of encoding
    here, as the refresh loop runs them, and the CPU share of each side while it ran."""
    pool = ViewPool(store, schema, STUDENT, seed=0, processes=processes)
    packer = Packer(model.cfg.pack)
    threads = torch.get_num_threads()
    # the refresh loop's default (`refresh.cpu_threads`): the sampling processes need the
    # other cores, and idle pool threads spin on them
    torch.set_num_threads(1)
    rng = np.random.default_rng(2)
    anchor_sets = [[nodes[j] for j in rng.integers(0, len(nodes), batch)] for _ in range(batches + 2)]
    try:
        with torch.no_grad():
            encode_prepared(model, pool.sample(anchor_sets[0], last, packer).prepared, device)
            meter = CpuMeter({"encoder": [os.getpid()], "samplers": [c.proc.pid for c in pool.children]})
            t = time.perf_counter()
            ticket = pool.submit(anchor_sets[1], last, packer)
            for anchors in anchor_sets[2:] + [None]:
                got = pool.result(ticket)
                if anchors is not None:
                    ticket = pool.submit(anchors, last, packer)
                encode_prepared(model, got.prepared, device)
            elapsed = time.perf_counter() - t
            cpu = meter.shares()
    finally:
        pool.close()
        torch.set_num_threads(threads)
    return {"nodes_per_s": batches * batch / elapsed, "cpu_encoder": cpu["encoder"],
            "cpu_samplers": cpu["samplers"], "torch_threads": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--events", type=int)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--batches", type=int)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--processes", default="1,2", help="sampling process counts of the pipeline runs")
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
        samplers = sampling_rates(store, schema, nodes, last, a.batch, n_batches)
        print(f"sampling alone: {samplers['batched_warm']:,.0f} views/s warm, "
              f"{samplers['batched_changed']:,.0f} with changed anchors (reference "
              f"{samplers['reference_warm']:,.0f} / {samplers['reference_changed']:,.0f})", flush=True)
        pipelines = {}
        for p in [int(x) for x in a.processes.split(",") if x]:
            pipelines[p] = pipeline_rate(store, schema, nodes, last, model, p, a.batch, n_batches, device)
            print(f"pipeline with {p} sampling process(es): {pipelines[p]['nodes_per_s']:,.0f} nodes/s "
                  f"(CPU: encoder {pipelines[p]['cpu_encoder']:.2f}, samplers {pipelines[p]['cpu_samplers']:.2f} "
                  f"cores)", flush=True)
        store.close()
    med = {k: statistics.median(v) for k, v in parts.items()}
    rate = a.batch / med["total"]
    tokens = float(np.mean(sizes))
    peer = bare_transformer_rate(max(1, round(tokens)), a.batch, device)
    share = {k: med[k] / med["total"] for k in ("sample", "pack", "model")}
    print(f"median over {n_batches} batches of {a.batch}: {rate:,.0f} nodes/s end to end in one process "
          f"(sample {share['sample']:.0%}, pack {share['pack']:.0%}, model {share['model']:.0%}); "
          f"model alone {a.batch / med['model']:,.0f} views/s; mean view {tokens:.1f} tokens; "
          f"bare 2-layer transformer {peer:,.0f} views/s on {device.type}")
    figures = {
        "sample_views_per_s": {"value": round(samplers["batched_warm"]), "unit": "views/s",
                               "ratio_to_reference_sampler": round(samplers["batched_warm"] / samplers["reference_warm"], 2),
                               "ratio_to_goal": round(samplers["batched_warm"] / SAMPLING_GOAL, 3)},
        "sample_views_per_s_changed_anchors": {
            "value": round(samplers["batched_changed"]), "unit": "views/s",
            "ratio_to_reference_sampler": round(samplers["batched_changed"] / samplers["reference_changed"], 2)},
        "nodes_per_s": {"value": round(rate), "unit": "nodes/s", "ratio_to_bare_transformer": round(rate / peer, 3)},
        "model_views_per_s": {"value": round(a.batch / med["model"]), "unit": "views/s",
                              "ratio_to_bare_transformer": round(a.batch / med["model"] / peer, 3)},
        "bare_transformer_views_per_s": {"value": round(peer), "unit": "views/s"},
        "share_sample": {"value": round(share["sample"], 3), "unit": "fraction"},
        "share_pack": {"value": round(share["pack"], 3), "unit": "fraction"},
        "share_model": {"value": round(share["model"], 3), "unit": "fraction"},
        "mean_view_tokens": {"value": round(tokens, 1), "unit": "tokens"},
    }
    one = pipelines.get(1)
    for p, r in pipelines.items():
        entry = {"value": round(r["nodes_per_s"]), "unit": "nodes/s",
                 "cpu_encoder": {"value": round(r["cpu_encoder"], 2), "unit": "cores"},
                 "cpu_samplers": {"value": round(r["cpu_samplers"], 2), "unit": "cores"},
                 "torch_threads": r["torch_threads"]}
        if one is not None and p != 1:
            entry["ratio_to_1_sampling_process"] = round(r["nodes_per_s"] / one["nodes_per_s"], 2)
        figures[f"pipeline_nodes_per_s_{p}_sampling_processes"] = entry
    figures["device"] = device.type
    figures["cores"] = len(os.sched_getaffinity(0))
    figures["torch_threads"] = torch.get_num_threads()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
