"""A tiny schema, encoder and training config for tests that train (a few seconds on a CPU)."""
from __future__ import annotations

from hirflow.encoder.model import EncoderConfig
from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.state.schema import SchemaConfig
from hirflow.trainer.train import TrainConfig


def small(tmp_path, **kw):
    """A tiny schema, encoder and training config (two steps a day) for loop tests."""
    schema = SchemaConfig()
    enc = EncoderConfig.for_schema(schema, levels=(4, 16), d_model=32, d_ff=64, d_emb=32)
    kw.setdefault("snapshot_every_s", 0.0)              # a snapshot after every chunk
    kw.setdefault("chunk_hours", 24)
    cfg = TrainConfig(batch_edges=32, steps_per_chunk=2,
                      quantizer=QuantizerConfig(m=2, nbits=4), log_path=str(tmp_path / "log.jsonl"), **kw)
    return schema, enc, cfg
