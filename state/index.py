"""The serving index in RocksDB: per-node embeddings, BoM postings, primitive members, what
subscribers were last told, and the outbox of token changes not yet acknowledged by Kafka.

Everything a model produces is keyed by an index *generation* (2 bytes), so a new
checkpoint's index is built beside the one serving and switched in by one write of the
active-generation key. Column families (`nk` = a `state.keys` node key):

- ``embeddings``  gen + nk                          -> `IndexRecord`
- ``postings``    gen + token(4) + type(1) + nk     -> b"" (prefix scan = one token's nodes)
- ``members``     gen + level(1) + prim(4) + nk     -> b"" (prefix scan = one primitive's nodes)
- ``published``   nk -> [seq, model, tokens, assign]  (generation-free: what subscribers saw)
- ``outbox``      nk + seq(8)                       -> encoded token change, deleted once acked

An `IndexBatch` gathers the puts and deletes of one refresh into a single `WriteBatch`
(together with the dirty markers it clears), so records, postings and the outbox never
disagree after a crash.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import msgspec
import numpy as np

from hirflow.state.graph import GraphStore
from hirflow.state.schema import UNKNOWN_TYPE, node_type, type_code_map

ACTIVE_KEY = b"index:active"        # meta -> [gen, model id, checkpoint path or None]
BUILDING_KEY = b"index:building"    # meta -> [gen, model id, checkpoint path] during a swap
ANNOUNCE_PASS_KEY = b"index:announce"  # meta -> gen whose switch still has changes to emit
ANNOUNCED_TS_KEY = b"index:announced_ts"  # meta -> ts of the newest announcement acted on
NO_PRIMITIVE = -1                   # assignment of a node served without a checkpoint


class Generation(NamedTuple):
    """One generation of the index: its number, the model id it holds and the checkpoint the
    model came from (no model and no path for the cold-start generation 0)."""
    gen: int
    model: str | None
    path: str | None

_enc = msgspec.msgpack.Encoder().encode
_dec = msgspec.msgpack.Decoder().decode


@dataclass(frozen=True, eq=False)
class IndexRecord:
    node: str
    model: str
    seq: int                    # the node's token-change sequence when this record was made
    emb: np.ndarray             # (d,) float32, unit norm
    tokens: tuple[int, ...]     # BoM tokens (one per codebook)
    assign: tuple[int, ...]     # primitive per level, coarse to fine
    event_ts: int               # oldest event this refresh accounted for
    ts: int                     # when it was computed

    def pack(self) -> bytes:
        return _enc([self.node, self.model, self.seq, np.asarray(self.emb, np.float32).tobytes(),
                     list(self.tokens), list(self.assign), self.event_ts, self.ts])

    @classmethod
    def unpack(cls, raw: bytes) -> "IndexRecord":
        node, model, seq, emb, tokens, assign, event_ts, ts = _dec(raw)
        return cls(node, model, seq, np.frombuffer(emb, np.float32), tuple(tokens), tuple(assign),
                   event_ts, ts)


def gen_prefix(gen: int) -> bytes:
    return struct.pack(">H", gen & 0xFFFF)


def posting_prefix(gen: int, token: int, type_code: int | None = None) -> bytes:
    p = gen_prefix(gen) + struct.pack(">I", token)
    return p if type_code is None else p + bytes([type_code])


def member_prefix(gen: int, level: int, prim: int) -> bytes:
    return gen_prefix(gen) + bytes([level]) + struct.pack(">I", prim & 0xFFFFFFFF)


class TokenIndex:
    """Reads and batched writes of the index column families of one `GraphStore`."""

    CFS = ("embeddings", "postings", "members", "published", "outbox")

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self.key = store.keys.key
        self.type_code = type_code_map(store.schema.all_node_types)
        self.cf = store.cf
        self.h = store.handle

    # -- generations ----------------------------------------------------------------------
    def _meta(self, key: bytes):
        raw = self.cf["meta"].get(key)
        return None if raw is None else _dec(raw)

    def active(self) -> Generation:
        """The serving generation; generation 0 and no model when fresh."""
        v = self._meta(ACTIVE_KEY)
        return Generation(0, None, None) if v is None else Generation(*v)

    def building(self) -> Generation | None:
        """The generation a hot swap is building, if one is under way."""
        v = self._meta(BUILDING_KEY)
        return None if v is None else Generation(*v)

    def announced_ts(self) -> int:
        return self._meta(ANNOUNCED_TS_KEY) or 0

    def announce_pending(self) -> int | None:
        return self._meta(ANNOUNCE_PASS_KEY)

    # -- reads ----------------------------------------------------------------------------
    def records(self, gen: int, node_ids: Sequence[str]) -> list[IndexRecord | None]:
        if not node_ids:
            return []
        g = gen_prefix(gen)
        raws = self.cf["embeddings"].get([g + self.key(n) for n in node_ids])
        return [None if r is None else IndexRecord.unpack(r) for r in raws]

    def iter_records(self, gen: int) -> Iterator[IndexRecord]:
        for _, v in self._scan("embeddings", gen_prefix(gen)):
            yield IndexRecord.unpack(v)

    def published(self, node_ids: Sequence[str]) -> list[tuple | None]:
        """Per node: (seq, model, tokens, assign) last put in the outbox, or None."""
        if not node_ids:
            return []
        raws = self.cf["published"].get([self.key(n) for n in node_ids])
        return [None if r is None else tuple(_dec(r)) for r in raws]

    def outbox(self) -> Iterator[tuple[bytes, bytes]]:
        """(outbox key, encoded change) in node-key, seq order."""
        yield from self._scan("outbox", b"")

    def count(self, gen: int, cf: str = "embeddings") -> int:
        return sum(1 for _ in self._scan(cf, gen_prefix(gen)))

    def _scan(self, cf: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.store.reader._iter_prefix(cf, prefix)

    # -- writes ---------------------------------------------------------------------------
    def batch(self) -> "IndexBatch":
        return IndexBatch(self)

    def clear_generation(self, gen: int) -> int:
        """Delete every record, posting and member of a generation (after a switch, or a
        swap that restarts); returns keys deleted."""
        return sum(self.delete_prefix(cf, gen_prefix(gen)) for cf in ("embeddings", "postings", "members"))

    def delete_prefix(self, cf: str, prefix: bytes, chunk: int = 50_000) -> int:
        """Delete all keys of `cf` under `prefix`, `chunk` per write batch."""
        n = 0
        while True:
            keys = [k for k, _ in zip((k for k, _ in self._scan(cf, prefix)), range(chunk))]
            if not keys:
                return n
            wb = self.store.batch()
            for k in keys:
                wb.delete(cf, k)
            self.store.write(wb)
            n += len(keys)


class IndexBatch:
    """The puts and deletes of one refresh, written atomically by `commit`."""

    def __init__(self, index: TokenIndex) -> None:
        self.ix = index
        self.wb = index.store.batch()

    def put_record(self, gen: int, rec: IndexRecord, old: IndexRecord | None) -> None:
        """Store `rec` in generation `gen`, moving its postings and memberships from `old`."""
        ix, wb = self.ix, self.wb
        nk = ix.key(rec.node)
        g = gen_prefix(gen)
        tc = ix.type_code.get(node_type(rec.node), UNKNOWN_TYPE) & 0xFF     # one byte
        wb.put("embeddings", g + nk, rec.pack())
        old_tokens = set(old.tokens) if old is not None else set()
        new_tokens = set(rec.tokens)
        for t in old_tokens - new_tokens:
            wb.delete("postings", posting_prefix(gen, t, tc) + nk)
        for t in new_tokens - old_tokens:
            wb.put("postings", posting_prefix(gen, t, tc) + nk, b"")
        old_assign = old.assign if old is not None else ()
        for level, prim in enumerate(rec.assign):
            was = old_assign[level] if level < len(old_assign) else None
            if was == prim:
                continue
            if was is not None and was != NO_PRIMITIVE:
                wb.delete("members", member_prefix(gen, level, was) + nk)
            if prim != NO_PRIMITIVE:
                wb.put("members", member_prefix(gen, level, prim) + nk, b"")

    def delete_record(self, gen: int, old: IndexRecord) -> None:
        """Remove a node from generation `gen`: its record, postings and memberships."""
        ix, wb = self.ix, self.wb
        nk = ix.key(old.node)
        tc = ix.type_code.get(node_type(old.node), UNKNOWN_TYPE) & 0xFF
        wb.delete("embeddings", gen_prefix(gen) + nk)
        for t in set(old.tokens):
            wb.delete("postings", posting_prefix(gen, t, tc) + nk)
        for level, prim in enumerate(old.assign):
            if prim != NO_PRIMITIVE:
                wb.delete("members", member_prefix(gen, level, prim) + nk)

    def publish(self, node_id: str, seq: int, model: str, tokens, assign, change: bytes) -> None:
        """Remember what subscribers will see and queue the change in the outbox."""
        nk = self.ix.key(node_id)
        self.wb.put("published", nk, _enc([seq, model, list(tokens), list(assign)]))
        self.wb.put("outbox", nk + struct.pack(">Q", seq), change)

    def clear_dirty(self, node_ids) -> None:
        for n in node_ids:
            self.wb.delete("dirty", self.ix.key(n))

    def set_meta(self, key: bytes, value) -> None:
        if value is None:
            self.wb.delete("meta", key)
        else:
            self.wb.put("meta", key, _enc(value))

    def put_raw(self, cf: str, key: bytes, value: bytes) -> None:
        self.wb.put(cf, key, value)

    def delete_raw(self, cf: str, key: bytes) -> None:
        self.wb.delete(cf, key)

    def commit(self) -> None:
        self.ix.store.write(self.wb)
        self.wb = self.ix.store.batch()


def delete_outbox(index: TokenIndex, keys: Sequence[bytes]) -> None:
    """Drop changes Kafka acknowledged (a crash before this only causes a resend)."""
    if keys:
        wb = index.store.batch()
        for k in keys:
            wb.delete("outbox", k)
        index.store.write(wb)
