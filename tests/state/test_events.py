import json
import math

import msgpack
import pytest

from hirflow.state.events import (Engagement, Entity, EventError, Validator, decode_map, encode_engagement,
                                  encode_entity)
from hirflow.state.schema import SchemaConfig

NOW = 1_767_225_600_000
V = Validator(SchemaConfig(), now_ms=lambda: NOW)


def reason(raw: bytes) -> str:
    with pytest.raises(EventError) as e:
        V.decode_engagement(raw)
    return e.value.reason


def good(**kw):
    d = {"v": 1, "src": "user:1", "dst": "ad:2", "action": "click", "ts": NOW - 1000}
    d.update(kw)
    return d


def test_round_trip_msgpack_and_json():
    ev = Engagement("user:1", "ad:2", "click", NOW, 2.5, "e1")
    assert V.decode_engagement(encode_engagement(ev)) == ev
    assert V.decode_engagement(json.dumps(good()).encode()) == Engagement("user:1", "ad:2", "click", NOW - 1000)
    ent = Entity("ad:2", NOW, "running shoes", {"brand": "x"}, (0.5, 1.0))
    assert V.decode_entity(encode_entity(ent)) == ent


@pytest.mark.parametrize("raw,expected", [
    (b"\xc1\xff garbage", "undecodable"),
    (b"{not json", "bad_json"),
    (msgpack.packb([1, 2]), "not_a_map"),
    (msgpack.packb(good(src="shop:1")), "unknown_node_type"),
    (msgpack.packb(good(action="teleport")), "unknown_action"),
    (msgpack.packb(good(src="user1")), "malformed_id"),
    (msgpack.packb(good(src="user:")), "malformed_id"),
    (msgpack.packb(good(src=42)), "wrong_type"),
    (msgpack.packb({k: v for k, v in good().items() if k != "ts"}), "missing_field"),
    (msgpack.packb(good(w=float("nan"))), "bad_weight"),
    (msgpack.packb(good(w=float("inf"))), "bad_weight"),
    (msgpack.packb(good(w=-1.0)), "bad_weight"),
    (msgpack.packb(good(w=1e12)), "bad_weight"),
    (msgpack.packb(good(w="heavy")), "wrong_type"),
    (msgpack.packb(good(ts=5)), "ts_out_of_window"),
    (msgpack.packb(good(ts=NOW + 10 * 86_400_000)), "ts_out_of_window"),
    (msgpack.packb(good(v=9)), "unsupported_version"),
    (msgpack.packb(good(dst="user:1")), "self_loop"),
    (b"x" * (65 * 1024), "too_large"),
])
def test_each_bad_input_has_its_reason(raw, expected):
    assert reason(raw) == expected


def test_msgpack_never_looks_like_json():
    # every msgpack map starts with 0x80-0x8f, 0xde or 0xdf; never '{'
    assert encode_engagement(Engagement("user:1", "ad:2", "click", NOW))[:1] != b"{"


def test_entity_validation():
    with pytest.raises(EventError, match="bad_embedding"):
        V.entity({"node": "ad:1", "ts": NOW, "image_emb": [1.0, math.nan]})
    with pytest.raises(EventError, match="wrong_type"):
        V.entity({"node": "ad:1", "ts": NOW, "attrs": [1]})


def test_decode_map_limit():
    with pytest.raises(EventError, match="too_large"):
        decode_map(b"{}" * 10, 5)


from hypothesis import given, settings, strategies as st  # noqa: E402

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8)
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=6)


@settings(max_examples=80, deadline=None)
@given(JSON_VALUES, st.sampled_from(["", " ", "\n"]))
def test_json_that_is_no_object_is_not_a_map(value, lead):
    """`[1,2,3]`, `"hello"`, `null`, numbers: each refused as not a map, never as
    undecodable, with or without leading whitespace."""
    assert reason((lead + json.dumps(value)).encode()) == "not_a_map"


def test_an_unknown_node_type_names_the_config_key_to_set():
    with pytest.raises(EventError, match="schema.extra_node_types"):
        V.decode_engagement(msgpack.packb(good(dst="country:uk")))


def test_a_fractional_ts_is_cut_to_whole_ms_as_documented():
    assert V.decode_engagement(json.dumps(good(ts=NOW - 1000 + 0.75)).encode()).ts == NOW - 1000
