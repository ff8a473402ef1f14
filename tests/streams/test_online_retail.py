"""The Online Retail adapter on a real slice: events, entities, rejected rows by reason."""
import csv
import io
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hirflow.state.events import Engagement, Entity, Validator, as_dict
from hirflow.streams import config as config_mod
from hirflow.streams.tools.adapters import online_retail as orr
from hirflow.streams.tools.replay import ReplayError, detect_format, read_events

DATA = Path(__file__).parents[1] / "data" / "online_retail_sample.csv"
CONFIG = Path(__file__).parents[2] / "configs" / "online_retail.toml"


def schema():
    return config_mod.load(CONFIG, env={}).schema


def test_the_sample_maps_to_purchases_cancels_countries_and_texts():
    rejects = orr.Rejects()
    evs = list(read_events(DATA, detect_format(DATA), Validator(schema(), now_ms=lambda: 2 ** 62), rejects))
    eng = [e for e in evs if isinstance(e, Engagement)]
    ents = [e for e in evs if isinstance(e, Entity)]
    assert detect_format(DATA) == "online-retail"
    first = eng[1]                      # after the customer's country edge
    assert (eng[0].src, eng[0].dst, eng[0].action) == ("user:17850", "country:United_Kingdom", "lives_in")
    assert (first.src, first.dst, first.action) == ("user:17850", "product:85123A", "purchase")
    assert first.w == pytest.approx(orr.quantity_weight(6))
    assert first.ts == 1291191960000                                   # 2010-12-01 08:26 GMT
    assert {e.action for e in eng} == {"purchase", "cancel", "lives_in"}
    assert ents[0].node == "product:85123A" and ents[0].text == "WHITE HANGING HEART T-LIGHT HOLDER"
    assert len({e.node for e in ents}) == len({e.dst for e in eng if e.dst.startswith("product:")})
    assert set(rejects.counts) == {"no_customer", "not_a_product", "zero_quantity_or_price"}
    assert all(not e.dst.startswith("product:POST") for e in eng)


def test_british_summer_time_is_honoured():
    rows = [",".join(orr.HEADER), "1,22222,THING,1,2011-07-01 10:00:00,1.0,1.0,France"]
    ev = [e for e in orr.read(rows) if isinstance(e, Engagement) and e.action == "purchase"][0]
    assert ev.ts == 1309510800000                                       # 09:00 UTC


def test_a_file_without_the_header_is_refused():
    with pytest.raises(orr.OnlineRetailFormatError):
        list(orr.read(["1,22222,THING,1,2011-07-01 10:00:00,1.0,1.0,France"]))


@given(st.lists(st.lists(st.text(max_size=12), min_size=1, max_size=10), max_size=20))
def test_no_row_can_break_the_reader(rows):
    """Every row becomes one valid purchase or cancellation or is counted as rejected; none
    raises, and what comes out passes the worker's validation."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(orr.HEADER)
    w.writerows(rows)
    buf.seek(0)
    rejects = orr.Rejects()
    v = Validator(schema(), now_ms=lambda: 2 ** 62)
    lines = 0
    for ev in orr.read(buf, rejects):
        if isinstance(ev, Engagement) and ev.action != "lives_in":
            lines += 1
        (v.entity if isinstance(ev, Entity) else v.engagement)(as_dict(ev))
    assert lines + rejects.total == len(rows)


def test_replay_names_the_format_error(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text(",".join(orr.HEADER) + "\n")
    assert list(read_events(bad, "online-retail", Validator(schema()))) == []
    with pytest.raises(ReplayError):
        bad.write_text("nonsense\n")
        list(read_events(bad, "online-retail", Validator(schema())))
