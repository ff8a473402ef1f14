"""The reverse record: one side of an engagement forwarded to the worker that owns it.

An engagement is keyed by its source node; the worker that consumes it applies the source
side and forwards the destination side (and a side of a foreign source) on
`hirflow.engagements.reverse`, keyed by that node, to the partition that owns it. The record
names where the engagement came from (origin partition and offset), so the receiver applies
each forwarded side at most once (`GraphWriter.reverse_mark`).

msgpack map: the engagement's fields (`src`, `dst`, `action`, `ts`, `w`, optional `id`) and
  v     REVERSE_VERSION
  side  which side(s) to apply: 1 source, 2 destination (`state.writer.SRC_SIDE/DST_SIDE`)
  op    origin partition of hirflow.engagements
  oo    origin offset
"""
from __future__ import annotations

from typing import NamedTuple

import msgpack

from hirflow.state.events import Engagement, Validator

REVERSE_VERSION = 1


class ReverseRecord(NamedTuple):
    event: Engagement
    side: int
    origin_partition: int
    origin_offset: int

    def encode(self) -> bytes:
        ev = self.event
        d = {"v": REVERSE_VERSION, "src": ev.src, "dst": ev.dst, "action": ev.action,
             "ts": ev.ts, "w": ev.w, "side": self.side, "op": self.origin_partition,
             "oo": self.origin_offset}
        if ev.id is not None:
            d["id"] = ev.id
        return msgpack.packb(d)

    @classmethod
    def decode(cls, raw: bytes | None, validator: Validator) -> "ReverseRecord":
        """-> the record; `EventError` for a bad engagement, ValueError for anything else."""
        try:
            d = msgpack.unpackb(raw or b"")
        except Exception as exc:
            raise ValueError(f"undecodable reverse record: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError(f"a reverse record must be a map, got {type(d).__name__}")
        v = d.get("v")
        if v != REVERSE_VERSION:
            raise ValueError(f"reverse record version {v!r}; this worker reads {REVERSE_VERSION}")
        fields = [d.get(k) for k in ("side", "op", "oo")]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in fields):
            raise ValueError("a reverse record needs integer side, op and oo")
        side, op, oo = fields
        if side not in (1, 2, 3) or not 0 <= op < 2 ** 31 or not 0 <= oo < 2 ** 63:
            raise ValueError(f"reverse record side/op/oo out of range: {side}, {op}, {oo}")
        return cls(validator.engagement(d), side, op, oo)
