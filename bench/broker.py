"""Embedded broker benchmark: what a steady produce stream costs tansu (the embedded broker) in
CPU as its in-memory log grows, per producer linger and partition count.

Why: the freshness benchmark shares this machine's cores between the broker and the worker.
tansu 0.6's memory engine stores each produced batch as one object per partition and, at
every fetch that finds new data in a partition, lists all of that partition's objects (it
ignores retention). So with a consumer at the log's end, as the worker's ingest is, its CPU
grows with the number of stored batches: with time, with partitions (a linger window sends
one batch to each), and with shorter lingers. Each setting gets a fresh broker; 100-byte
records, one consumer (10 ms fetch wait, 5 ms consume calls).

    python bench/broker.py [--quick] [--rate 4000] [--seconds 30] [--lingers 5,20] [--partitions 8,1]

Runs every linger on the first partition count, then the other partition counts at the last
linger. Prints the broker's CPU share per 5 s window; the last line is one JSON object of the
figures (the broker's CPU in the first and the last window per setting, and the last window's
ratio to the first setting's).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_END, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench.proc_cpu import cpu_seconds  # noqa: E402
from hirflow.state.config import build  # noqa: E402
from hirflow.streams import clients  # noqa: E402
from hirflow.streams.broker import EmbeddedBroker  # noqa: E402
from hirflow.streams.config import HirflowConfig  # noqa: E402

WINDOW_S = 5.0


def broker_cpu(linger_ms: int, partitions: int, rate: float, seconds: float) -> list[float]:
    """The broker's CPU share (1.0 = one core) per window of a produced and consumed stream."""
    with EmbeddedBroker() as broker:
        cfg = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "linger_ms": linger_ms,
                                              "partitions": partitions}})
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
                print(f"linger {linger_ms} ms, {partitions} partitions, {now - t0:4.0f} s, {n:,} "
                      f"records: broker CPU "
                      f"{100 * shares[-1]:.0f}% of a core", flush=True)
                c0, last = c, now
        p.flush(30)
        stop.set()
        reader.join()
        consumer.close()
        return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="14 s per setting")
    ap.add_argument("--rate", type=float, default=4000.0, help="records per second")
    ap.add_argument("--seconds", type=float, default=None, help="stream length per setting (31)")
    ap.add_argument("--lingers", default="5,20", help="producer linger.ms values to compare")
    ap.add_argument("--partitions", default="8,1", help="partition counts to compare")
    a = ap.parse_args()
    seconds = a.seconds or (14.0 if a.quick else 31.0)
    lingers = [int(x) for x in a.lingers.split(",")]
    counts = [int(x) for x in a.partitions.split(",")]
    settings = [(ms, counts[0]) for ms in lingers] + [(lingers[-1], n) for n in counts[1:]]
    runs = {(ms, n): broker_cpu(ms, n, a.rate, seconds) for ms, n in settings}
    base_key = settings[0]
    base = runs[base_key]
    figs = {}
    for (ms, n), shares in runs.items():
        name = f"linger_{ms}ms_{n}_partitions"
        figs[f"broker_cpu_first_window_{name}"] = {"value": round(100 * shares[0]), "unit": "% of a core"}
        last = {"value": round(100 * shares[-1]), "unit": "% of a core"}
        if (ms, n) != base_key:
            last[f"ratio_to_linger_{base_key[0]}ms_{base_key[1]}_partitions"] = round(shares[-1] / base[-1], 2)
        figs[f"broker_cpu_last_window_{name}"] = last
    print(json.dumps(figs))


if __name__ == "__main__":
    main()
