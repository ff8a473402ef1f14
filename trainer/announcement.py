"""The checkpoint announcement: the record the trainer publishes on `hirflow.checkpoints`
once a checkpoint's files are complete, and the only thing a worker learns a new model from.

msgpack map, key ``checkpoint`` (the topic is compacted: the newest announcement is what a
starting worker reads), fields:
  v            ANNOUNCEMENT_VERSION
  id           the checkpoint's content id (its folder name)
  path         absolute path of the checkpoint folder on the shared volume
  sha256       sha256 of its manifest file
  parent       id of the checkpoint it continued, or nil
  data_window  [first, last] event time (ms) of the training data, or nil
  ts           publication time, ms since the epoch
A worker needs `id` and `path` to act; the rest is for people and tools.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import msgpack

ANNOUNCEMENT_VERSION = 1
ANNOUNCEMENT_KEY = b"checkpoint"


@dataclass(frozen=True)
class Announcement:
    id: str
    path: str
    sha256: str | None = None
    parent: str | None = None
    data_window: list[int] | None = None
    ts: int = 0
    v: int = ANNOUNCEMENT_VERSION

    def encode(self) -> bytes:
        return msgpack.packb(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | None) -> "Announcement":
        """-> the announcement, or ValueError with the reason."""
        try:
            rec = msgpack.unpackb(raw or b"")
        except Exception as exc:
            raise ValueError(f"undecodable announcement: {exc}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) \
                or not isinstance(rec.get("path"), str):
            raise ValueError("announcement must be a map with string id and path")
        sha, parent, window, ts = (rec.get(k) for k in ("sha256", "parent", "data_window", "ts"))
        return cls(rec["id"], rec["path"], sha if isinstance(sha, str) else None,
                   parent if isinstance(parent, str) else None,
                   list(window) if isinstance(window, list) and len(window) == 2
                   and all(isinstance(x, int) for x in window) else None,
                   ts if isinstance(ts, int) and not isinstance(ts, bool) else 0,
                   rec.get("v") if isinstance(rec.get("v"), int) else ANNOUNCEMENT_VERSION)
