"""Embedded broker benchmark: what a steady produce stream costs tansu (the embedded broker) in
CPU as its in-memory log grows, per producer linger.

Why: the freshness benchmark shares this machine's cores between the broker and the worker.
tansu 0.6's memory engine spends CPU per request in proportion to the length of the log it
holds (it ignores retention), so the longer a stream runs, the more of a core it takes: with
a consumer reading at the log's end, as the worker's ingest does, a fetch answers each
produce request. Fewer, larger requests (a longer producer linger) cut that. Each linger gets
a fresh broker; 100-byte records on 8 partitions, one consumer (10 ms fetch wait, 5 ms
consume calls).

    python bench/broker.py [--quick] [--rate 4000] [--seconds 30] [--lingers 5,20]

Prints the broker's CPU share per 5 s window; the last line is one JSON object of the figures
(the broker's CPU in the first and the last window per linger, and the last window's ratio to
the 5 ms linger's, or the first linger's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_END, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from state.config import build  # noqa: E402
from streams import clients  # noqa: E402
from streams.broker import EmbeddedBroker  # noqa: E402
from streams.config import HirflowConfig  # noqa: E402

WINDOW_S = 5.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def broker_cpu(linger_ms: int, rate: float, seconds: float) -> list[float]:
    """The broker's CPU share (1.0 = one core) per window of a produced and consumed stream."""
    with EmbeddedBroker() as broker:
        cfg = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "linger_ms": linger_ms}})
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("bench.broker", cfg.kafka.partitions, 1)])["bench.broker"].result()
        p = clients.producer(cfg.kafka)
        consumer = clients.consumer(cfg.kafka, "bench-broker")
        consumer.assign([TopicPartition("bench.broker", i, OFFSET_END)
                         for i in range(cfg.kafka.partitions)])
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                consumer.consume(10_000, timeout=0.005)

        reader = threading.Thread(target=read)
        reader.start()
        shares, payload = [], b"x" * 100
        t0 = last = time.monotonic()
        c0, n = cpu_seconds(broker.proc.pid), 0
        while time.monotonic() - t0 < seconds:
            for _ in range(10):
                clients.produce_blocking(p, "bench.broker", payload, key=str(n).encode())
                n += 1
            p.poll(0)
            time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            now = time.monotonic()
            if now - last >= WINDOW_S:
                c = cpu_seconds(broker.proc.pid)
                shares.append((c - c0) / (now - last))
                print(f"linger {linger_ms} ms, {now - t0:4.0f} s, {n:,} records: broker CPU "
                      f"{100 * shares[-1]:.0f}% of a core", flush=True)
                c0, last = c, now
        p.flush(30)
        stop.set()
        reader.join()
        consumer.close()
        return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 s per linger")
    ap.add_argument("--rate", type=float, default=4000.0, help="records per second")
    ap.add_argument("--seconds", type=float, default=None, help="stream length per linger (30)")
    ap.add_argument("--lingers", default="5,20", help="producer linger.ms values to compare")
    a = ap.parse_args()
    seconds = a.seconds or (16.0 if a.quick else 31.0)
    lingers = [int(x) for x in a.lingers.split(",")]
    runs = {ms: broker_cpu(ms, a.rate, seconds) for ms in lingers}
    base_ms = 5 if 5 in runs else lingers[0]
    base = runs[base_ms]
    figs = {}
    for ms, shares in runs.items():
        figs[f"broker_cpu_first_window_linger_{ms}ms"] = {"value": round(100 * shares[0]), "unit": "% of a core"}
        last = {"value": round(100 * shares[-1]), "unit": "% of a core"}
        if ms != base_ms:
            last[f"ratio_to_linger_{base_ms}ms"] = round(shares[-1] / base[-1], 2)
        figs[f"broker_cpu_last_window_linger_{ms}ms"] = last
    print(json.dumps(figs))


if __name__ == "__main__":
    main()
