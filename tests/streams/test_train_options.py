"""The [train], [train.collaborative], [encoder] and [quantizer] sections: the same precedence
and key checks as the worker's sections, the CLI flags on top, and the run options the trainer
gets from them."""
import pytest
from hypothesis import given, strategies as st
from click.testing import CliRunner

from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.state.config import ConfigError
from hirflow.streams.tools.cli import cli
from hirflow.streams.config import load
from hirflow.streams.tools.train_options import run_options


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[train]\npasses = 3\nseed = 5\nwindow = "14d"\n'
                 '[encoder]\nd_model = 128\nlevels = [4, 16]\n[quantizer]\nm = 4\n')
    f.write_text(f.read_text() + '[train.collaborative]\nrank = 32\nrank_grid = [16, 32]\n')
    cfg = load(file=f, env={"HIRFLOW_TRAIN__SEED": "6", "HIRFLOW_TRAIN__COLLABORATIVE__RECENCY_DAYS": "45",
                            "HIRFLOW_TRAIN__COLLABORATIVE__FIT_DAYS": "30",
                            "HIRFLOW_TRAIN__COLLABORATIVE__RANK": "64",
                            "HIRFLOW_TRAIN__COLLABORATIVE__WEIGHT_WINDOWS": "3",
                            "HIRFLOW_TRAIN__COLLABORATIVE__NEXT_WEIGHT": "0.5"},
               overrides={"train.objective": "bce", "quantizer.beam": 2})
    opts = run_options(cfg)
    assert (opts.train.passes, opts.train.seed, opts.train.objective) == (3, 6, "bce")
    assert opts.train.collaborative.recency_days == 45.0 and opts.train.collaborative.weight is None
    assert opts.train.collaborative.fit_days == 30.0
    assert opts.train.collaborative.rank == 64 and opts.train.collaborative.ranks() == (64,)
    assert run_options(load(env={})).train.collaborative.ranks() == CollaborativeConfig().rank_grid
    assert opts.train.collaborative.weight_windows == 3
    assert opts.train.collaborative.next_weight == 0.5
    assert opts.train.collaborative.next_periods == CollaborativeConfig().next_periods == 2
    assert opts.train.collaborative.rank_grid == (16, 32)
    assert opts.train.collaborative is cfg.train.collaborative and opts.train.quantizer is cfg.quantizer
    assert opts.window_s == 14 * 86400 and opts.train.quantizer.m == 4 and opts.train.quantizer.beam == 2
    assert opts.encoder["d_model"] == 128 and tuple(opts.encoder["levels"]) == (4, 16)


@pytest.mark.parametrize("data, key", [({"train": {"pases": 2}}, "train.pases"),
                                       ({"encoder": {"d_model": 66}}, "n_heads"),
                                       ({"train": {"objective": "mse"}}, "objective"),
                                       ({"quantizer": {"m": 0}}, "quantizer.m"),
                                       ({"quantizer": {"train_size": 0}}, "train_size"),
                                       ({"train": {"collaborative_rank": 64}},
                                        "train.collaborative_rank"),
                                       ({"train": {"collaborative": {"rnak": 64}}},
                                        "train.collaborative.rnak"),
                                       ({"train": {"collaborative": {"weight_windows": 10}}},
                                        "weight_windows")])
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
    assert r.exit_code == 2 and "train: passes must be >= 1" in r.output
    r = CliRunner().invoke(cli, ["--config", str(f), "train", "--passes", "2", "--no-knowledge",
                                 "--out", str(tmp_path / "ck"), "--input", str(events)])
    assert r.exit_code == 1 and "passes" not in r.output and "no engagement events" in r.output


@given(field=st.sampled_from(["rank", "weight", "recency_days", "fit_days", "next_periods",
                              "next_weight", "propagation_layers", "propagation_weight",
                              "min_holdout_users"]),
       value=st.integers(-10**6, -1))
def test_a_negative_collaborative_setting_is_refused_by_name(field, value):
    """Every [train.collaborative] key is checked where it is defined, and the error names it."""
    with pytest.raises(ConfigError, match=rf"train\.collaborative: {field} must be"):
        load(env={f"HIRFLOW_TRAIN__COLLABORATIVE__{field.upper()}": str(value)})
