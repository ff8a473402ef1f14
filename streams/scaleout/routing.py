"""Routed node queries: which worker owns a node, and forwarding a query to it.

A node lives on its Kafka partition's worker (`p % worker.count == worker.index`), so a
Service in front of several workers reaches the wrong one for most nodes. With
`worker.peer_url` set (worker k's API base URL, `{index}` standing for k; the chart points
it at the StatefulSet's headless Service), a worker answers a query about another worker's
node by asking that worker and passing its answer on, status and body unchanged. A
forwarded request carries `X-Hirflow-Forwarded-By`; a worker never forwards such a request
again, so two workers that disagree about ownership cannot bounce a query between them.
"""
from __future__ import annotations

import asyncio
import json
from urllib.parse import urlencode

import aiohttp

from hirflow.state.keys import partition_of

FORWARDED = "X-Hirflow-Forwarded-By"
TIMEOUT_S = 5.0


def owner_of(node: str, partitions: int, count: int) -> int:
    """The index of the worker that owns `node`: its partition's p % count."""
    return partition_of(node, partitions) % count


def partitions_of(index: int, count: int, partitions: int) -> list[int]:
    """The partitions worker `index` of `count` owns: those p with p % count == index."""
    return [p for p in range(partitions) if p % count == index]


class NodeRouter:
    def __init__(self, index: int, count: int, partitions: int, peer_url: str = "") -> None:
        self.index, self.count, self.partitions, self.peer_url = index, count, partitions, peer_url
        self._session: aiohttp.ClientSession | None = None

    def owner(self, node: str) -> int:
        return owner_of(node, self.partitions, self.count)

    def owned(self) -> list[int]:
        return partitions_of(self.index, self.count, self.partitions)

    def assignment(self) -> dict:
        """What `/v1/status` reports: this worker, the worker count, its partitions."""
        return {"index": self.index, "count": self.count, "partitions": self.owned(),
                "routes_to": self.peer_url or None}

    def remote(self, node: str | None, headers) -> int | None:
        """The owner to forward a query about `node` to, or None to answer here (a local
        node, no peer URL, or a request that was forwarded already)."""
        if not node or not self.peer_url or self.count == 1 or FORWARDED in headers:
            return None
        owner = self.owner(node)
        return None if owner == self.index else owner

    def others(self) -> list[int]:
        """The workers a retrieval asks for their items: all but this one, with a peer URL."""
        return [j for j in range(self.count) if j != self.index] if self.peer_url else []

    async def merged(self, local: dict, params, authorization: str | None) -> dict:
        """`local` (this worker's `retrieve` or `similar` answer, with its `query` and
        `types`) with every other worker's best nodes of those types for the same query,
        best score first, `k` in all. A worker that does not answer, or serves another
        model (a hot swap in progress), is left out and counted in `workers`."""
        query = local.pop("query", None)
        others = self.others()
        if not others or query is None:       # a neighbourhood answer has no query to share
            return local
        k = query["k"]
        ask = {"q": query["embedding"], "tokens": ",".join(map(str, query["tokens"])),
               "model": local["model"], "k": str(k), "types": ",".join(local["types"])}
        if params.get("probes"):
            ask["probes"] = params["probes"]
        path = "/v1/internal/search?" + urlencode(ask)
        answers = await asyncio.gather(*(self.forward(j, path, authorization) for j in others))
        results, answered = list(local["results"]), 0
        for status, body in answers:
            if status == 200:
                results.extend(json.loads(body)["results"])
                answered += 1
        results.sort(key=lambda r: -r["score"])
        return {**local, "results": results[:k],
                "workers": {"asked": len(others) + 1, "answered": answered + 1}}

    async def forward(self, owner: int, path_qs: str, authorization: str | None) -> tuple[int, bytes]:
        """GET `path_qs` on worker `owner` -> (status, JSON body); 502 when it cannot answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        headers = {FORWARDED: str(self.index)}
        if authorization:
            headers["Authorization"] = authorization
        url = self.peer_url.format(index=owner).rstrip("/") + path_qs
        try:
            async with self._session.get(url, headers=headers) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return 502, json.dumps({"error": f"worker {owner}, which owns this node, did not "
                                             f"answer at {url.split('?')[0]}: {type(exc).__name__}"}).encode()
