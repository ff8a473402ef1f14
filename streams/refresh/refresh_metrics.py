"""The refresh loop's Prometheus figures: what a batch sampled and refreshed, and what serves."""
from __future__ import annotations

from hirflow.state.view_source import Sampled
from hirflow.streams.metrics import (INDEX_GENERATION, INDEX_NODES, MODEL_COLLAPSED, MODEL_INFO,
                                     NODES_REFRESHED, PEER_READS, REFRESH_BATCH, REFRESH_SECONDS,
                                     SWAP_PROGRESS, VIEW_SAMPLE_SECONDS)
from hirflow.streams.refresh.serving_snapshot import ServingSnapshot


def count_sampled(sampled: Sampled) -> None:
    """A batch's sampling time and its reads of other workers' nodes."""
    VIEW_SAMPLE_SECONDS.observe(sampled.seconds)
    if sampled.peer_reads or sampled.peer_failures:
        PEER_READS.labels("read").inc(sampled.peer_reads)
        PEER_READS.labels("missing").inc(sampled.peer_failures)


def count_refreshed(dirty: int, nodes: int, seconds: float) -> None:
    """A refreshed batch of `nodes`, `dirty` of them claimed dirty, the rest neighbours."""
    NODES_REFRESHED.labels("dirty").inc(dirty)
    NODES_REFRESHED.labels("neighbor").inc(nodes - dirty)
    REFRESH_BATCH.observe(nodes)
    REFRESH_SECONDS.observe(seconds)


def serving_gauges(serving: ServingSnapshot, swapping: bool) -> None:
    """What serves: index size, generation, model and whether it collapsed; a swap's
    progress reads complete when none is building."""
    INDEX_NODES.set(len(serving.memory))
    INDEX_GENERATION.set(serving.gen)
    MODEL_INFO.labels(serving.model.id).set(1)
    MODEL_COLLAPSED.labels(serving.model.id).set(int(serving.model.collapsed))
    if not swapping:
        SWAP_PROGRESS.set(1.0)
