"""Announcing a checkpoint on `hirflow.checkpoints` once its files are complete."""
from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer

from hirflow.encoder.checkpoint import MANIFEST, load, sha256_file
from hirflow.trainer.announcement import ANNOUNCEMENT_KEY, Announcement


def announce(conf: dict, topic: str, path: Path) -> Announcement:
    """Verify the checkpoint, then publish its announcement (`trainer.announcement`)."""
    ck = load(path)                      # never announce what a worker would refuse
    ann = Announcement(ck.id, str(Path(path).resolve()), sha256_file(Path(path) / MANIFEST),
                       ck.manifest.get("parent"), ck.manifest.get("data_window"),
                       int(time.time() * 1000))
    p = Producer({**conf, "enable.idempotence": True, "acks": "all"})
    p.produce(topic, key=ANNOUNCEMENT_KEY, value=ann.encode())
    if p.flush(30):
        raise RuntimeError(f"announcement of {ck.id} on {topic} was not acknowledged")
    return ann
