"""The loop end to end on a small synthetic world: checkpoint, metrics log, determinism."""
import hashlib
import json

import pytest

from encoder.checkpoint import load
from encoder.model import EncoderConfig
from encoder.quantize import QuantizerConfig
from state.events import Engagement
from state.schema import SchemaConfig
from streams.synth import SynthConfig, SynthWorld
from trainer.train import NonFiniteLoss, TrainConfig, train


def events():
    w = SynthWorld(SynthConfig(events=1500, users=60, advertisers=4, span_days=4, seed=2))
    return [e for e in w.stream() if isinstance(e, Engagement)]


def small(tmp_path, **kw):
    schema = SchemaConfig()
    enc = EncoderConfig.for_schema(schema, levels=(4, 16), d_model=32, d_ff=64, d_emb=32)
    cfg = TrainConfig(batch_edges=32, max_steps_per_chunk=2, chunk_hours=24,
                      quantizer=QuantizerConfig(m=2, nbits=4), log_path=str(tmp_path / "log.jsonl"), **kw)
    return schema, enc, cfg


def test_training_writes_a_verified_checkpoint_and_a_metrics_log(tmp_path):
    schema, enc, cfg = small(tmp_path)
    path = train(events(), schema, enc, cfg, tmp_path / "ckpt", progress=False)
    ck = load(path)
    assert ck.manifest["steps"] > 0 and ck.codebooks.shape == (2, 16, 32)
    rows = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(rows) == ck.manifest["steps"]
    assert all(set(r) >= {"loss", "distill", "engage", "hierarchy", "lr"} for r in rows)
    assert [r["cutoff"] for r in rows] == sorted(r["cutoff"] for r in rows)  # time-ordered
    assert [r["chunk"] for r in rows] == sorted(r["chunk"] for r in rows)


def test_same_data_config_and_seed_give_a_byte_identical_checkpoint(tmp_path):
    digests = []
    for run in ("a", "b"):
        schema, enc, cfg = small(tmp_path / run)
        (tmp_path / run).mkdir()
        path = train(events(), schema, enc, cfg, tmp_path / run / "ckpt", progress=False)
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())})
    assert digests[0] == digests[1]


def test_non_finite_loss_stops_the_run(tmp_path):
    schema, enc, cfg = small(tmp_path, lr=float("inf"))
    with pytest.raises(NonFiniteLoss):
        train(events(), schema, enc, cfg, tmp_path / "ckpt", progress=False)


def test_cli_trains_from_a_file_and_announces_the_checkpoint(cfg, tmp_path):
    """`hirflow train --input` on synthetic files; the announcement names a loadable checkpoint."""
    import msgpack
    from click.testing import CliRunner

    from streams.cli import cli
    from streams.topics import Topics
    from tests.streams.kafka_helpers import drain
    r = CliRunner().invoke(cli, ["synth", "--out", str(tmp_path / "w"), "--events", "1200",
                                 "--users", "50", "--span-days", "4"])
    assert r.exit_code == 0, r.output
    base = ["--bootstrap", cfg.kafka.bootstrap, "--topic-prefix", cfg.kafka.topic_prefix,
            "--partitions", str(cfg.kafka.partitions), "--state", cfg.graph.path]
    r = CliRunner().invoke(cli, base + ["train", "--input", str(tmp_path / "w" / "engagements.jsonl"),
                                        "--cutoff", "2026-02-01", "--out", str(tmp_path / "ck"),
                                        "--steps-per-chunk", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert load(out["checkpoint"]).id == out["announced"]
    m = drain(cfg, Topics(cfg.kafka.topic_prefix).checkpoints, 1)
    assert msgpack.unpackb(m[0].value())["id"] == out["announced"]
