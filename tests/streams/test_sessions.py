"""Anonymous sessions served live: with the YOOCHOOSE config a session is a node whose
vector and tokens are refreshed after each click and published like a user's, and an idle
session leaves the store and the index with the retention rules."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from hirflow.state.events import Engagement, Validator
from hirflow.state.writer import BOTH_SIDES
from hirflow.streams import config as config_mod
from hirflow.streams.tools.replay import read_events
from tests.conftest import replace_section
from tests.streams.refresh_helpers import assert_index_matches_state, loop_over, settle

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400_000


def test_a_session_is_refreshed_after_each_click_and_expires_when_idle(cfg, tmp_path):
    from hirflow.encoder.model import EncoderConfig
    from hirflow.encoder.quantizer_config import QuantizerConfig
    from hirflow.trainer.train import TrainConfig, train
    schema = config_mod.load(ROOT / "configs" / "yoochoose.toml", env={}).schema
    clicks = list(read_events(ROOT / "tests" / "data" / "yoochoose_sample.tsv", "yoochoose",
                              Validator(schema, now_ms=lambda: 2 ** 62)))
    shift = int(time.time() * 1000) - 3 * DAY - max(e.ts for e in clicks)   # three days ago
    clicks = [Engagement(e.src, e.dst, e.action, e.ts + shift) for e in clicks]
    enc = EncoderConfig.for_schema(schema, levels=(4, 16), d_model=32, d_ff=64, d_emb=32)
    ck = train(clicks, schema, enc, TrainConfig(batch_edges=32, steps_per_chunk=2,
                                                quantizer=QuantizerConfig(m=2, nbits=4)),
               tmp_path / "ck", progress=False)
    cfg = dataclasses.replace(cfg, schema=schema)
    cfg = replace_section(cfg, "graph", expire_after_days=1.0)
    cfg = replace_section(cfg, "refresh", checkpoint=str(ck))
    store, writer, loop = loop_over(cfg, clicks)
    try:
        settle(loop, 100, 10)
        products = sorted({e.dst for e in clicks})[:3]
        session, seqs, vectors = "session:live-1", [], []
        then = int(time.time() * 1000) - 2 * DAY                # the session, two days ago
        for k, p in enumerate(products):
            writer.apply_batch([(Engagement(session, p, "click", then + k), BOTH_SIDES)])
            writer.commit()
            settle(loop, 100, 10)
            seq, _, tokens, _ = loop.index.published([session])[0]
            seqs.append(seq)
            assert tokens and session in loop.memory.live_ids()
            vectors.append(loop.memory.emb[loop.memory.row(session)].copy())
        assert seqs[0] >= 1 and seqs == sorted(seqs)              # published from its first click on
        assert not np.allclose(vectors[0], vectors[-1])           # each click moves it
        expired = []
        for _ in range(50):                                       # idle for more than a day: spent
            expired += writer.expire_slice(int(time.time() * 1000))
            if writer.retention.after is None and expired:
                break
        assert session in expired
        settle(loop, 100, 10)
        assert session not in loop.memory.live_ids()
        seq, _, tokens, _ = loop.index.published([session])[0]
        assert seq == seqs[-1] + 1 and tokens == []               # subscribers told: no tokens
        assert_index_matches_state(loop)
    finally:
        loop.close()
        store.close()
