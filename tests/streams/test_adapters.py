"""The data set adapters: real rows through each, the format told from the first line, the
CLI offering every format, and a bad row named by its line."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hirflow.state.events import Validator
from hirflow.streams import config as config_mod
from hirflow.streams.tools.adapters import ciaodvd, yoochoose
from hirflow.streams.tools.cli import FILE_FORMATS
from hirflow.streams.tools.replay import FORMATS, ReplayError, detect_format, read_events

DATA = Path(__file__).resolve().parents[1] / "data"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def events(name: str, path: Path) -> list:
    schema = config_mod.load(CONFIGS / f"{name}.toml", env={}).schema
    return list(read_events(path, detect_format(path), Validator(schema, now_ms=lambda: 2 ** 62)))


def test_the_cli_offers_every_replay_format():
    assert FILE_FORMATS == list(FORMATS)


def test_ciaodvd_ratings_become_likes_dislikes_and_genres():
    path = DATA / "ciaodvd_sample.csv"
    assert detect_format(path) == "ciaodvd"
    evs = events("ciaodvd", path)
    rows = [line.split(",") for line in path.read_text().splitlines()]
    rated = [e for e in evs if e.action in ("liked", "disliked")]
    assert len(rated) == len(rows)
    assert sum(e.action == "liked" for e in rated) == sum(int(r[4]) >= 4 for r in rows)
    genres = [e for e in evs if e.action == "in_genre"]
    assert len(genres) == len({r[1] for r in rows})                 # one per movie
    assert all(e.src.startswith("movie:") and e.dst.startswith("genre:") for e in genres)
    assert all(e.ts % 86_400_000 == 0 for e in evs)                 # midnight UTC of the date


def test_yoochoose_clicks_become_session_product_clicks():
    path = DATA / "yoochoose_sample.tsv"
    assert detect_format(path) == "yoochoose"
    evs = events("yoochoose", path)
    assert len(evs) == len(path.read_text().splitlines()) - 1
    assert all(e.src.startswith("session:") and e.dst.startswith("product:") and e.action == "click"
               for e in evs)
    schema = config_mod.load(CONFIGS / "yoochoose.toml", env={}).schema
    assert schema.user_type == "session" and schema.session_users


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet="abc12,-\t ", max_size=30))
def test_a_bad_row_is_named_by_its_line(junk):
    lines = ["1,2,3,4,5,2001-02-03", junk]
    try:
        list(ciaodvd.read(lines))
    except ciaodvd.CiaoFormatError as exc:
        assert "line 2" in str(exc)
    lines = ["SessionId\tItemId\tTime", "1\t2\t3.5", junk]
    try:
        list(yoochoose.read(lines))
    except yoochoose.YoochooseFormatError as exc:
        assert "line 3" in str(exc)


def test_replay_names_the_file_of_a_bad_row(tmp_path):
    bad = tmp_path / "r.csv"
    bad.write_text("1,2,3,4,5,2001-02-03\n1,2,3,4,9,2001-02-03\n")
    with pytest.raises(ReplayError, match="r.csv: line 2: rating '9'"):
        events("ciaodvd", bad)
