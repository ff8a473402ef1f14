"""No record can make the validators raise anything but `EventError` (which names a reason
and sends the record to the dead-letter topic): arbitrary bytes, JSON and msgpack of any
shape, numbers that overflow a float or a 64-bit integer, nesting deeper than the parser's
recursion limit, text that is not valid Unicode."""
import json

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import EventError, Validator
from hirflow.state.schema import SchemaConfig

V = Validator(SchemaConfig())
NOW = 1_767_225_600_000
FIELDS = ["src", "dst", "action", "ts", "w", "id", "v", "node", "type", "text", "image_emb", "attrs"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 18),
                    st.integers(max_value=-10 ** 18), st.floats(allow_nan=True), st.text(max_size=20),
                    st.sampled_from(["user:1", "ad:1", "click", "purchase", "user:", ":x", NOW]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)
records = st.fixed_dictionaries({}, optional={k: values for k in FIELDS})


def _json(d) -> bytes:
    return json.dumps(d, allow_nan=True).encode()


def _msgpack(d) -> bytes | None:
    try:
        return msgpack.packb(d)
    except (OverflowError, TypeError, ValueError):     # msgpack cannot hold ints past 64 bits
        return None


def _only_event_errors(raw: bytes | None) -> None:
    for decode in (V.decode_engagement, V.decode_entity):
        try:
            decode(raw)
        except EventError:
            pass


@given(records, st.booleans())
@settings(max_examples=400, deadline=None)
def test_any_map_is_an_event_or_an_event_error(rec, as_msgpack):
    raw = _msgpack(rec) if as_msgpack else _json(rec)
    if raw is not None:
        _only_event_errors(raw)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_bytes_are_an_event_or_an_event_error(raw):
    _only_event_errors(raw)


def test_the_records_that_once_stopped_ingest():
    big = 10 ** 400
    for rec in ({"src": "user:1", "dst": "ad:1", "action": "click", "ts": NOW, "w": big},
                {"src": "user:1", "dst": "ad:1", "action": "click", "ts": big},
                {"node": "ad:1", "ts": NOW, "image_emb": [big, 1.0]},
                {"node": "ad:1", "ts": NOW, "text": "x", "attrs": {"k": big}}):
        _only_event_errors(_json(rec))
    _only_event_errors(b"[" * 30_000 + b"]" * 30_000)             # deeper than recursion allows
    _only_event_errors(b'{"src": "user:1", "dst": "ad:1", "action": "click", "ts": 1, "w": '
                       + b"9" * 5000 + b"}")
    _only_event_errors(b'{"node": "ad:1", "ts": 1767225600000, "text": "\\ud800"}')
    _only_event_errors(msgpack.packb({"node": "ad:1", "ts": NOW, "text": "x", "attrs": {1: 2}}))
    _only_event_errors(None)                                       # a tombstone
    _only_event_errors(_json({"src": "user:\x07bell", "dst": "ad:1", "action": "click", "ts": NOW}))


@given(records)
@settings(max_examples=200, deadline=None)
def test_every_accepted_entity_can_be_stored_and_read_back(tmp_path_factory, rec):
    """What the validator accepts never fails the entity commit later (one bad entity would
    otherwise stay queued and fail every later commit)."""
    from hirflow.state.graph import GraphStore
    rec = {**rec, "node": "ad:1", "ts": NOW}
    try:
        ent = V.decode_entity(_json(rec))
    except EventError:
        return
    path = tmp_path_factory.mktemp("ent")
    with GraphStore(path, SchemaConfig(), 4) as store:
        store.commit(entities=[ent])
        assert repr(store.reader.entity("ad:1")) == repr(ent)     # repr: NaN in attrs
