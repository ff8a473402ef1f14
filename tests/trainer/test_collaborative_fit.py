"""The block's weight chosen on successive holdout windows: each window scored as the
trainer reaches it, the users of all windows choosing together, the last window's lambda
kept, and a resumed run making the same choice."""
import json

import numpy as np
import pytest
import torch

from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.trainer.holdout import Holdout, choose_parts
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.trainer.collaborative_fit import CollaborativeFit

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def world():
    w = SynthWorld(SynthConfig(events=3000, users=80, advertisers=4, span_days=6, seed=4))
    schema = SchemaConfig()
    torch.manual_seed(0)
    student = HierarchicalEncoder(EncoderConfig.for_schema(schema, levels=(4, 16), d_model=32,
                                                           d_ff=64, d_emb=32)).eval()
    return [e for e in w.stream() if isinstance(e, Engagement)], schema, student


def fitter(world, **kw):
    events, schema, _ = world
    kw.setdefault("holdout", 0.2)
    return CollaborativeFit(events, schema, CollaborativeConfig(rank=16, **kw))


def test_the_weight_is_chosen_on_every_window_s_users_together(world):
    _, _, student = world
    fit = fitter(world, weight_windows=2)
    first, last = fit.starts
    assert first < last and fit.start == last
    assert not fit.due(first - 2) and fit.due(first - 1)
    fit.choose(student, first - 1, None, CPU)
    # the first window is judged up to the second's start; nothing is chosen yet
    assert fit.choice is None and not fit.due(first) and fit.due(last - 1)
    fit.choose(student, last - 1, None, CPU)
    choice = fit.choice
    assert not fit.due(last + 10**9)
    assert [w["at"] for w in choice["windows"]] == [first, last]
    users = [w["users"] for w in choice["windows"]]
    assert all(users) and choice["holdout_users"] == users[-1]
    # the pooled Recall@20 is the users-weighted mean of the windows' own figures
    for k, pooled in choice["weight_recall@20"].items():
        own = [w["weight_recall@20"][k] for w in choice["windows"]]
        assert pooled == pytest.approx(np.average(own, weights=users), abs=1e-4)
    # the served weight is what the part rule makes of the pooled users
    pooled = {k: np.concatenate([np.asarray(w["per_user_recall@20"][k]) for w in fit.windows])
              for k in fit.windows[-1]["per_user_recall@20"]}
    popularity = pooled.pop("popularity")
    weight, _, why = choose_parts({float(k): v for k, v in pooled.items()}, popularity)
    assert choice["weight"] == weight and choice["why"] == why
    # lambda, the fit and the users' weights are the last window's own
    last_alone = Holdout.at_time(fit.data, last)
    assert choice["l2"] == last_alone.choose_fit(fit.cfg.l2_grid, fit.cfg.fits(fit.window_days))[0]


def test_a_window_s_truth_ends_where_the_next_window_starts(world):
    fit = fitter(world, weight_windows=2)
    first, last = fit.starts
    h = Holdout.at_time(fit.data, first, last)
    whole = Holdout.at_time(fit.data, first)
    after = fit.data.matrix(before=last, since=first)
    assert 0 < len(h.judged) <= len(whole.judged)
    assert all(after[u, t].min() > 0 for u, t in zip(h.judged, h.truth))


def test_a_resumed_run_makes_the_same_choice(world):
    """The snapshot taken between the windows (JSON, as resume snapshots keep it) carries the
    first window's figures to the run that continues."""
    _, _, student = world
    whole = fitter(world, weight_windows=2)
    for s in whole.starts:
        whole.choose(student, s - 1, None, CPU)
    part = fitter(world, weight_windows=2)
    part.choose(student, part.starts[0] - 1, None, CPU)
    snap = json.loads(json.dumps(part.snapshot()))
    again = fitter(world, weight_windows=2)
    again.restore(snap)
    assert not again.due(again.starts[0] - 1) and again.due(again.starts[1] - 1)
    again.choose(student, again.starts[1] - 1, None, CPU)
    assert again.choice == whole.choice


def test_a_chunk_that_passes_both_starts_opens_one_window(world):
    """Coarse chunks: the first step already past the last start scores one window, from
    its cutoff, and chooses from it alone."""
    _, _, student = world
    fit = fitter(world, weight_windows=2)
    fit.choose(student, fit.starts[1], None, CPU)
    assert fit.choice["usable"] and [w["at"] for w in fit.choice["windows"]] == [fit.starts[1] + 1]


def test_a_fixed_weight_needs_the_last_window_only(world):
    _, _, student = world
    fit = fitter(world, weight_windows=3, weight=1.5)
    assert fit.starts == [fit.data.quantile_time(0.8)]
    fit.choose(student, fit.starts[0] - 1, None, CPU)
    assert fit.choice["weight"] == 1.5 and fit.choice["weight_recall@20"] == {}


def test_the_config_refuses_windows_that_leave_the_training_window():
    with pytest.raises(ValueError, match="weight_windows"):
        CollaborativeConfig(holdout=0.25, weight_windows=4)
    with pytest.raises(ValueError, match="weight_windows"):
        CollaborativeConfig(weight_windows=0)


def test_windows_are_added_until_enough_users_with_a_history_are_judged(world):
    few = fitter(world, holdout=0.1, min_holdout_users=1)
    many = fitter(world, holdout=0.1, min_holdout_users=10**6, max_holdout_share=0.45)
    assert len(few.starts) == 1
    assert len(many.starts) == 4                       # 4 x 0.1 <= 0.45 < 5 x 0.1
    assert many.starts[-1] == few.starts[-1]           # the last window is the same
