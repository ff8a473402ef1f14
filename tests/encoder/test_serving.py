"""Serving encodes views packed where they were sampled exactly as views it packs itself,
and packs again what was packed for another model's config (a batch from before a swap)."""
import dataclasses

import numpy as np

from hirflow.encoder.batching import PackConfig
from hirflow.encoder.serving import ServingModel
from hirflow.state.edge_columns import EdgeColumns
from testkit.random_views import random_views


def test_prepared_arrays_give_the_same_encoding_and_a_foreign_config_is_repacked(tiny_checkpoints):
    model = ServingModel.from_checkpoint(tiny_checkpoints[1])
    views = random_views(2, 9, lo=3, hi=16)
    edges = EdgeColumns.from_states([v.anchor for v in views], {}, {})
    emb, assign, tokens = model.encode(views, {}, None, edges)
    cfg, arrays = model.packer(views, {})
    assert cfg == model.encoder.cfg.pack
    got = model.encode(views, {}, (cfg, arrays), edges)
    for a, b in zip(got, (emb, assign, tokens)):
        np.testing.assert_array_equal(a, b)
    other = dataclasses.replace(PackConfig(), rwse_steps=cfg.rwse_steps + 1)
    broken = {k: v for k, v in arrays.items() if k != "rwse"}     # would fail if it were used
    for a, b in zip(model.encode(views, {}, (other, broken), edges), (emb, assign, tokens)):
        np.testing.assert_array_equal(a, b)
    assert ServingModel.cold_start(["user", "ad"]).packer is None


def test_a_collapsed_checkpoint_says_so_when_served(tiny_checkpoints, tmp_path, caplog):
    """The manifest's collapse mark reaches the serving model (and its metric), with a
    warning: its encoder part only breaks the block's ties."""
    from hirflow.encoder import checkpoint as ckpt
    from hirflow.encoder.serving import ServingModel
    path = tiny_checkpoints[1]
    ck = ckpt.load(path)
    assert ServingModel.from_checkpoint(path).collapsed == ck.manifest["collapse"]["collapsed"]
    manifest = {k: v for k, v in ck.manifest.items() if k not in ("id", "files", "format")}
    manifest["collapse"] = dict(manifest["collapse"], collapsed=True, mean_cosine=0.99)
    again = ckpt.save(tmp_path, dict(ck.weights), manifest, ck.codebooks, ck.documents)
    with caplog.at_level("WARNING"):
        assert ServingModel.from_checkpoint(again).collapsed
    assert "collapsed in training" in caplog.text
