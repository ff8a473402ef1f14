"""The value of freshness event by event: every next-click query of a window
(`bench.protocols.next_click`) is scored with the node's served vector as it stood `s` before the
query, for s from 0 (refreshed after every engagement before the query) to "never"
(the vector as of the checkpoint's training cutoff).

A worker re-encodes a node when it engages (`streams.refresh.loop`), so the vector served at a
query's time t with staleness s is the one computed at the node's last engagement at or
before t - s: here
the served vector (`trainer.embedding.served_embeddings`: the worker's view sampler,
encoder and collaborative block, one checkpoint throughout) of the node as of that
engagement's time, from a graph store holding every event (views honour their cutoff, so
later state is invisible). Before the node's first engagement in the window it is served as
of the window's start. Items are served as of the window's start (a catalogue is re-embedded
daily, not per click). Scores are inner products over the candidates, repeats allowed.

-> per staleness, the queries' ranks of their targets (`next_click.summary` turns them into
HitRate@K and MRR@K with intervals over nodes).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Mapping, Sequence

import numpy as np

from hirflow.encoder.collaborative import CollaborativeBlock
from hirflow.encoder.model import HierarchicalEncoder
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig
from hirflow.trainer.embedding import served_embeddings, state_of
from bench.protocols.next_click import NextClickTask, ranks

SECOND = 1000
HOUR = 3600 * SECOND
STALENESS = {"0": 0, "10s": 10 * SECOND, "1min": 60 * SECOND, "10min": 600 * SECOND,
             "1h": HOUR, "1d": 24 * HOUR}
NEVER = "never"


def served_as_of(task: NextClickTask, refreshes: Mapping[str, np.ndarray], train_cutoff: int,
                 staleness: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Per staleness (and "never"), the time each query's node vector was computed at: its
    last refresh at or before t - 1 - s inside the window, else the window's start (`lo` - 1);
    "never": the training cutoff less 1. `refreshes`: each node's engagement times in the
    window, sorted."""
    out = {}
    for name, s in staleness.items():
        at = np.empty(len(task), np.int64)
        for q in range(len(task)):
            times = refreshes.get(task.history.nodes[task.node[q]], np.zeros(0, np.int64))
            j = np.searchsorted(times, task.t[q] - 1 - s, side="right")
            at[q] = times[j - 1] if j else task.lo - 1
        out[name] = at
    out[NEVER] = np.full(len(task), train_cutoff - 1, np.int64)
    return out


def refresh_times(events: Sequence[Engagement], nodes: Sequence[str], lo: int, hi: int) -> dict[str, np.ndarray]:
    """Each of `nodes`' engagement times in [lo, hi) (any action: every one refreshes it)."""
    wanted = set(nodes)
    out: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if lo <= e.ts < hi and e.src in wanted:
            out[e.src].append(e.ts)
    return {n: np.unique(np.array(t, np.int64)) for n, t in out.items()}


def session_freshness(model: HierarchicalEncoder, block: CollaborativeBlock | None,
                      events: Sequence[Engagement], schema: SchemaConfig, task: NextClickTask,
                      train_cutoff: int, staleness: Mapping[str, int] = STALENESS,
                      texts=None, progress: Callable[[int, int], None] | None = None
                      ) -> dict[str, np.ndarray]:
    """Per staleness (and "never"), each query's rank of its target (see the module)."""
    events = sorted((e for e in events if e.ts < task.hi), key=lambda e: e.ts)
    refreshes = refresh_times(events, task.history.nodes, task.lo, task.hi)
    at = served_as_of(task, refreshes, train_cutoff, staleness)
    wanted: dict[int, set[str]] = defaultdict(set)           # cutoff -> nodes served as of it
    for name, times in at.items():
        for q, c in enumerate(times):
            wanted[int(c)].add(task.history.nodes[task.node[q]])
    codes = schema.action_codes()
    with state_of(events, schema) as sampler:
        items = served_embeddings(model, block, sampler, task.items, task.lo - 1, texts, codes)
        vec: dict[tuple[str, int], np.ndarray] = {}
        for i, (cutoff, nodes) in enumerate(sorted(wanted.items())):
            nodes = sorted(nodes)
            for n, v in zip(nodes, served_embeddings(model, block, sampler, nodes, cutoff, texts, codes)):
                vec[(n, cutoff)] = v
            if progress is not None and (i % 500 == 0 or i == len(wanted) - 1):
                progress(i + 1, len(wanted))
    out = {}
    for name, times in at.items():
        out[name] = np.array([ranks(items @ vec[(task.history.nodes[task.node[q]], int(c))],
                                    int(task.target[q]), task.popularity)
                              for q, c in enumerate(times)], np.int64)
    return out
