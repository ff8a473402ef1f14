"""Shared fixtures: one embedded tansu broker per test session, fresh topics per test."""
from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

from hirflow.state.config import build
from hirflow.streams.config import HirflowConfig

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker():
    from hirflow.streams.broker import EmbeddedBroker
    b = EmbeddedBroker().start()
    yield b
    b.stop()


def make_config(tmp_path, bootstrap="127.0.0.1:9", partitions=4, **sections) -> HirflowConfig:
    data = {"kafka": {"bootstrap": bootstrap, "partitions": partitions,
                      "topic_prefix": f"t{os.getpid()}x{next(_counter)}."},
            # exactly-once tests compare with a direct apply: an adjacency bound that evicts
            # would make the result depend on interleaving across partitions (see README)
            "graph": {"path": str(tmp_path / "state"), "top_k": 4096}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return build(HirflowConfig, data)


@pytest.fixture(autouse=True)
def _torch_threads():
    """A refresh loop sets torch's process-wide CPU threads: later tests get theirs back."""
    import torch
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def cfg(tmp_path, broker):
    """A config on the session broker with its own topic prefix and state dir; topics created."""
    from hirflow.streams.topics import Topics, ensure_topics
    c = make_config(tmp_path, broker.bootstrap)
    ensure_topics(c.kafka, Topics(c.kafka.topic_prefix))
    return c


def replace_section(cfg: HirflowConfig, section: str, **changes) -> HirflowConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})


@pytest.fixture(scope="session")
def tiny_world():
    """A small synthetic world's engagements (1,500 events, 60 users, 4 days)."""
    from hirflow.state.events import Engagement
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld
    w = SynthWorld(SynthConfig(events=1500, users=60, advertisers=4, span_days=4, seed=2))
    return [e for e in w.stream() if isinstance(e, Engagement)]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_world):
    """Two small trained checkpoints of the same world (both with training seed 1, the
    versions 0 and 1 differ in shape): a model and its successor for hot-swap tests. About 5 s each on this CPU. The first fits its primitives
    to the plain embeddings: this barely trained model's nodes of one type lie almost on
    their type's mean (norm 0.98-1.0), so centred assignments would be noise; and it has the
    shape of a model saved before the score coordinate and the recent-edges stat (served
    with today's views, it reads their first 6 stats), whose few steps spread ads over
    several fine primitives and whose users' tokens follow their direction alone, which the
    refresh tests move; and no collaborative block. The successor has today's defaults
    (centred primitives, score coordinate, 7 stats, a collaborative block), so serving runs
    with both."""
    from hirflow.trainer.block_config import CollaborativeConfig
    from hirflow.encoder.model import EncoderConfig
    from hirflow.encoder.quantizer_config import QuantizerConfig
    from hirflow.state.schema import SchemaConfig
    from hirflow.trainer.train import TrainConfig, train
    root = tmp_path_factory.mktemp("ckpts")
    schema = SchemaConfig()
    out = []
    for seed in (0, 1):
        enc = EncoderConfig.for_schema(schema, levels=(4, 16), d_model=32, d_ff=64, d_emb=32,
                                       score_bias=seed == 1, n_stats=7 if seed == 1 else 6)
        # the DistMult objective at full distillation weight: after a few steps it already
        # spreads ads over several fine primitives, which the refresh tests move users between
        # (how evenly depends on the seed; with seed 1 over four, 5 to 18 ads each)
        cfg = TrainConfig(seed=1, batch_edges=32, steps_per_chunk=2, objective="bce",
                          w_distill=1.0, w_hierarchy=0.1, teacher_anchors=None,
                          quantizer=QuantizerConfig(m=4, nbits=4), centre_types=seed == 1,
                          collaborative=CollaborativeConfig(rank=0 if seed == 0 else 128))
        out.append(train(tiny_world, schema, enc, cfg, root, progress=False))
    return out
