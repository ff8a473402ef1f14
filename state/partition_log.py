"""A partition's movable state and its change log: what is logged, how a log is replayed.

The state of one Kafka partition is everything a new owner needs to carry on exactly where
the old one stopped: node records, entities, world-knowledge vectors, dirty markers, what
subscribers were last told (`published`) and the token changes not yet acknowledged
(`outbox`), all keyed by node key (partition first), plus the partition's rows in `meta`:
the last applied offset of every topic's partition p (``o:<topic>:p``) and the reverse-record
high marks of reverse partition p (``r:p:*``). The serving index (embeddings, postings,
primitive members, super-graph) is derived from those by the refresh, so it is rebuilt by
the new owner, not moved.

The log of partition p is a sequence of records (Kafka offsets in the change-log topic's
partition p), each one of:

- **claim** `{"base": cseq | None}`: a worker takes the partition; its offset is the new
  owner's *epoch*. `base` is the commit sequence the claimer's local state is at when it
  keeps that state (a restart), None when it restores from the log.
- **set** `{"e": epoch, "s": cseq, "i": part, "end": last part?, "ops": [...]}`: the
  movable puts and deletes of one local commit (commit sequence `cseq`, counted per
  partition), split in parts that fit a Kafka message.
- **snapshot**: the same shape, `"snap": true`: every movable key of the partition as of
  commit `s`, written after that commit is durable locally.

A set is produced and acknowledged *before* its local commit, so a crash can leave one set
that never reached the local store (an orphan). `Replay` decides which sets are real:
a set is confirmed by the next set or snapshot of the same epoch (the owner produces it only
after the local commit of the one before), or by the next claim when that claim's `base`
reaches it, or, with `base` None, because nobody kept a local state that could disagree.
Records of an epoch older than the newest claim seen are a fenced-off former owner's and
are ignored. Replaying the confirmed sets in order gives the same bytes the owner had.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import msgpack

# family name -> code in a logged op; the node-keyed families first, then meta
NODE_FAMILIES = ("nodes", "entities", "knowledge", "dirty", "published", "outbox")
FAMILY_CODE = {cf: i for i, cf in enumerate(NODE_FAMILIES + ("meta",))}
FAMILY_NAME = {i: cf for cf, i in FAMILY_CODE.items()}
META = FAMILY_CODE["meta"]

Op = tuple[int, bytes, "bytes | None"]      # (family code, key, value; None = delete)

CLAIM, SET, SNAPSHOT = b"claim", b"set", b"snapshot"
POSITION_PREFIX = b"c:"                     # meta: c:<p(2)> -> [epoch, cseq, last log offset]


def partition_of_key(cf: str, key: bytes) -> int | None:
    """The partition whose movable state this key is, None when it is not movable."""
    if cf in NODE_FAMILIES:
        return int.from_bytes(key[:2], "big")
    if cf == "meta":
        if key.startswith(b"o:") and len(key) > 7:      # o:<topic>:<p(4)>
            return struct.unpack(">I", key[-4:])[0]
        if key.startswith(b"r:") and len(key) == 10:    # r:<reverse p(4)><origin p(4)>
            return struct.unpack(">I", key[2:6])[0]
    return None


def position_key(partition: int) -> bytes:
    return POSITION_PREFIX + partition.to_bytes(2, "big")


@dataclass(frozen=True)
class Position:
    """Where a partition's local state is in its log: the owner's epoch, the last commit
    sequence applied, and the log offset of that commit's last record."""
    epoch: int
    cseq: int
    offset: int

    def pack(self) -> bytes:
        return msgpack.packb([self.epoch, self.cseq, self.offset])

    @classmethod
    def unpack(cls, raw: bytes) -> "Position":
        return cls(*msgpack.unpackb(raw))


# -- records --------------------------------------------------------------------------------
def claim_record(base: int | None, worker: str) -> tuple[bytes, bytes]:
    return CLAIM, msgpack.packb({"base": base, "worker": worker})


def set_records(epoch: int, cseq: int, ops: Iterable[Op], max_bytes: int,
                snapshot: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """The records of one commit's (or snapshot's) ops, each at most about `max_bytes`,
    made as `ops` is read (a snapshot of a large partition never sits in memory whole)."""
    kind = SNAPSHOT if snapshot else SET

    def record(i: int, part: list, end: bool) -> tuple[bytes, bytes]:
        return kind, msgpack.packb({"e": epoch, "s": cseq, "i": i, "end": end,
                                    "ops": [list(op) for op in part]}, use_bin_type=True)

    part: list[Op] = []
    size = i = 0
    for op in ops:
        n = len(op[1]) + (len(op[2]) if op[2] is not None else 0) + 8
        if part and size + n > max_bytes:
            yield record(i, part, False)
            part, size, i = [], 0, i + 1
        part.append(op)
        size += n
    yield record(i, part, True)


def decode(kind: bytes, value: bytes) -> dict:
    doc = msgpack.unpackb(value, raw=False)
    if kind == CLAIM:
        return {"kind": CLAIM, "base": doc["base"]}
    if kind in (SET, SNAPSHOT):
        return {"kind": kind, "e": doc["e"], "s": doc["s"], "i": doc["i"], "end": doc["end"],
                "ops": [(c, k, v) for c, k, v in doc["ops"]]}
    raise ValueError(f"unknown change-log record kind {kind!r}")


# -- replay ---------------------------------------------------------------------------------
@dataclass
class Step:
    """What replay does to the partition: apply `ops` (after dropping everything first when
    `replace`, a snapshot); the state is then at commit `cseq` of owner `epoch`, whose last
    record is at log `offset` (where a replay that already applied this step resumes:
    `Replay.resume`)."""
    cseq: int
    ops: list[Op]
    replace: bool = False
    epoch: int = -1
    offset: int = -1

    def position(self) -> "Position":
        return Position(self.epoch, self.cseq, self.offset)


@dataclass
class Replay:
    """Feed a partition's records in log order (`feed`), then `end` with the base of the
    claim that ends the replay; yields the steps that rebuild the confirmed state."""
    epoch: int = -1
    _pending: Step | None = None
    _parts: list = field(default_factory=list)
    _parts_key: tuple | None = None

    @classmethod
    def resume(cls, applied: Position) -> "Replay":
        """A replay of the records after `applied` (a step's `position()`) that goes on as
        the replay that yielded that step would have: feed it from `applied.offset + 1`. What
        a standby copy of a partition uses to follow its log (`streams.scaleout.standby`)."""
        return cls(epoch=applied.epoch)

    def feed(self, offset: int, kind: bytes, value: bytes) -> Iterator[Step]:
        doc = decode(kind, value)
        if kind == CLAIM:
            yield from self._settle(doc["base"])
            self.epoch = offset
            return
        if doc["e"] > self.epoch and kind == SNAPSHOT and doc["i"] == 0:
            self.epoch = doc["e"]           # its claim is gone (retention): history starts here
        if doc["e"] != self.epoch:          # a fenced-off former owner (or torn history)
            return
        key = (doc["e"], doc["s"], kind)
        if doc["i"] == 0:
            self._parts, self._parts_key = [], key
        elif key != self._parts_key or doc["i"] != len(self._parts):
            self._parts, self._parts_key = [], None        # a part missing: not a whole set
            return
        self._parts.append(doc["ops"])
        if not doc["end"]:
            return
        ops = [op for part in self._parts for op in part]
        self._parts, self._parts_key = [], None
        if self._pending is not None:       # confirmed: its owner wrote the next record
            yield self._pending
            self._pending = None
        if kind == SNAPSHOT:                # a copy of committed state: confirmed already
            yield Step(doc["s"], ops, replace=True, epoch=doc["e"], offset=offset)
        else:
            self._pending = Step(doc["s"], ops, epoch=doc["e"], offset=offset)

    def end(self, base: int | None) -> Iterator[Step]:
        """The replay ends at a claim with this base (None: the claimer keeps no state)."""
        yield from self._settle(base)

    def _settle(self, base: int | None) -> Iterator[Step]:
        pending, self._pending = self._pending, None
        self._parts, self._parts_key = [], None
        if pending is not None and (base is None or base >= pending.cseq):
            yield pending


def replay(records: Iterable[tuple[int, bytes, bytes]], base: int | None = None) -> Iterator[Step]:
    """All steps of `records` ((offset, kind, value) in log order) ended by a claim of `base`."""
    r = Replay()
    for offset, kind, value in records:
        yield from r.feed(offset, kind, value)
    yield from r.end(base)
