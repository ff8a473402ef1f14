"""Announcing a checkpoint on `hirflow.checkpoints` once its files are complete."""
from __future__ import annotations

import time
from pathlib import Path

import msgpack
from confluent_kafka import Producer

from hirflow.encoder.checkpoint import MANIFEST, load, sha256_file


def announce(conf: dict, topic: str, path: Path) -> dict:
    """Verify the checkpoint, then publish {id, path, sha256 of its manifest, parent, ts}."""
    ck = load(path)                      # never announce what a worker would refuse
    record = {"v": 1, "id": ck.id, "path": str(Path(path).resolve()),
              "sha256": sha256_file(Path(path) / MANIFEST), "parent": ck.manifest.get("parent"),
              "data_window": ck.manifest.get("data_window"), "ts": int(time.time() * 1000)}
    p = Producer({**conf, "enable.idempotence": True, "acks": "all"})
    p.produce(topic, key=b"checkpoint", value=msgpack.packb(record))
    if p.flush(30):
        raise RuntimeError(f"announcement of {ck.id} on {topic} was not acknowledged")
    return record
