"""Change-log benchmark: what moving partitions costs (`worker.changelog`).

- ingest: events/s applied durably by the ingest loop with the change log attached, beside
  the same loop without it on the same topic in the same run (ratio: the log's cost);
- snapshot: node records per second written to the log as snapshots;
- restore: node records per second a new owner replays from the log (claim, read, apply,
  mark for re-encoding), and the seconds per million node records that gives;
- promote: the same takeover from a standby copy that followed the log
  (`worker.standby_replicas`): node records per second, ratio to the restore.

    python bench/changelog.py [--quick] [--events N] [--repeat N] [--partitions P]
                              [--events-per-user K]

A partition of a million nodes: `--partitions 1 --events 4000000 --events-per-user 4`.

Runs on the embedded broker (tansu) on loopback; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgpack  # noqa: E402
from confluent_kafka import TopicPartition  # noqa: E402
import numpy as np  # noqa: E402
from ingest import _as  # noqa: E402

from hirflow.state.config import build  # noqa: E402
from hirflow.state.graph import GraphStore  # noqa: E402
from hirflow.state.writer import GraphWriter  # noqa: E402
from hirflow.streams.scaleout import changelog, standby  # noqa: E402
from hirflow.streams import clients
from hirflow.streams.broker import EmbeddedBroker  # noqa: E402
from hirflow.streams.config import HirflowConfig  # noqa: E402
from hirflow.streams.ingest.loop import IngestLoop  # noqa: E402
from hirflow.streams.worker.runtime import tune_gc  # noqa: E402
from hirflow.streams.topics import Topics, ensure_topics  # noqa: E402


def produce_uniform(cfg: HirflowConfig, n: int, seed: int = 1, per_user: int = 10) -> int:
    """n engagements of users uniform over n/per_user ids on ads uniform over n/100: many
    nodes with a few edges each, as most of a real graph is. Returns the events' distinct
    nodes."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, max(1, n // per_user), n)
    ads = rng.integers(0, max(1, n // 100), n)
    acts = rng.choice(["impression", "click", "conversion"], n, p=[0.9, 0.08, 0.02])
    p = clients.producer(cfg.kafka, **{"linger.ms": 20, "batch.size": 1_000_000})
    topic = Topics(cfg.kafka.topic_prefix).engagements
    for i in range(n):
        src = f"user:{users[i]}"
        clients.produce_blocking(p, topic, msgpack.packb({"v": 1, "src": src, "dst": f"ad:{ads[i]}",
                                                          "action": str(acts[i]), "ts": 1_700_000_000_000 + i}),
                                 src.encode())
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return len(set(users.tolist())) + len(set(ads.tolist()))


def ingest(cfg: HirflowConfig, n: int, prefix: str, logged: bool, path: Path) -> float:
    """events/s of one ingest run into a fresh store at `path` (with or without the log)."""
    tune_gc()
    c = build(HirflowConfig, {**_as(cfg), "graph": {**_as(cfg)["graph"], "path": str(path)},
                              "ingest": {**_as(cfg)["ingest"], "group_id": f"b{time.time_ns()}"}})
    parts = list(range(c.kafka.partitions))
    with GraphStore(path, c.schema, c.kafka.partitions) as store:
        writer = None
        if logged:
            writer = changelog.ChangelogWriter(c.kafka, store, Topics(prefix).changelog, "bench")
            changelog.settle(c.kafka, store, writer, parts, c.kafka.partitions)
            store.attach_log(parts, writer)
        loop = IngestLoop(c, GraphWriter(store, c.graph), Topics(c.kafka.topic_prefix))
        while loop.poll_once(timeout=1.0) == 0:
            pass
        t, first = time.perf_counter(), loop.applied
        while loop.applied < n:
            loop.poll_once(timeout=1.0)
        loop.commit()
        rate = (loop.applied - first) / (time.perf_counter() - t)
        loop.close()
        if writer is not None:
            writer.close()
    return rate


def promote_time(cfg: HirflowConfig, topic: str, copies: Path, target: Path, nodes: int) -> float:
    """Seconds a new owner takes to take every partition over from standby copies that
    followed the log to its end (the following itself is not timed: it runs beforehand)."""
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(copies, cfg.schema, cfg.kafka.partitions) as copy_store:
        follower = standby.StandbyFollower(cfg.kafka, copy_store, topic, parts, poll_s=0.05)
        follower.start()
        probe = clients.consumer(cfg.kafka, "bench-probe")
        ends = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        probe.close()
        while any(follower.consumed.get(p, -1) < ends[p] for p in parts):
            if follower.error is not None:
                raise follower.error
            time.sleep(0.1)
        follower.close()
        with GraphStore(target, cfg.schema, cfg.kafka.partitions) as store:
            w = changelog.ChangelogWriter(cfg.kafka, store, topic, "promoted")
            t = time.perf_counter()
            done = changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions, standby=copy_store)
            seconds = time.perf_counter() - t
            w.close()
            assert store.reader.count() == nodes and len(done.promoted) == cfg.kafka.partitions
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (within a minute)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--events-per-user", type=int, default=10,
                    help="users are drawn from events / this many ids (fewer: more nodes)")
    a = ap.parse_args()
    n = a.events or (60_000 if a.quick else 400_000)
    repeat = a.repeat or (1 if a.quick else 3)
    tmp = Path(tempfile.mkdtemp(prefix="hirflow-bench-changelog-"))
    plain, logged, snap, restore, restore_s, promote, promote_s = [], [], [], [], [], [], []
    try:
        with EmbeddedBroker() as broker:
            base = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "partitions": a.partitions,
                                                   "topic_prefix": "bench."}})
            ensure_topics(base.kafka, Topics("bench."))
            print(f"produced {n} events over {produce_uniform(base, n, per_user=a.events_per_user):,} nodes", flush=True)
            parts = list(range(a.partitions))
            for r in range(repeat):
                # each logged run gets its own change-log topic (a fresh log, not a takeover)
                prefix = f"bench{r}."
                ensure_topics(base.kafka, Topics(prefix))
                plain.append(ingest(base, n, prefix, False, tmp / f"plain{r}"))
                logged.append(ingest(base, n, prefix, True, tmp / f"logged{r}"))
                # a snapshot of every partition of the logged store, then a restore elsewhere
                with GraphStore(tmp / f"logged{r}", base.schema, a.partitions, create=False) as store:
                    nodes = store.reader.count()
                    w = changelog.ChangelogWriter(base.kafka, store, Topics(prefix).changelog, "snap")
                    changelog.settle(base.kafka, store, w, parts, a.partitions)
                    t = time.perf_counter()
                    for p in parts:
                        w.snapshot(p)
                    snap.append(nodes / (time.perf_counter() - t))
                    w.close()
                with GraphStore(tmp / f"restored{r}", base.schema, a.partitions) as store:
                    w = changelog.ChangelogWriter(base.kafka, store, Topics(prefix).changelog, "new")
                    t = time.perf_counter()
                    done = changelog.settle(base.kafka, store, w, parts, a.partitions)
                    restore_s.append(time.perf_counter() - t)
                    restore.append(nodes / restore_s[-1])
                    w.close()
                    assert store.reader.count() == nodes and len(done.restored) == a.partitions
                promote_s.append(promote_time(base, Topics(prefix).changelog, tmp / f"copies{r}",
                                              tmp / f"promoted{r}", nodes))
                promote.append(nodes / promote_s[-1])
                print(f"run {r + 1}: ingest {plain[-1]:,.0f}/s plain, {logged[-1]:,.0f}/s with the log; "
                      f"{nodes} nodes: snapshot {snap[-1]:,.0f}/s, restore {restore[-1]:,.0f}/s, "
                      f"promote {promote[-1]:,.0f}/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pm, lm, sm, rm, prm = (statistics.median(x) for x in (plain, logged, snap, restore, promote))
    print(f"median of {repeat}: ingest {lm:,.0f} events/s with the change log = {lm / pm:.2f}x without "
          f"({pm:,.0f}/s); restore {rm:,.0f} node records/s = {1e6 / rm:,.0f} s per million; "
          f"promote {prm:,.0f} node records/s = {prm / rm:.1f}x restore")
    print(json.dumps({
        "events": {"value": n, "unit": "events"},
        "ingest_with_changelog": {"value": round(lm), "unit": "events/s", "ratio_to_without": round(lm / pm, 3)},
        "ingest_without_changelog": {"value": round(pm), "unit": "events/s"},
        "snapshot": {"value": round(sm), "unit": "node records/s"},
        "restore": {"value": round(rm), "unit": "node records/s"},
        "restore_per_million_nodes": {"value": round(1e6 / rm, 1), "unit": "s"},
        "restore_time": {"value": round(statistics.median(restore_s), 1), "unit": "s",
                         "nodes": nodes, "partitions": a.partitions},
        "promote": {"value": round(prm), "unit": "node records/s", "ratio_to_restore": round(prm / rm, 2)},
        "promote_per_million_nodes": {"value": round(1e6 / prm, 1), "unit": "s"},
        "promote_time": {"value": round(statistics.median(promote_s), 2), "unit": "s"},
        "runs": repeat,
    }))


if __name__ == "__main__":
    main()
