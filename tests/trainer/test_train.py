"""The loop end to end on a small synthetic world: checkpoint, metrics log, determinism."""
import hashlib
import json

import numpy as np
import pytest

from hirflow.encoder.checkpoint import load
from hirflow.trainer.holdout import weights_tried
from hirflow.encoder.model import EncoderConfig
from hirflow.state.events import Engagement
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.trainer.train import NonFiniteLoss, TrainConfig, train
from testkit.tiny_training import small


def events():
    w = SynthWorld(SynthConfig(events=1500, users=60, advertisers=4, span_days=4, seed=2))
    return [e for e in w.stream() if isinstance(e, Engagement)]


def test_training_writes_a_verified_checkpoint_and_a_metrics_log(tmp_path):
    schema, enc, cfg = small(tmp_path)
    path = train(events(), schema, enc, cfg, tmp_path / "ckpt", progress=False)
    ck = load(path)
    rank = ck.manifest["collaborative"]["rank"]
    # served = the encoder's 32 coordinates + the collaborative block, which the tokens cover
    assert ck.manifest["steps"] > 0 and rank > 0 and ck.codebooks.shape == (2, 16, 32 + rank)
    assert len(ck.documents["collaborative.json"]["items"]) == ck.weights["collab.key"].shape[0]
    # lambda with the fit's tau, the recency tau and the weight chosen on the window's last
    # chunk, before training on it
    chosen = ck.manifest["collaborative"]["holdout"]
    assert chosen["usable"] and chosen["at"] > ck.manifest["data_window"][0]
    assert chosen["weight"] in weights_tried(cfg.collaborative.weight_grid) and chosen["why"]
    assert chosen["l2"] in cfg.collaborative.l2_grid
    # users' items weighted by the mean of their weights at multiples of the holdout window
    c = cfg.collaborative
    assert len(chosen["recency_days"]) == len(c.recency_windows) and chosen["recency_days"][0] == 0
    assert ck.manifest["collaborative"]["weight"] == chosen["weight"]
    assert ck.manifest["collaborative"]["recency_days"] == chosen["recency_days"]
    # EASE^R fitted at every such scale and the fits summed, or binary; lambda chosen with it
    if chosen["fit_days"]:
        ratios = np.array(chosen["fit_days"]) / chosen["fit_days"][0]
        np.testing.assert_allclose(ratios, np.array(c.fit_windows) / c.fit_windows[0], rtol=1e-2)
    assert len(chosen["l2_recall@20"]) == 2 * len(c.l2_grid)
    assert ck.manifest["collaborative"]["fit_days"] == chosen["fit_days"]
    # the block's width from the rank grid (at most items - 1), the served block that wide
    assert chosen["rank"] in c.rank_grid and ck.manifest["collaborative"]["rank"] <= chosen["rank"]
    # the next-period regression's weight chosen from its grid by the block alone
    assert chosen["next_weight"] in c.next_grid
    assert set(chosen["next_recall@20"]) == {f"{w:g}" for w in c.next_grid}
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    rows = [r for r in lines if "chunk_health" not in r]
    assert len(rows) == ck.manifest["steps"]
    # collapse health per chunk in the log and the manifest, and for the final embeddings
    health = [r["chunk_health"] for r in lines if "chunk_health" in r]
    collapse = ck.manifest["collapse"]
    assert health and collapse["per_chunk"]["chunk"] == [h["chunk"] for h in health]
    assert collapse["no_negative"] == 0.0 and collapse["items"] > 0
    assert collapse["collapsed"] == (collapse["mean_cosine"] > cfg.collapse_cosine)
    assert all(set(r) >= {"loss", "distill", "engage", "hierarchy", "lr"} for r in rows)
    assert [r["cutoff"] for r in rows] == sorted(r["cutoff"] for r in rows)  # time-ordered
    assert [r["chunk"] for r in rows] == sorted(r["chunk"] for r in rows)
    # the learning rate peaks at lr and ends at lr_end of it (the last days still learned)
    assert max(r["lr"] for r in rows) == pytest.approx(cfg.lr)
    assert rows[-1]["lr"] == pytest.approx(cfg.lr * cfg.lr_end)


def digest(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_same_data_config_and_seed_give_a_byte_identical_checkpoint_for_any_sampling_workers(tmp_path):
    """Inline sampling, one and two workers sampling ahead: the same bytes (every batch's
    randomness is seeded by its step, not by which thread sampled it)."""
    digests = []
    for run, workers in (("a", 1), ("b", 1), ("c", 0), ("d", 2)):
        (tmp_path / run).mkdir()
        schema, enc, cfg = small(tmp_path / run, sample_workers=workers)
        stats = {}
        path = train(events(), schema, enc, cfg, tmp_path / run / "ckpt", progress=False, stats=stats)
        assert stats["steps"] > 0 and stats["anchors"] > 0 and stats["wait_s"] >= 0
        digests.append(digest(path))
    assert digests[0] == digests[1] == digests[2] == digests[3]


def interrupt_on_third_chunk(monkeypatch, schema, enc, cfg, out):
    """Run training into `out` and kill it (an exception in the state write) at chunk 3."""
    from hirflow.state.writer import GraphWriter
    real, calls = GraphWriter.apply_batch, []

    def crash(self, batch):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(self, batch)

    monkeypatch.setattr(GraphWriter, "apply_batch", crash)
    with pytest.raises(KeyboardInterrupt):
        train(events(), schema, enc, cfg, out, progress=False)
    monkeypatch.setattr(GraphWriter, "apply_batch", real)


def test_an_interrupted_run_resumes_to_the_same_checkpoint(tmp_path, monkeypatch):
    """Killed after a few chunks, the run continues from its snapshot and writes exactly the
    bytes of an uninterrupted run."""
    schema, enc, cfg = small(tmp_path)
    whole = digest(train(events(), schema, enc, cfg, tmp_path / "whole", progress=False))
    interrupt_on_third_chunk(monkeypatch, schema, enc, cfg, tmp_path / "run")
    assert (tmp_path / "run" / "_resume" / "state.json").exists()
    stats = {}
    path = train(events(), schema, enc, cfg, tmp_path / "run", progress=False, resume=True, stats=stats)
    assert digest(path) == whole
    assert 0 < stats["steps"] < load(path).manifest["steps"]      # only the remaining steps ran
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    rows = [r["step"] for r in lines if "chunk_health" not in r]
    assert rows == list(range(load(path).manifest["steps"]))      # each step logged once
    chunks = [r["chunk_health"]["chunk"] for r in lines if "chunk_health" in r]
    assert chunks == sorted(set(chunks))                          # each chunk's health once
    assert not (tmp_path / "run" / "_resume").exists()


def test_resume_refuses_a_snapshot_of_other_data(tmp_path, monkeypatch):
    from hirflow.trainer.resume import ResumeError
    schema, enc, cfg = small(tmp_path)
    interrupt_on_third_chunk(monkeypatch, schema, enc, cfg, tmp_path / "run")
    with pytest.raises(ResumeError, match="other data"):
        train(events()[:-10], schema, enc, cfg, tmp_path / "run", progress=False, resume=True)


def test_the_holdout_is_judged_when_no_chunk_begins_inside_it(tmp_path):
    """Chunks longer than the whole stream: the holdout window still gets its chunk (cut at
    its start), so the weight is chosen, not defaulted."""
    schema, enc, cfg = small(tmp_path, chunk_hours=24 * 30)
    ck = load(train(events(), schema, enc, cfg, tmp_path / "ckpt", progress=False))
    chosen = ck.manifest["collaborative"]["holdout"]
    assert chosen["usable"] and chosen["why"] and chosen["weight_recall@20"]


def test_warm_start_continues_from_the_parent_weights(tmp_path):
    schema, enc, cfg = small(tmp_path)
    first = load(train(events(), schema, enc, cfg, tmp_path / "a", progress=False))
    again = load(train(events(), schema, enc, cfg, tmp_path / "b", progress=False, init=first,
                       parent=first.id))
    assert again.manifest["parent"] == again.manifest["init"] == first.id and again.id != first.id
    # its student saw this window's holdout: the collaborative weight is the parent's, not chosen
    assert again.manifest["collaborative"]["weight"] == first.manifest["collaborative"]["weight"]
    assert again.manifest["collaborative"]["holdout"]["weight_recall@20"] == {}
    other = EncoderConfig.for_schema(schema, levels=(4, 8), d_model=32, d_ff=64, d_emb=32)
    with pytest.raises(ValueError, match="another encoder config"):
        train(events(), schema, other, cfg, tmp_path / "c", progress=False, init=first)


def test_non_finite_loss_stops_the_run(tmp_path):
    schema, enc, cfg = small(tmp_path, lr=float("inf"))
    with pytest.raises(NonFiniteLoss):
        train(events(), schema, enc, cfg, tmp_path / "ckpt", progress=False)


def synth_world_and_flags(cfg, tmp_path) -> list[str]:
    """A small synthetic world under tmp_path/w; -> the CLI flags of the test's broker."""
    from click.testing import CliRunner

    from hirflow.streams.tools.cli import cli
    r = CliRunner().invoke(cli, ["synth", "--out", str(tmp_path / "w"), "--events", "1200",
                                 "--users", "50", "--span-days", "4"])
    assert r.exit_code == 0, r.output
    return ["--bootstrap", cfg.kafka.bootstrap, "--topic-prefix", cfg.kafka.topic_prefix,
            "--partitions", str(cfg.kafka.partitions), "--state", cfg.graph.path]


def test_cli_trains_from_a_file_and_announces_the_checkpoint(cfg, tmp_path):
    """`hirflow train --input` on synthetic files; the announcement names a loadable checkpoint."""
    import msgpack
    from click.testing import CliRunner

    from hirflow.streams.tools.cli import cli
    from hirflow.streams.topics import Topics
    from tests.streams.kafka_helpers import drain
    base = synth_world_and_flags(cfg, tmp_path)
    r = CliRunner().invoke(cli, base + ["train", "--input", str(tmp_path / "w" / "engagements.jsonl"),
                                        "--cutoff", "2026-02-01", "--out", str(tmp_path / "ck"),
                                        "--steps-per-chunk", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert load(out["checkpoint"]).id == out["announced"]
    m = drain(cfg, Topics(cfg.kafka.topic_prefix).checkpoints, 1)
    assert msgpack.unpackb(m[0].value())["id"] == out["announced"]


def test_cli_trains_every_period_and_chains_the_checkpoints(cfg, tmp_path):
    """`hirflow train --every`: each round continues the previous checkpoint and names it as
    its parent; world knowledge comes from the entity file; both are announced."""
    import msgpack
    from click.testing import CliRunner

    from hirflow.streams.tools.cli import cli
    from hirflow.streams.topics import Topics
    from tests.streams.kafka_helpers import drain
    base = synth_world_and_flags(cfg, tmp_path)
    r = CliRunner().invoke(cli, base + ["train", "--input", str(tmp_path / "w" / "engagements.jsonl"),
                                        "--entities", str(tmp_path / "w" / "entities.jsonl"),
                                        "--every", "1s", "--rounds", "2", "--levels", "4,16",
                                        "--out", str(tmp_path / "ck"), "--steps-per-chunk", "1",
                                        "--no-progress"])
    assert r.exit_code == 0, r.output
    first, second = [json.loads(x) for x in r.stdout.strip().splitlines()[-2:]]
    assert first["parent"] is None and second["parent"] == first["id"] != second["id"]
    ck = load(second["checkpoint"])
    assert ck.manifest["init"] == first["id"] and ck.manifest["config"]["levels"] == [4, 16]
    got = [msgpack.unpackb(m.value())["id"] for m in drain(cfg, Topics(cfg.kafka.topic_prefix).checkpoints, 2)]
    assert got == [first["id"], second["id"]]


def test_run_every_keeps_the_last_good_checkpoint_after_a_failed_round(tmp_path):
    from hirflow.trainer.runs import RunOptions, parse_duration, run_every
    schema, enc, cfg = small(tmp_path)
    evs = events()
    calls = []

    def load_data(cutoff):
        calls.append(cutoff)
        return ([] if len(calls) == 2 else evs), []         # the second round finds no data

    opts = RunOptions(encoder={"levels": (4, 16)}, train=cfg, knowledge=False)
    start = evs[-1].ts // 1000 + 1                          # the rounds run after the data
    clock = iter(range(start, start + 10_000, 1000)).__next__
    got = list(run_every(1, load_data, schema, opts, tmp_path / "ck", rounds=3, clock=clock,
                         sleep=lambda s: None, progress=False))
    assert len(calls) == 3 and len(got) == 2               # the empty round is skipped
    assert got[1].parent == got[0].id
    assert parse_duration("1h") == 3600 and parse_duration("90s") == 90
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_centring_types_stores_each_types_mean(tmp_path):
    """With centre_types (the default) the checkpoint holds one mean embedding per seen node
    type (its direction a mean of unit vectors: norm in (0, 1]; its score coordinate 1 for
    users); without it the centres stay zero."""
    schema, enc, cfg = small(tmp_path)
    ck = load(train(events(), schema, enc, cfg, tmp_path / "a", progress=False))
    centre = ck.weights["encoder.type_centre"]
    norms = centre[:, :-1].norm(dim=-1)
    types = list(schema.all_node_types)
    for t in ("user", "ad", "product"):
        assert 0.05 < float(norms[types.index(t)]) <= 1.0 + 1e-5
    assert float(centre[types.index("user"), -1]) == 1.0
    assert ck.manifest["metrics"]["primitives_used"][-1] > 1
    (tmp_path / "b").mkdir()
    schema, enc, cfg = small(tmp_path / "b", centre_types=False)
    plain = load(train(events(), schema, enc, cfg, tmp_path / "b" / "ck", progress=False))
    assert not plain.weights["encoder.type_centre"].any()


def test_a_small_data_set_gets_passes_up_to_min_steps_unless_its_steps_are_capped():
    from hirflow.trainer.pipeline import chunk_plan
    from hirflow.trainer.train import _plan
    evs = sorted(events(), key=lambda e: e.ts)

    def _passes(evs, cfg):
        return _plan(evs, cfg)[1]
    one = sum(len(p) - 1 for p in chunk_plan(evs, 24 * 3_600_000, 32, None, 0, 1))
    assert _passes(evs, TrainConfig(batch_edges=32, min_steps=0, passes=2)) == 2
    assert _passes(evs, TrainConfig(batch_edges=32, min_steps=one)) == 1
    assert _passes(evs, TrainConfig(batch_edges=32, min_steps=one + 1)) == 2
    assert _passes(evs, TrainConfig(batch_edges=32, min_steps=10 * one, passes=3)) == 10
    assert _passes(evs, TrainConfig(batch_edges=32, min_steps=10 * one, steps_per_chunk=2)) == 1
