"""Training batches sampled and packed ahead of the model, in worker threads.

The pipeline owns the time-honest training state: events are applied to a fresh graph store
chunk by chunk with the serving `state` code, and the batches of chunk k are sampled as of the
chunk's start from chunks < k only. Workers run up to `prefetch` batches ahead of the model
(the model only waits when they fall behind; the trainer measures that wait). Every batch draws
its negatives and walks from its own generator, seeded by (seed, step), so the batches, and
with them the checkpoint, are the same for any number of workers; a chunk's shuffle is seeded
by (seed, chunk, pass), so a resumed run skips chunks without replaying generators. A share
of student views whose anchor has text is replaced by the anchor alone (`cold_view`): the
student then learns to place a node from type + world knowledge as the teacher places it
from its full broad view, which is how a cold node is served. A chunk's
events are written only after all of its batches are sampled, and the next chunk is sampled
only after that write.
"""
from __future__ import annotations

import bisect
import math
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from hirflow.encoder.batching import PackConfig, PackedBatch, pack
from hirflow.state.decay import value_at
from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig, node_type
from hirflow.state.views import ViewConfig, ViewSampler, cold_view, with_prefix
from hirflow.state.writer import BOTH_SIDES, GraphWriter


@dataclass(frozen=True)
class Prepared:
    """One step's inputs: packed student and teacher views of its anchors, and the
    (src, dst, action, label) rows of its positives and typed negatives."""
    step: int
    chunk: int
    cutoff: int
    student: PackedBatch
    teacher: PackedBatch
    src: torch.Tensor
    dst: torch.Tensor
    action: torch.Tensor
    label: torch.Tensor
    anchors: int
    teacher_idx: torch.Tensor       # (T,) anchors that also have a teacher view (distillation)
    log_q: torch.Tensor             # (V,) log expected count of each anchor among a batch's
                                    # softmax candidates (destinations and sampled items)
    sampled: torch.Tensor           # (S,) anchors drawn uniformly from the item pool: negatives
                                    # every step has, whoever its positives belong to
    src_node: torch.Tensor          # (rows,) the anchor of each row's source node: `src` may be
                                    # an instance of it as of that row's positive


@dataclass(frozen=True)
class ChunkDone:
    """All steps of `chunk` have been handed out and its events are in the store."""
    chunk: int


def chunk_plan(events: Sequence[Engagement], chunk_ms: int, batch_edges: int, max_steps: int | None,
               seed: int, passes: int = 1, cuts: Sequence[int] = ()) -> list[list[np.ndarray]]:
    """Per time chunk, the event indices of each of its steps (chunk 0 only builds state):
    `passes` shuffles of the chunk's events, up to `max_steps` batches each (None: all).
    Chunks are `chunk_ms` long from the first event; each time in `cuts` also begins one."""
    t0 = events[0].ts
    ts = np.fromiter((e.ts for e in events), np.int64, len(events))
    ids = (ts - t0) // chunk_ms + np.searchsorted(np.sort(np.asarray(cuts, np.int64)), ts, "right")
    chunks = np.split(np.arange(len(events)), np.flatnonzero(np.diff(ids)) + 1)
    plan = []
    for k, idx in enumerate(chunks):
        if k == 0:
            plan.append([idx])              # no steps: the first chunk only builds state
            continue
        steps = [idx]
        for p in range(passes):
            order = idx[np.argsort(np.random.default_rng([seed, k, p]).random(len(idx)), kind="stable")]
            n = math.ceil(len(order) / batch_edges)
            n = n if max_steps is None else min(max_steps, n)
            steps.extend(order[b * batch_edges:(b + 1) * batch_edges] for b in range(n))
        plan.append(steps)
    return plan


def _chunk_indices(events: Sequence[Engagement], plan: list[list[np.ndarray]], chunk_prefix: int
                   ) -> tuple[dict[int, dict[str, tuple[list[int], list[int]]]], dict[int, dict[str, float]]]:
    """Per chunk with steps: source -> (times, event indices) of its events in the chunk in
    time order (only with `chunk_prefix`), and each destination's share of its events."""
    by_src_of: dict[int, dict[str, tuple[list[int], list[int]]]] = {}
    dst_share: dict[int, dict[str, float]] = {}
    for k, steps in enumerate(plan):
        if len(steps) > 1 and chunk_prefix:
            by_src: dict[str, tuple[list[int], list[int]]] = {}
            for i in sorted(steps[0], key=lambda i: (events[i].ts, i)):
                ts, ids = by_src.setdefault(events[i].src, ([], []))
                ts.append(events[i].ts)
                ids.append(int(i))
            by_src_of[k] = by_src
        if len(steps) > 1:
            counts: dict[str, int] = {}
            for i in steps[0]:
                counts[events[i].dst] = counts.get(events[i].dst, 0) + 1
            dst_share[k] = {n: c / len(steps[0]) for n, c in counts.items()}
    return by_src_of, dst_share


class BatchPipeline:
    """Iterate `Prepared` steps and `ChunkDone` markers in order; see the module docstring.

    `plan[k][0]` are chunk k's events, `plan[k][1:]` its steps' events. Chunks before
    `start_chunk` are only applied (resume)."""

    def __init__(self, events: Sequence[Engagement], plan: list[list[np.ndarray]], store_dir: Path,
                 schema: SchemaConfig, teacher_view: ViewConfig, student_view: ViewConfig,
                 pack_cfg: PackConfig, a_index: Mapping[str, int], negatives: int, seed: int,
                 texts: Mapping[str, np.ndarray] | None = None, workers: int = 1, prefetch: int = 4,
                 start_chunk: int = 0, cold_share: float = 0.0,
                 teacher_anchors: int | None = None, sampled_negatives: int = 0,
                 chunk_prefix: int = 0) -> None:
        self.events, self.plan, self.schema = events, plan, schema
        self.views = (teacher_view, student_view)
        self.pack_cfg, self.a_index, self.negatives, self.seed = pack_cfg, a_index, negatives, seed
        self.texts, self.workers, self.prefetch, self.start_chunk = texts, workers, max(1, prefetch), start_chunk
        self.cold_share = cold_share
        self.teacher_anchors = teacher_anchors
        self.sampled_negatives = sampled_negatives
        self.chunk_prefix = chunk_prefix
        self.item_types = set(schema.item_node_types)
        self.items: list[str] = []                    # items seen so far (sampled negatives)
        self.store = GraphStore(store_dir, schema, 1)
        self.writer = GraphWriter(self.store, GraphConfig(path=str(store_dir)))
        self.by_type: dict[str, list[str]] = {}       # node type -> nodes seen so far (negatives)
        self.seen: set[str] = set()
        self._samplers: list[tuple[ViewSampler, ViewSampler]] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self.sample_s = 0.0        # sampling + packing time, summed over workers
        self._by_src, self._dst_share = _chunk_indices(events, plan, chunk_prefix)

    def _pair(self) -> tuple[ViewSampler, ViewSampler]:
        pair = getattr(self._local, "pair", None)
        if pair is None:
            pair = tuple(ViewSampler(self.store.reader, self.schema, v, seed=self.seed + i)
                         for i, v in enumerate(self.views))
            self._local.pair = pair
            with self._lock:
                self._samplers.append(pair)
        return pair

    def final_sampler(self, view: ViewConfig) -> ViewSampler:
        return ViewSampler(self.store.reader, self.schema, view, seed=self.seed + 1)

    def steps_before(self, chunk: int) -> int:
        return sum(len(p) - 1 for p in self.plan[:chunk])

    # -- one batch ------------------------------------------------------------------------
    def _prepare(self, step: int, chunk: int, cutoff: int, idx: np.ndarray) -> Prepared:
        t = time.perf_counter()
        rng = np.random.default_rng([self.seed, step])
        batch = [self.events[i] for i in idx]
        anchors = sorted({n for e in batch for n in (e.src, e.dst)})
        pos = {n: i for i, n in enumerate(anchors)}
        negs = []
        for e in batch:                                  # negatives of the dst's node type
            pool = self.by_type.get(node_type(e.dst)) or [e.dst]
            negs.extend(pool[j] for j in rng.integers(0, len(pool), self.negatives))
        # items drawn uniformly from every item seen before this chunk (mixed negatives)
        drawn = [self.items[j] for j in rng.integers(0, len(self.items), self.sampled_negatives)] \
            if self.sampled_negatives and self.items else []
        for n in sorted((set(negs) | set(drawn)) - set(pos)):
            pos[n] = len(anchors)
            anchors.append(n)
        teacher, student = self._pair()
        s_views = student.sample(anchors, cutoff, rng=rng)
        n_anchors = len(anchors)
        # each positive's source as of that positive: its view with its own earlier
        # engagements of this chunk, one more view per distinct prefix (`_at_positives`)
        src_of = [pos[e.src] for e in batch]
        if self.chunk_prefix:
            more, src_of = self._at_positives(chunk, batch, pos, s_views, student, cutoff, rng)
            s_views = s_views + more
        if self.cold_share > 0 and self.texts:          # cold-start drill, anchors with text only
            drill = rng.random(len(s_views)) < self.cold_share
            s_views = [cold_view(v) if d and v.anchor in self.texts else v for v, d in zip(s_views, drill)]
        s = pack(s_views, self.pack_cfg, knowledge=self.texts)
        t_idx = np.arange(n_anchors)
        if self.teacher_anchors is not None and n_anchors > self.teacher_anchors:
            # broad views cost ~8x a narrow one: distil on a seeded subset of the anchors
            t_idx = np.sort(rng.choice(n_anchors, self.teacher_anchors, replace=False))
        te = pack(teacher.sample([anchors[i] for i in t_idx], cutoff, rng=rng), self.pack_cfg,
                  knowledge=self.texts)
        r = 1 + self.negatives
        src = torch.tensor([k for k in src_of for _ in range(r)])
        # which node each row's source is (its other positives are no negatives of it)
        src_node = torch.tensor([pos[e.src] for e in batch for _ in range(r)])
        dst = torch.tensor([x for i, e in enumerate(batch) for x in
                            [pos[e.dst]] + [pos[n] for n in negs[i * self.negatives:(i + 1) * self.negatives]]])
        act = torch.tensor([self.a_index[e.action] for e in batch for _ in range(r)])
        label = torch.tensor([1.0 if j == 0 else 0.0 for _ in batch for j in range(r)])
        # how often an anchor is expected among a batch's candidates: its share of the
        # chunk's events times the batch size, plus the uniform draws' share of the item pool
        # (the sampled softmax's logQ correction)
        share = self._dst_share.get(chunk, {})
        uniform = len(drawn) / len(self.items) if drawn else 0.0
        log_q = torch.tensor([np.log(max(share.get(n, 0.0) * len(batch)
                                         + (uniform if node_type(n) in self.item_types else 0.0), 1e-6))
                              for n in anchors] + [0.0] * (len(s_views) - n_anchors), dtype=torch.float32)
        dt = time.perf_counter() - t
        with self._lock:
            self.sample_s += dt
        return Prepared(step, chunk, cutoff, s, te, src, dst, act, label, len(s_views),
                        torch.from_numpy(t_idx), log_q,
                        torch.tensor(sorted({pos[n] for n in drawn}), dtype=torch.long), src_node)

    def _at_positives(self, chunk: int, batch: Sequence[Engagement], pos: Mapping[str, int],
                      views: list, sampler: ViewSampler, cutoff: int, rng) -> tuple[list, list[int]]:
        """Each positive's source as a worker's view holds it at that moment: the chunk-start
        view plus the source's own engagements of this chunk before the positive (up to
        `chunk_prefix`, the latest). A session, or a user rating films in one sitting, is
        otherwise trained as if it had no history at all. Positives with the same prefix share
        one view. -> (the views added after `views`, each row's source view index)."""
        by_src = self._by_src[chunk]
        want: dict[tuple[str, tuple[int, ...]], int] = {}
        rows = []
        for e in batch:
            ts, ids = by_src.get(e.src, ((), ()))
            j = bisect.bisect_left(ts, e.ts)                  # its events strictly before e
            earlier = ids[max(0, j - self.chunk_prefix):j]
            if not earlier:
                rows.append(pos[e.src])
                continue
            key = (e.src, tuple(earlier))
            if key not in want:
                want[key] = len(views) + len(want)
            rows.append(want[key])
        if not want:
            return [], rows
        need = sorted({self.events[i].dst for _, ids in want for i in ids} - set(pos))
        extra = dict(zip(need, sampler.sample(need, cutoff, rng=rng))) if need else {}
        specs = self.schema.all_actions
        added = []
        for src, ids in want:
            evs = [self.events[i] for i in ids]
            t0 = max(e.ts for e in evs) + 1                    # the prefix's own moment
            own = [extra[e.dst] if e.dst in extra else views[pos[e.dst]] for e in evs]
            ages = np.array([(t0 - e.ts) / 1000.0 for e in evs], np.float32)
            weights = np.array([value_at(e.w * specs[e.action].sign, e.ts, t0, specs[e.action].decay_rate)
                                for e in evs], np.float32)
            added.append(with_prefix(views[pos[src]], [e.dst for e in evs],
                                     np.array([v.types[0] for v in own]),
                                     np.stack([v.stats[0] for v in own]),
                                     np.array([self.a_index[e.action] for e in evs]), weights, ages))
        return added, rows

    def _apply(self, k: int) -> None:
        idx = self.plan[k][0]
        self.writer.apply_batch([(self.events[i], BOTH_SIDES) for i in idx])
        self.writer.commit()
        touched = sorted({n for i in idx for n in (self.events[i].src, self.events[i].dst)})
        for pair in self._samplers:
            for s in pair:
                s.invalidate(touched)
        for n in touched:
            if n not in self.seen:
                self.seen.add(n)
                self.by_type.setdefault(node_type(n), []).append(n)
                if node_type(n) in self.item_types:
                    self.items.append(n)

    def _jobs(self) -> Iterator[tuple[int, int, int, np.ndarray] | ChunkDone]:
        """(step, chunk, cutoff, indices) per step in order, a ChunkDone after each chunk's
        steps; applying chunk k happens between its last job and its ChunkDone."""
        step = self.steps_before(self.start_chunk)
        for k in range(self.start_chunk, len(self.plan)):
            if k > 0 and self.by_type:
                cutoff = self.events[self.plan[k][0][0]].ts - 1
                for idx in self.plan[k][1:]:
                    yield step, k, cutoff, idx
                    step += 1
            yield ChunkDone(k)

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Prepared | ChunkDone]:
        for k in range(self.start_chunk):            # resume: rebuild the state, no steps
            self._apply(k)
        if self.workers <= 0:                         # inline: the peer the bench compares with
            for job in self._jobs():
                if isinstance(job, ChunkDone):
                    self._apply(job.chunk)
                    yield job
                else:
                    yield self._prepare(*job)
            return
        yield from in_threads(self._jobs(), self._prepare, self._apply, self.workers, self.prefetch)

    def close(self) -> None:
        self.store.close()


def in_threads(jobs: Iterator[tuple | ChunkDone], prepare: Callable[..., Prepared],
               apply: Callable[[int], None], workers: int, prefetch: int
               ) -> Iterator[Prepared | ChunkDone]:
    """`jobs` in order, each step's `prepare` run in a pool of `workers` threads at most
    `prefetch` items ahead of the consumer; at a `ChunkDone` the chunk's steps are finished
    first, then `apply` writes the chunk (a step never sees its own chunk). A producer's
    error is raised in the consumer's thread."""
    q: queue.Queue = queue.Queue(maxsize=prefetch)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce(pool: ThreadPoolExecutor) -> None:
        try:
            pending: list[Future] = []
            for job in jobs:
                if isinstance(job, ChunkDone):
                    for f in pending:                # the chunk is sampled: now write it
                        f.exception()
                    pending = []
                    apply(job.chunk)
                    if not put(job):
                        return
                else:
                    f = pool.submit(prepare, *job)
                    pending.append(f)
                    if not put(f):
                        return
            put(None)
        except BaseException as exc:                  # surfaces in the model thread
            put(exc)

    with ThreadPoolExecutor(workers, thread_name_prefix="hirflow-sample") as pool:
        producer = threading.Thread(target=produce, args=(pool,), name="hirflow-batches", daemon=True)
        producer.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item.result() if isinstance(item, Future) else item
        finally:
            stop.set()
            producer.join()
