"""The dirty-claim protocol (state.dirty_queue) under any interleaving of ingest touches and
commits, entity touches and commits, claims, finished refreshes and failed ones: no event is
left unrefreshed, no claim covers an event that is not durable yet, and once everything is
refreshed no durable marker is left behind."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.dirty_queue import DirtyQueue

NODES = ["a", "b", "c"]
ops = st.lists(st.one_of(
    st.tuples(st.just("touch"), st.sampled_from(NODES), st.integers(0, 50)),
    st.tuples(st.just("entity"), st.sampled_from(NODES), st.integers(0, 50)),
    st.tuples(st.just("commit")), st.tuples(st.just("commit_entities")),
    st.tuples(st.just("claim"), st.integers(1, 3)),
    st.tuples(st.just("finish")), st.tuples(st.just("fail"))), max_size=60)


@given(ops)
@settings(max_examples=300, deadline=None)
def test_every_event_is_refreshed_after_it_is_durable_and_markers_end_clean(steps):
    durable: dict[str, int] = {}            # the dirty column family
    q = DirtyQueue(durable)
    uncommitted: list[tuple[str, int]] = []          # ingest events not committed
    uncommitted_entities: list[tuple[str, int]] = []
    waiting: list[tuple[str, int]] = []     # durable events no finished refresh has covered
    claims: list[tuple[dict, list]] = []    # (claim, durable events it covers), oldest first

    def put(markers):
        durable.update(markers)

    def clear(nodes):
        for n in nodes:
            durable.pop(n, None)

    def claim(limit):
        got = q.claim(limit)
        covered = [e for e in waiting if e[0] in got]
        for n, ts in got.items():                # a claim's marker is its oldest durable event
            assert ts <= min(t for m, t in covered if m == n)
        claims.append((got, covered))
        for e in covered:
            waiting.remove(e)

    def finish():
        got, _ = claims.pop(0)
        keep = set().union(*(c for c, _ in claims)) if claims else set()
        q.clear_settled(got, keep, clear)

    def fail():
        got, covered = claims.pop()
        q.unclaim(got)
        waiting.extend(covered)

    for op, *args in steps:
        if op == "touch":
            q.touch_many({args[0]: args[1]})
            uncommitted.append(tuple(args))
        elif op == "entity":
            q.touch_entity(*args)
            uncommitted_entities.append(tuple(args))
        elif op == "commit":
            q.commit_with(put)
            waiting += uncommitted
            uncommitted = []
        elif op == "commit_entities":
            q.commit_entities_with(put)
            waiting += uncommitted_entities
            uncommitted_entities = []
        elif op == "claim":
            claim(args[0])
        elif op == "finish" and claims:
            finish()
        elif op == "fail" and claims:
            fail()
        for n, _ in waiting:                     # nothing durable is forgotten
            assert n in q or any(n in c for c, _ in claims)
            assert n in durable
    while claims:
        finish()
    q.commit_with(put)
    q.commit_entities_with(put)
    waiting += uncommitted + uncommitted_entities
    for _ in range(20):
        if not len(q):
            break
        claim(3)
        finish()
    assert not waiting and not len(q) and not durable


def test_an_event_ahead_of_the_clock_is_refreshed_when_it_becomes_current():
    """A refresh samples as of now, so an edge that starts in the future is invisible to it:
    a node whose only events are ahead waits, and a node claimed now for an older event is
    dirty again once its newest event is current."""
    clock = [1_000]
    q = DirtyQueue({}, now_ms=lambda: clock[0])
    q.touch_many({"ahead": 5_000, "both": 900})
    q.defer({"ahead": 5_000, "both": 6_000})
    q.commit_with(lambda markers: None)
    assert q.claim(10) == {"both": 900}
    q.clear_settled({"both": 900}, set(), lambda nodes: None)
    clock[0] = 5_500
    assert q.claim(10) == {"ahead": 5_000}
    clock[0] = 6_000
    assert q.claim(10) == {"both": 6_000}
    assert not len(q) and q.claim(10) == {}
