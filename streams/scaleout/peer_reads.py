"""Reading another worker's nodes for view sampling: the client side of
`POST /v1/internal/records` (`state.routed_reader` decides what to ask and caches it).

A request carries a msgpack list of node ids; the owner answers a msgpack list of
`[record, knowledge]` pairs in the same order: each node's packed record and world-knowledge
vector as its store holds them (None where it has none, also for a node it does not own).
Packed records rather than JSON: a hub node's record is kilobytes, and the asking sampler
decodes it exactly as it decodes its own store's.

`PeerRecords` is a small frozen dataclass so that it can be sent to the sampling processes
(`state.view_source`), which ask from there with blocking HTTP (they are not on an event loop).
"""
from __future__ import annotations

import http.client
import urllib.request
from dataclasses import dataclass

import msgpack

from hirflow.state.routed_reader import PeerUnavailable, Raw
from hirflow.streams.scaleout.routing import FORWARDED, owner_of

PATH = "/v1/internal/records"
MAX_IDS = 10_000            # most ids one request may ask for (400 beyond)


@dataclass(frozen=True)
class PeerRecords:
    index: int                  # this worker
    count: int
    partitions: int
    peer_url: str               # worker k's API base URL, {index} standing for k
    token: str = ""             # worker.api_token, when the API asks for one
    timeout_s: float = 2.0

    @classmethod
    def of(cls, cfg) -> "PeerRecords | None":
        """The peers of a worker configured by `cfg` (a `HirflowConfig`); None when it is
        alone or has no `worker.peer_url`."""
        w = cfg.worker
        if w.count == 1 or not w.peer_url:
            return None
        return cls(w.index, w.count, cfg.kafka.partitions, w.peer_url, w.api_token)

    def owner(self, node: str) -> int:
        return owner_of(node, self.partitions, self.count)

    def post(self, owner: int, path: str, payload) -> bytes:
        """POST `payload` as msgpack to worker `owner`'s `path` -> the answer's body;
        `PeerUnavailable` when it does not answer 2xx in `timeout_s`."""
        url = self.peer_url.format(index=owner).rstrip("/") + path
        headers = {"Content-Type": "application/msgpack", FORWARDED: str(self.index)}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=msgpack.packb(payload), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                return r.read()
        except (OSError, http.client.HTTPException) as exc:   # URLError, HTTPError, timeouts
            raise PeerUnavailable(f"{url}: {exc}") from None

    def fetch(self, owner: int, ids: list[str]) -> list[Raw]:
        body = self.post(owner, PATH, ids)
        try:
            return [(pair[0], pair[1]) for pair in msgpack.unpackb(body)]
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise PeerUnavailable(f"worker {owner}: not a list of [record, knowledge] ({exc})") from None


def answer(reader, owner, index: int, body: bytes) -> bytes:
    """The owner's side: `body` (a msgpack list of ids) -> the msgpack answer, None for the
    nodes worker `index` does not own (`owner(node)` says whose they are). ValueError
    for a body that is not a list of at most MAX_IDS strings."""
    try:
        ids = msgpack.unpackb(body)
    except ValueError as exc:
        raise ValueError(f"the body must be a msgpack list of node ids ({exc})") from None
    if not isinstance(ids, list) or not all(isinstance(n, str) for n in ids):
        raise ValueError("the body must be a msgpack list of node ids (strings)")
    if len(ids) > MAX_IDS:
        raise ValueError(f"at most {MAX_IDS} ids per request, got {len(ids)}")
    mine = [n for n in ids if owner(n) == index]
    got = dict(zip(mine, reader.raw(mine)))
    return msgpack.packb([got.get(n, (None, None)) for n in ids])
