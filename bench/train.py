"""Training benchmark: anchors per second, memory, and where the time goes.

Trains the default model (dense per-view attention on CPU, compiled FlexAttention on CUDA)
on the synthetic world, once with sampling inline in the model thread (the peer: every step
waits for its own batch) and once with `--workers` threads sampling and packing ahead of the
model, measured in the same run. Reports anchors (views per step, student + teacher per
anchor) per second, the share of the model thread's time spent waiting for data, the sampling
time summed over workers relative to the model time, and the peak resident memory (and CUDA
memory where present). Both runs produce the same checkpoint bytes (checked).

    python bench/train.py [--quick] [--events N] [--steps-per-chunk K] [--workers W] [--device cpu|cuda]

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from hirflow.encoder.model import EncoderConfig  # noqa: E402
from hirflow.state.events import Engagement  # noqa: E402
from hirflow.state.schema import SchemaConfig  # noqa: E402
from hirflow.streams.tools.synth import SynthConfig, SynthWorld  # noqa: E402
from hirflow.trainer.train import TrainConfig, train  # noqa: E402

warnings.filterwarnings("ignore")


def run(events, schema, enc, cfg, device, out) -> tuple[dict, str]:
    stats: dict = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    path = train(events, schema, enc, cfg, out, device=device.type, progress=False, stats=stats)
    if device.type == "cuda":
        stats["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    digest = hashlib.sha256(b"".join((path / f).read_bytes() for f in sorted(p.name for p in path.iterdir())))
    return stats, digest.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small world, a few steps (under a minute)")
    ap.add_argument("--events", type=int, help="synthetic engagement events (default 20000, quick 1500)")
    ap.add_argument("--steps-per-chunk", type=int, help="steps per 24 h chunk (default 4, quick 2)")
    ap.add_argument("--workers", type=int, default=1, help="sampling threads of the pipelined run")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    a = ap.parse_args()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n = a.events or (1500 if a.quick else 20000)
    spc = a.steps_per_chunk or (2 if a.quick else 4)
    world = SynthWorld(SynthConfig(events=n, users=max(60, n // 50), seed=7,
                                   span_days=4 if a.quick else 14))
    events = [e for e in world.stream() if isinstance(e, Engagement)]
    schema = SchemaConfig()
    enc = EncoderConfig.for_schema(schema)
    figures = {}
    digests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers in (("inline", 0), ("pipelined", a.workers)):
            cfg = TrainConfig(steps_per_chunk=spc, sample_workers=workers, snapshot_chunks=0)
            st, digests[name] = run(events, schema, enc, cfg, device, Path(tmp) / name)
            loop_s = st["wait_s"] + st["model_s"]
            figures[name] = st | {"anchors_per_s": st["anchors"] / loop_s, "wait_share": st["wait_s"] / loop_s}
            print(f"{name:9s} ({workers} workers): {st['steps']} steps, {st['anchors']:,} anchors in "
                  f"{loop_s:.1f}s of loop ({st['wall_s']:.1f}s wall): {figures[name]['anchors_per_s']:,.1f} "
                  f"anchors/s; model {st['model_s']:.1f}s, waiting for data {st['wait_s']:.1f}s "
                  f"({figures[name]['wait_share']:.0%}), sampling+packing {st['sample_s']:.1f}s", flush=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    p, i = figures["pipelined"], figures["inline"]
    same = digests["inline"] == digests["pipelined"]
    print(f"pipelined / inline: {p['anchors_per_s'] / i['anchors_per_s']:.2f}x; same checkpoint bytes: {same}; "
          f"peak RSS {peak_mb:,.0f} MB")
    out = {
        "anchors_per_s": {"value": round(p["anchors_per_s"], 1), "unit": "anchors/s",
                          "ratio_to_inline_sampling": round(p["anchors_per_s"] / i["anchors_per_s"], 3)},
        "inline_anchors_per_s": {"value": round(i["anchors_per_s"], 1), "unit": "anchors/s"},
        "wait_share": {"value": round(p["wait_share"], 3), "unit": "fraction of the model thread",
                       "ratio_to_inline_sampling": round(p["wait_share"] / max(i["wait_share"], 1e-9), 3)},
        "sampling_to_model_time": {"value": round(p["sample_s"] / p["model_s"], 3), "unit": "ratio"},
        "share_data_inline": {"value": round(i["wait_s"] / (i["wait_s"] + i["model_s"]), 3), "unit": "fraction"},
        "share_model_inline": {"value": round(i["model_s"] / (i["wait_s"] + i["model_s"]), 3), "unit": "fraction"},
        "steps": {"value": p["steps"], "unit": "steps"},
        "peak_rss": {"value": round(peak_mb), "unit": "MB"},
        "same_checkpoint": same,
        "device": device.type,
    }
    if "cuda_peak_mb" in p:
        out["cuda_peak"] = {"value": round(p["cuda_peak_mb"]), "unit": "MB"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
