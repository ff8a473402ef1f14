"""Engagement and entity events: the wire contract, its msgpack codec and validation.

Values are msgpack maps; a JSON object is accepted too so that kcat and other plain tools
can produce (a msgpack map never starts with ``{``, so the two cannot be confused).
Validation gives one specific reason per bad record; the ingest loop sends it to the
dead-letter topic with the original bytes.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

import msgpack
import msgspec

from hirflow.state.schema import SchemaConfig

SCHEMA_VERSION = 1


class EventError(ValueError):
    """A record that cannot be applied. `reason` is a stable short code; `detail` says more."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Engagement(msgspec.Struct, frozen=True):
    """One engagement: `src` did `action` to `dst` at event time `ts` (ms since epoch).

    A msgspec Struct, so well-formed msgpack decodes straight into it in C (the hot path)."""
    src: str
    dst: str
    action: str
    ts: int
    w: float = 1.0
    id: str | int | None = None
    v: int = SCHEMA_VERSION


class Entity(msgspec.Struct, frozen=True):
    """What is known about a node: text, attributes, an image embedding; newest `ts` wins."""
    node: str
    ts: int
    text: str | None = None
    attrs: dict | None = None
    image_emb: tuple[float, ...] | None = None


def as_dict(ev: Engagement | Entity) -> dict[str, Any]:
    """The wire map of an event, without unset optional fields."""
    return {k: v for k, v in msgspec.structs.asdict(ev).items() if v is not None}


def encode_engagement(ev: Engagement) -> bytes:
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "src": ev.src, "dst": ev.dst,
                         "action": ev.action, "ts": ev.ts}
    if ev.w != 1.0:
        d["w"] = ev.w
    if ev.id is not None:
        d["id"] = ev.id
    return msgpack.packb(d)


def encode_entity(ent: Entity) -> bytes:
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "node": ent.node, "ts": ent.ts}
    if ent.text is not None:
        d["text"] = ent.text
    if ent.attrs is not None:
        d["attrs"] = ent.attrs
    if ent.image_emb is not None:
        d["image_emb"] = list(ent.image_emb)
    return msgpack.packb(d)


def decode_map(raw: bytes | None, max_bytes: int) -> dict:
    """Bytes -> dict, from msgpack or a JSON object; EventError when it is neither."""
    if raw is None:
        raise EventError("empty", "record has no value")
    if len(raw) > max_bytes:
        raise EventError("too_large", f"{len(raw)} bytes > limit {max_bytes}")
    if raw[:1] in (b"{", b" ", b"\n", b"\t", b"\r"):
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise EventError("bad_json", str(exc)[:200] or type(exc).__name__) from None
    else:
        try:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            try:                  # JSON that is no object (a list, a string, null) is no map
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise EventError("undecodable", f"not msgpack or JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise EventError("not_a_map", f"value is a {type(obj).__name__}, not a map")
    return obj


def _utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (JSON can carry lone surrogates, which cannot)."""
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


class Validator:
    """Checks decoded maps against the schema config; built once, used per record."""

    def __init__(self, schema: SchemaConfig, now_ms=lambda: int(time.time() * 1000),
                 id_cache: int = 1 << 20) -> None:
        self.schema = schema
        self.node_types = frozenset(schema.all_node_types)
        self.actions = schema.all_actions
        self.now_ms = now_ms
        # ids seen valid before: with Zipf-skewed traffic most ids repeat, so the full check
        # runs once per id; the set is dropped when it outgrows `id_cache`
        self._valid_ids: set[str] = set()
        self._id_cache = id_cache
        self._lo = schema.min_ts_ms
        self._hi = 0
        self._max_w = schema.max_weight
        self._fast = msgspec.msgpack.Decoder(Engagement).decode

    # -- pieces -------------------------------------------------------------------------
    def node_id(self, value: Any, field: str) -> str:
        if value.__class__ is not str:
            raise EventError("wrong_type", f"{field} must be a string 'type:key'")
        typ, sep, key = value.partition(":")
        if typ not in self.node_types:
            if not sep or not typ:
                raise EventError("malformed_id", f"{field}={value[:80]!r} is not 'type:key'")
            raise EventError("unknown_node_type", f"{field} type {typ!r} is not in the schema: add "
                             "it to schema.extra_node_types, or load the data set's config")
        if not key or len(key) > self.schema.max_key_len or " " in key or not key.isprintable():
            raise EventError("malformed_id", f"{field}={value[:80]!r} is not 'type:key'")
        return value

    def refresh_clock(self) -> None:
        """Re-read the clock for the event-time window (the ingest loop calls it per batch;
        a record beyond the cached bound is re-checked against the clock, never refused early)."""
        self._hi = self.now_ms() + self.schema.max_future_ms

    def timestamp(self, value: Any) -> int:
        if value.__class__ is not int:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EventError("wrong_type", "ts must be an integer (ms since epoch)")
            if not math.isfinite(value):
                raise EventError("bad_ts", f"ts={value!r} is not finite")
            value = int(value)
        lo = self._lo
        if not lo <= value <= self._hi:
            self.refresh_clock()
            if not lo <= value <= self._hi:
                raise EventError("ts_out_of_window", f"ts={value} outside [{lo}, {self._hi}]")
        return value

    def _version(self, d: dict) -> None:
        v = d.get("v", SCHEMA_VERSION)
        if v != SCHEMA_VERSION:
            raise EventError("unsupported_version", f"v={v!r}, this worker reads {SCHEMA_VERSION}")

    # -- records ------------------------------------------------------------------------
    def engagement(self, d: dict) -> Engagement:
        """The hot path: one call per consumed record, so checks are ordered cheap-first."""
        if d.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
            self._version(d)
        try:
            src, dst, action, ts = d["src"], d["dst"], d["action"], d["ts"]
        except KeyError as exc:
            raise EventError("missing_field", str(exc.args[0])) from None
        valid = self._valid_ids
        try:
            cached = src in valid and dst in valid
        except TypeError:           # an unhashable id: let node_id name the problem
            cached = False
        if not cached:
            self.node_id(src, "src")
            self.node_id(dst, "dst")
            if len(valid) >= self._id_cache:
                valid.clear()
            valid.add(src)
            valid.add(dst)
        if src == dst:
            raise EventError("self_loop", f"src and dst are both {src!r}")
        try:
            known = action in self.actions
        except TypeError:           # an unhashable action (list, map)
            known = False
        if not known:
            if not isinstance(action, str):
                raise EventError("wrong_type", "action must be a string")
            raise EventError("unknown_action", f"action {action[:40]!r}")
        if ts.__class__ is not int or not self._lo <= ts <= self._hi:
            ts = self.timestamp(ts)
        w = d.get("w", 1.0)
        if w.__class__ is not float:
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise EventError("wrong_type", "w must be a number")
            try:
                w = float(w)
            except OverflowError:
                raise EventError("bad_weight", "w overflows a float") from None
        if not 0.0 < w <= self.schema.max_weight:
            if not math.isfinite(w):
                raise EventError("bad_weight", f"w={w!r} is not finite")
            raise EventError("bad_weight", f"w={w!r} outside (0, {self.schema.max_weight}]")
        eid = d.get("id")
        if eid is not None:
            if isinstance(eid, bool) or not isinstance(eid, (str, int)):
                raise EventError("wrong_type", "id must be a string or integer")
            if isinstance(eid, int) and not -2 ** 63 <= eid < 2 ** 64:
                raise EventError("bad_id", "an integer id must fit 64 bits")
            if isinstance(eid, str) and (len(eid) > self.schema.max_key_len or not _utf8(eid)):
                raise EventError("bad_id", "id must be valid text of at most max_key_len chars")
        return Engagement(src, dst, action, ts, w, eid)

    def entity(self, d: dict) -> Entity:
        self._version(d)
        for f in ("node", "ts"):
            if f not in d:
                raise EventError("missing_field", f)
        node = self.node_id(d["node"], "node")
        ts = self.timestamp(d["ts"])
        text = d.get("text")
        if text is not None:
            if not isinstance(text, str):
                raise EventError("wrong_type", "text must be a string")
            if len(text) > self.schema.max_text_len:
                raise EventError("too_large", f"text of {len(text)} chars")
            if not _utf8(text):
                raise EventError("bad_text", "text is not valid Unicode (a lone surrogate)")
        attrs = d.get("attrs")
        if attrs is not None:
            if not isinstance(attrs, dict):
                raise EventError("wrong_type", "attrs must be a map")
            if not all(isinstance(k, str) for k in attrs):
                raise EventError("bad_attrs", "attrs keys must be strings")
            try:                            # stored as msgpack: what it cannot hold is refused
                msgpack.packb(attrs)
            except (OverflowError, TypeError, ValueError) as exc:
                raise EventError("bad_attrs", f"attrs cannot be stored: {exc}") from None
        emb = d.get("image_emb")
        if emb is not None:
            try:
                emb = tuple(float(x) for x in emb) if isinstance(emb, (list, tuple)) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in emb) else None
            except OverflowError:
                emb = None
            if not emb or not all(math.isfinite(x) for x in emb):
                raise EventError("bad_embedding", "image_emb must be a non-empty list of finite numbers")
        return Entity(node, ts, text, attrs, emb)

    def decode_engagement(self, raw: bytes | None) -> Engagement:
        """Bytes -> Engagement. Fast path: msgspec decodes and type-checks a msgpack map in C,
        then only the schema checks run here; anything it refuses takes the slow path, which
        names the precise reason."""
        if raw and raw[0] >= 0x80 and len(raw) <= self.schema.max_payload_bytes:
            try:
                e = self._fast(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                e = None
            if e is not None:
                valid = self._valid_ids
                src, dst = e.src, e.dst
                if (src in valid and dst in valid and e.action in self.actions and e.v == 1
                        and self._lo <= e.ts <= self._hi and 0.0 < e.w <= self._max_w
                        and src != dst):
                    return e
        return self.engagement(decode_map(raw, self.schema.max_payload_bytes))

    def decode_entity(self, raw: bytes | None) -> Entity:
        return self.entity(decode_map(raw, self.schema.max_payload_bytes))

