"""Token changes: the record on `hirflow.token-changes` (key = node id; docs/wire-formats.md).

`node`, `model` (checkpoint id), `seq` (per node, strictly increasing), `tokens`, `added`,
`removed`, `assign` (primitive per level, -1 = none yet), `event_ts` (oldest event that
caused it), `ts` (emit time). Freshness = ts - event_ts.
"""
from __future__ import annotations

import msgspec


class TokenChange(msgspec.Struct, frozen=True):
    node: str
    model: str
    seq: int
    tokens: list[int]
    added: list[int]
    removed: list[int]
    assign: list[int]
    event_ts: int
    ts: int


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(TokenChange).decode


def encode(change: TokenChange) -> bytes:
    return _encode(change)


def decode(raw: bytes) -> TokenChange:
    """Raises msgspec.ValidationError / DecodeError for anything that is not a token change."""
    return _decode(raw)


def removal(node: str, model: str, seq: int, before_tokens, event_ts: int, ts: int) -> TokenChange:
    """The change that tells subscribers a node left the index (expired): no tokens."""
    return TokenChange(node, model, seq, [], [], sorted(int(t) for t in before_tokens), [],
                       event_ts, ts)


def diff(node: str, model: str, seq: int, tokens, assign, before: tuple | None,
         event_ts: int, ts: int) -> TokenChange | None:
    """The change to publish, or None when nothing a subscriber sees differs from `before`
    (the published (seq, model, tokens, assign))."""
    tokens, assign = [int(t) for t in tokens], [int(a) for a in assign]
    if before is not None:
        _, m0, t0, a0 = before
        if m0 == model and sorted(t0) == sorted(tokens) and list(a0) == assign:
            return None
        old = set(t0)
    else:
        old = set()
    new = set(tokens)
    return TokenChange(node, model, seq, tokens, sorted(new - old), sorted(old - new), assign,
                       int(event_ts), int(ts))
