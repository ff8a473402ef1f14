"""Where the refresh loop's views are sampled: in its own process, or in a child process that
reads a read-only follower of the store.

A worker's ingest and refresh threads share one interpreter lock, and view sampling is a
large part of a refresh: in the worker's own process it would hold that lock while another
core stands idle. `ViewProcess` moves sampling to a child (`python -m
hirflow.state.view_source`) that follows the store as a RocksDB secondary instance and
catches up before each request, so it reads everything the worker committed before it
asked. Both sources have the same `submit` / `result` interface: the refresh loop submits
the next batch and encodes the current one while the child samples. A request may
carry a `prepare` callable that the child runs on the views too: the refresh loop has it
pack them for its encoder (`encoder.batching.Packer`), also work that would otherwise hold
the lock.

Wire format (pickled messages over a socket pair, `_Channel`): the parent sends the set-up
dict, then a `SampleRequest` per request and `None` to stop; the child answers `("ready",
pid)` or `("error", message)`, then a `SampleReply` per request. Views travel as columns
(each field of all views concatenated, plus their sizes) and world-knowledge vectors as one
matrix: a few arrays instead of thousands of small ones to pickle and unpickle, the latter
under the worker's lock. The anchors' adjacencies come along as `state.edge_columns.EdgeColumns`
(for the super-graph and the neighbour queue): the child decoded those records anyway.
Several children sample one batch together in `state.view_pool.ViewPool`. With several
workers, `peers` routes reads of other workers' nodes to their owners
(`state.routed_reader`), in whichever process samples.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.graph import GraphStore
from hirflow.state.routed_reader import Peers, RoutedReader
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import View, ViewConfig, ViewSampler

NODE_FIELDS = ("types", "hop", "stats")
EDGE_FIELDS = ("edge_src", "edge_dst", "edge_action", "edge_weight", "edge_age")

log = logging.getLogger(__name__)

# what a request may ask the sampling process to make of its views (picklable, e.g.
# `encoder.batching.Packer`: the refresh loop gets packed arrays, not views to pack)
Prepare = Callable[[list[View], Mapping[str, np.ndarray]], Any]


@dataclass(frozen=True)
class Sampled:
    """A batch's views, the world-knowledge vectors of every node in them, the seconds the
    sampling took (catch-up included) where it ran, what the request's `prepare` made
    of the views there (the encoder's packed arrays), if it had one, the adjacencies of
    the requested nodes in the records the views were sampled from, and how many nodes were
    read from other workers (`peer_reads`) or read as missing because their owner did not
    answer (`peer_failures`)."""
    views: list[View]
    knowledge: Mapping[str, np.ndarray]
    seconds: float
    prepared: Any = None
    edges: EdgeColumns | None = None
    peer_reads: int = 0
    peer_failures: int = 0


class SampleRequest(NamedTuple):
    """Parent -> sampling process: forget the cached records of `changed` (None: of `ids`),
    sample `ids` as of `cutoff`, then apply `prepare`."""
    ticket: int
    ids: list[str]
    cutoff: int
    prepare: Prepare | None
    changed: list[str] | None = None


class SampleReply(NamedTuple):
    """Sampling process -> parent, one per request in request order: the views as columns
    (`to_columns`), the world-knowledge vectors of their nodes (`knowledge_ids` rows of
    `knowledge`), what `prepare` made, the adjacencies, the peer read counts; or `error`, a
    traceback."""
    ticket: int
    error: str | None = None
    columns: Any = None
    knowledge_ids: list[str] | None = None
    knowledge: np.ndarray | None = None
    seconds: float = 0.0
    prepared: Any = None
    edges: EdgeColumns | None = None
    peer_reads: int = 0
    peer_failures: int = 0


class LocalViews:
    """Samples in the calling process; `follower` stores catch up with their primary first.
    With `peers`, nodes of other workers are read from their owners and kept `peer_ttl_s`."""

    def __init__(self, store: GraphStore, schema: SchemaConfig, config: ViewConfig, seed: int,
                 defer_free: bool = False, peers: Peers | None = None,
                 peer_ttl_s: float = 30.0) -> None:
        self.store = store
        self.routed = None if peers is None else RoutedReader(store.reader, peers, peer_ttl_s)
        self.reader = self.routed or store.reader
        self.sampler = ViewSampler(self.reader, schema, config, seed=seed)
        self.codes = schema.action_codes()
        self.defer_free = defer_free        # changed nodes' old records freed by `release()`
        self._tickets = itertools.count()
        self._pending: dict[int, tuple[list[str], int, Prepare | None, list[str] | None]] = {}

    def sample(self, ids: list[str], cutoff: int, prepare: Prepare | None = None,
               changed: list[str] | None = None) -> Sampled:
        """Views of `ids` as of `cutoff` (the cached records of `changed`, default `ids`,
        dropped first: they changed), the world-knowledge vectors of every node in them,
        `prepare(views, knowledge)` and the adjacencies of `ids`."""
        t0 = time.perf_counter()
        if self.store.follower:
            self.store.catch_up()
        changed = list(ids if changed is None else changed)
        routed = self.routed
        if routed is not None:            # other workers' nodes read too long ago: read again
            changed += routed.expired()
            reads, failures = routed.reads, routed.failures
        self.sampler.invalidate(changed, defer_free=self.defer_free)
        views = self.sampler.sample(ids, cutoff)
        know = self.reader.knowledge(sorted({n for v in views for n in v.nodes}))
        prepared = prepare(views, know) if prepare is not None and views else None
        edges = EdgeColumns.from_states(ids, self.sampler.records(ids), self.codes)
        got = Sampled(views, know, time.perf_counter() - t0, prepared, edges)
        if routed is None:
            return got
        return dataclasses.replace(got, peer_reads=routed.reads - reads,
                                   peer_failures=routed.failures - failures)

    def submit(self, ids: list[str], cutoff: int, prepare: Prepare | None = None,
               changed: list[str] | None = None) -> int:
        ticket = next(self._tickets)
        self._pending[ticket] = (list(ids), cutoff, prepare, changed)
        return ticket

    def result(self, ticket: int) -> Sampled:
        return self.sample(*self._pending.pop(ticket))

    def close(self) -> None:
        self._pending.clear()


def to_columns(views: list[View]) -> tuple:
    """Views -> (cutoffs, node counts, edge counts, node ids, {field: concatenated array})."""
    arrays = {f: np.concatenate([getattr(v, f) for v in views]) for f in NODE_FIELDS + EDGE_FIELDS} \
        if views else {}
    return ([v.cutoff for v in views], [v.size for v in views], [len(v.edge_src) for v in views],
            [n for v in views for n in v.nodes], arrays)


def from_columns(columns: tuple) -> list[View]:
    """The inverse of `to_columns`; each view's arrays are slices of the shared ones."""
    cutoffs, sizes, edges, nodes, arrays = columns
    out = []
    a = e = 0
    for cutoff, n, m in zip(cutoffs, sizes, edges):
        b, f = a + n, e + m
        out.append(View(anchor=nodes[a], cutoff=cutoff, nodes=tuple(nodes[a:b]),
                        **{k: arrays[k][a:b] for k in NODE_FIELDS},
                        **{k: arrays[k][e:f] for k in EDGE_FIELDS}))
        a, e = b, f
    return out


class _Channel:
    """Length-prefixed pickles over a stream socket, read with MSG_WAITALL: a reply arrives in
    one blocking call, so a reader whose process has another busy thread takes the
    interpreter lock back once, not once per socket-buffer chunk (multiprocessing's
    `Connection`: 300 ms for a 12 MB message while another thread spins, this: 8 ms)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.sock.sendall(len(data).to_bytes(8, "big"))
        self.sock.sendall(data)

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            if k == 0:
                raise EOFError("the channel was closed")
            got += k
        return buf

    def recv(self):
        return pickle.loads(self._read(int.from_bytes(self._read(8), "big")))

    def poll(self, timeout_s: float) -> bool:
        return bool(select.select([self.sock], [], [], timeout_s)[0])

    def close(self) -> None:
        self.sock.close()


class ViewProcessError(RuntimeError):
    """The sampling child failed or exited; the message carries its reason."""


class ViewProcess:
    """Samples in a child process on a follower of `store` (which this process has open)."""

    def __init__(self, store: GraphStore, schema: SchemaConfig, config: ViewConfig, seed: int,
                 start_timeout_s: float = 120.0, name: str = "follower",
                 peers: Peers | None = None, peer_ttl_s: float = 30.0) -> None:
        # the follower's own files (RocksDB's info log) beside the store: one fixed place
        # per store, cleared at start, so a killed worker leaves nothing behind elsewhere
        self._dir = store.path.resolve().with_name(f"{store.path.resolve().name}.{name}")
        shutil.rmtree(self._dir, ignore_errors=True)
        ours, theirs = socket.socketpair()
        try:
            # one thread for whatever a request's `prepare` runs on torch or BLAS: the child
            # works alone, and the threads of a pool spin or wait for each other whenever the
            # other core is busy
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self.proc = subprocess.Popen([sys.executable, "-m", "hirflow.state.view_source", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=env)
        finally:
            theirs.close()
        self.conn = _Channel(ours)
        self._tickets = itertools.count()
        self._replies: dict[int, Sampled] = {}
        self.conn.send({"path": str(store.path.resolve()), "schema": schema,
                        "partitions": store.keys.num_partitions, "config": config, "seed": seed,
                        "follower_dir": str(self._dir), "peers": peers,
                        "peer_ttl_s": peer_ttl_s})
        if not self.conn.poll(start_timeout_s):
            self.close()
            raise ViewProcessError(f"the view sampler process did not start in {start_timeout_s:.0f} s")
        status, detail = self._recv()
        if status != "ready":
            self.close()
            raise ViewProcessError(f"the view sampler process could not open the store: {detail}")
        log.info("sampling views in process %d, a follower of %s", detail, store.path)

    def _exited(self) -> ViewProcessError:
        return ViewProcessError(f"the view sampler process exited (code {self.proc.wait()})")

    def _recv(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise self._exited() from None

    def submit(self, ids: list[str], cutoff: int, prepare: Prepare | None = None,
               changed: list[str] | None = None) -> int:
        ticket = next(self._tickets)
        try:
            self.conn.send(SampleRequest(ticket, list(ids), cutoff, prepare, changed))
        except OSError:
            raise self._exited() from None
        return ticket

    def result(self, ticket: int) -> Sampled:
        """The answer to `ticket`; answers come in request order, earlier ones are kept."""
        while ticket not in self._replies:
            r: SampleReply = self._recv()
            if r.error is not None:
                raise ViewProcessError(f"the view sampler process failed:\n{r.error}")
            knowledge = {} if r.knowledge is None else dict(zip(r.knowledge_ids, r.knowledge))
            self._replies[r.ticket] = Sampled(from_columns(r.columns), knowledge, r.seconds,
                                              r.prepared, r.edges, r.peer_reads, r.peer_failures)
        return self._replies.pop(ticket)

    def sample(self, ids: list[str], cutoff: int, prepare: Prepare | None = None) -> Sampled:
        return self.result(self.submit(ids, cutoff, prepare))

    def close(self, timeout_s: float = 10.0) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _serve(conn: _Channel) -> None:
    """The child: open the follower, answer requests until the parent stops or goes away."""
    init = conn.recv()
    try:
        store = GraphStore(init["path"], init["schema"], init["partitions"],
                           follower_dir=init["follower_dir"])
        # the parent waits for each reply: free the changed nodes' old records after it
        views = LocalViews(store, init["schema"], init["config"], init["seed"], defer_free=True,
                           peers=init["peers"], peer_ttl_s=init["peer_ttl_s"])
    except Exception as exc:   # the parent raises it with this message
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            req: SampleRequest = msg
            try:
                got = views.sample(req.ids, req.cutoff, req.prepare, req.changed)
                keys = list(got.knowledge)
                vectors = np.stack([got.knowledge[k] for k in keys]) if keys else None
                reply = SampleReply(req.ticket, None, to_columns(got.views), keys, vectors,
                                    got.seconds, got.prepared, got.edges, got.peer_reads,
                                    got.peer_failures)
            except Exception:
                reply = SampleReply(req.ticket, traceback.format_exc())
            conn.send(reply)
            views.sampler.release()
            # what survived a request is mostly the sampler's caches (acyclic records, freed by
            # reference counting when evicted): out of the cyclic GC's reach, or every
            # collection walks them again for tens of milliseconds and frees nothing
            gc.freeze()
    except (EOFError, ConnectionError):   # the parent died (kill -9): nobody left to answer
        pass
    finally:
        store.close()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C: the parent stops it in order
    # run the imported module's copy, so the replies it pickles name their classes as
    # `hirflow.state.view_source.SampleReply`, which the parent can load, not `__main__.`
    from hirflow.state import view_source
    view_source._serve(view_source._Channel(socket.socket(fileno=int(sys.argv[1]))))
