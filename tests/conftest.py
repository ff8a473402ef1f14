"""Shared fixtures: one embedded tansu broker per test session, fresh topics per test."""
from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

from state.config import build
from streams.config import HirflowConfig

_counter = itertools.count()


@pytest.fixture(scope="session")
def broker():
    from streams.broker import EmbeddedBroker
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


@pytest.fixture
def cfg(tmp_path, broker):
    """A config on the session broker with its own topic prefix and state dir; topics created."""
    from streams.topics import Topics, ensure_topics
    c = make_config(tmp_path, broker.bootstrap)
    ensure_topics(c.kafka, Topics(c.kafka.topic_prefix))
    return c


def replace_section(cfg: HirflowConfig, section: str, **changes) -> HirflowConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})
