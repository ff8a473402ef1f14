"""The [train], [encoder] and [quantizer] sections: the same precedence and key checks as the
worker's sections, the CLI flags on top, and the trainer's own defaults where both exist."""
import dataclasses

import pytest
from click.testing import CliRunner

from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.encoder.model import EncoderConfig
from hirflow.encoder.quantize import QuantizerConfig
from hirflow.state.config import ConfigError
from hirflow.streams.cli import cli
from hirflow.streams.config import EncoderSection, QuantizerSection, TrainSection, load
from hirflow.streams.train_options import TRAIN_FIELDS, run_options
from hirflow.trainer.runs import RunOptions
from hirflow.trainer.train import TrainConfig


def test_section_defaults_are_the_trainers_defaults():
    train, section = TrainConfig(), TrainSection()
    for key, name in TRAIN_FIELDS.items():
        assert getattr(section, key) == getattr(train, name), key
    assert section.train_share == RunOptions().train_share and section.knowledge == RunOptions().knowledge
    assert section.fit_validation == RunOptions().fit_validation
    enc = EncoderConfig()
    for f in dataclasses.fields(EncoderSection):
        assert getattr(EncoderSection(), f.name) == getattr(enc, f.name), f.name
    for f in dataclasses.fields(QuantizerSection):
        assert getattr(QuantizerSection(), f.name) == getattr(QuantizerConfig(), f.name), f.name


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[train]\npasses = 3\nseed = 5\nwindow = "14d"\n'
                 '[encoder]\nd_model = 128\nlevels = [4, 16]\n[quantizer]\nm = 4\n')
    cfg = load(file=f, env={"HIRFLOW_TRAIN__SEED": "6", "HIRFLOW_TRAIN__COLLABORATIVE_RECENCY_DAYS": "45",
                            "HIRFLOW_TRAIN__COLLABORATIVE_FIT_DAYS": "30",
                            "HIRFLOW_TRAIN__COLLABORATIVE_RANK": "64",
                            "HIRFLOW_TRAIN__COLLABORATIVE_WEIGHT_WINDOWS": "3",
                            "HIRFLOW_TRAIN__COLLABORATIVE_NEXT_WEIGHT": "0.5"},
               overrides={"train.objective": "bce"})
    opts = run_options(cfg)
    assert (opts.train.passes, opts.train.seed, opts.train.objective) == (3, 6, "bce")
    assert opts.train.collaborative.recency_days == 45.0 and opts.train.collaborative.weight is None
    assert opts.train.collaborative.fit_days == 30.0
    assert opts.train.collaborative.rank == 64 and opts.train.collaborative.ranks() == (64,)
    assert run_options(load(env={})).train.collaborative.ranks() == CollaborativeConfig().rank_grid
    assert opts.train.collaborative.weight_windows == 3
    assert opts.train.collaborative.next_weight == 0.5
    assert opts.train.collaborative.next_periods == CollaborativeConfig().next_periods == 2
    assert opts.window_s == 14 * 86400 and opts.train.quantizer.m == 4
    assert opts.encoder["d_model"] == 128 and tuple(opts.encoder["levels"]) == (4, 16)


@pytest.mark.parametrize("data, key", [({"train": {"pases": 2}}, "train.pases"),
                                       ({"encoder": {"d_model": 66}}, "n_heads"),
                                       ({"train": {"objective": "mse"}}, "objective"),
                                       ({"quantizer": {"m": 0}}, "quantizer.m"),
                                       ({"train": {"collaborative_recency_days": -1}},
                                        "collaborative_recency_days"),
                                       ({"train": {"collaborative_fit_days": -1}},
                                        "collaborative_fit_days"),
                                       ({"train": {"collaborative_rank": -1}},
                                        "collaborative_rank"),
                                       ({"train": {"collaborative_weight_windows": 0}},
                                        "collaborative_weight_windows"),
                                       ({"train": {"collaborative_next_periods": -1}},
                                        "collaborative_next_periods")])
def test_a_bad_key_or_value_is_an_error_that_names_it(tmp_path, data, key):
    import json
    f = tmp_path / "c.json"
    f.write_text(json.dumps(data))
    with pytest.raises((ConfigError, ValueError), match=key):
        load(file=f, env={})


def test_train_flags_override_the_file(tmp_path):
    """A bad value in the file is a usage error naming the key; the flag for that key
    replaces it (the run then gets as far as reading its input)."""
    f = tmp_path / "c.toml"
    f.write_text("[train]\npasses = 0\n")
    events = tmp_path / "none.jsonl"
    events.write_text("")
    r = CliRunner().invoke(cli, ["--config", str(f), "train", "--input", str(events)])
    assert r.exit_code == 2 and "train.passes" in r.output
    r = CliRunner().invoke(cli, ["--config", str(f), "train", "--passes", "2", "--no-knowledge",
                                 "--out", str(tmp_path / "ck"), "--input", str(events)])
    assert r.exit_code == 1 and "passes" not in r.output and "no engagement events" in r.output
