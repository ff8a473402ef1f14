"""Standby replicas (`streams.scaleout.standby`) on the embedded broker: a copy that follows the change
log, stopped and resumed anywhere, is promoted to exactly the state a full restore gives, with
only the log's tail replayed; a partition a worker loses becomes its copy and comes back the
same way; a copy the log cannot continue is never promoted."""
import time

from hypothesis import given
from hypothesis import strategies as st

from hirflow.state import partition_state
from hirflow.state.graph import GraphStore
from hirflow.state.partition_log import NODE_FAMILIES, Position
from hirflow.state.writer import DST_SIDE, SRC_SIDE, GraphWriter
from hirflow.streams.scaleout import changelog, standby
from hirflow.streams.topics import Topics

DIRTY = NODE_FAMILIES.index("dirty")


@given(st.integers(0, 63), st.integers(1, 9), st.integers(0, 9))
def test_standbys_are_other_workers_and_cover_scaling_in_by_up_to_their_number(p, count, replicas):
    got = standby.standbys_of(p, count, replicas)
    owner = p % count
    assert len(got) == min(replicas, count - 1) and len(set(got)) == len(got)
    assert owner not in got and all(0 <= w < count for w in got)
    for k in range(1, len(got) + 1):          # with k fewer workers p goes to a copy (or stays)
        assert p % (count - k) in got + [owner]
    for w in got:                             # the same rule, seen from the worker
        assert p in standby.standby_partitions(w, count, replicas, 64)


def _movable(store, p):
    return [op for op in sorted(partition_state.movable_ops(store, p)) if op[0] != DIRTY]


def _writer(cfg, store, name):
    return changelog.ChangelogWriter(cfg.kafka, store, Topics(cfg.kafka.topic_prefix).changelog, name)


def _own(cfg, store, name, parts, **kw):
    w = _writer(cfg, store, name)
    done = changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions, **kw)
    store.attach_log(parts, w)
    return w, GraphWriter(store, cfg.graph), done


def _follower(cfg, store, parts):
    f = standby.StandbyFollower(cfg.kafka, store, Topics(cfg.kafka.topic_prefix).changelog, parts, poll_s=0.05)
    f.start()
    return f


def _wait_read(f: standby.StandbyFollower, writer: changelog.ChangelogWriter, timeout=60.0):
    """Until the follower has read every record the owner wrote."""
    end = time.monotonic() + timeout
    while any(f.consumed.get(p, -1) <= pos.offset for p, pos in writer.positions.items()
              if p in f.partitions):
        assert f.error is None, f.error
        assert time.monotonic() < end, "the standby did not catch up"
        time.sleep(0.05)


def _commit(writer, events, parts=None):
    """Apply the events' sides in `parts` (None: all) and commit."""
    keys = writer.store.keys
    for e in events:
        sides = (SRC_SIDE if parts is None or keys.partition(e.src) in parts else 0) | \
            (DST_SIDE if parts is None or keys.partition(e.dst) in parts else 0)
        if sides:
            writer.apply(e, sides)
    writer.commit()


def test_a_followed_copy_is_promoted_to_what_a_full_restore_gives(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "owner", cfg.schema, cfg.kafka.partitions) as owner, \
            GraphStore(tmp_path / "copies", cfg.schema, cfg.kafka.partitions) as copies:
        w, writer, _ = _own(cfg, owner, "owner", parts)
        _commit(writer, tiny_world[:300])
        f = _follower(cfg, copies, parts)
        _commit(writer, tiny_world[300:600])
        _wait_read(f, w)
        f.close()                                # stopped mid-stream, resumed later
        for p in parts:
            w.snapshot(p)
        _commit(writer, tiny_world[600:900])
        f = _follower(cfg, copies, parts)
        _commit(writer, tiny_world[900:1200])
        _wait_read(f, w)
        f.close()
        assert f.applied > 0 and all(f.position(p).cseq >= 0 for p in parts)
        expected = {p: _movable(owner, p) for p in parts}
        w.close()
        with GraphStore(tmp_path / "new", cfg.schema, cfg.kafka.partitions) as new:
            wn = _writer(cfg, new, "new")
            done = changelog.settle(cfg.kafka, new, wn, parts, cfg.kafka.partitions, standby=copies)
            wn.close()
            assert sorted(done.promoted) == parts and not done.restored
            # only the tail after each copy is replayed: the last commit, at most
            assert sum(done.promoted.values()) <= sum(len(_movable(owner, p)) for p in parts)
            assert {p: _movable(new, p) for p in parts} == expected
            assert all(partition_state.position(copies, p) is None for p in parts)   # spent
        with GraphStore(tmp_path / "restored", cfg.schema, cfg.kafka.partitions) as fresh:
            wf = _writer(cfg, fresh, "restored")
            done = changelog.settle(cfg.kafka, fresh, wf, parts, cfg.kafka.partitions)
            wf.close()
            assert sorted(done.restored) == parts
            assert {p: _movable(fresh, p) for p in parts} == expected


def test_a_lost_partition_becomes_a_copy_and_comes_back_from_it(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    lost = parts[1::2]
    with GraphStore(tmp_path / "a", cfg.schema, cfg.kafka.partitions) as a, \
            GraphStore(tmp_path / "a-standby", cfg.schema, cfg.kafka.partitions) as a_copies, \
            GraphStore(tmp_path / "b", cfg.schema, cfg.kafka.partitions) as b:
        wa, writer_a, _ = _own(cfg, a, "a", parts, standby=a_copies)
        _commit(writer_a, tiny_world[:500])
        wa.close()
        # a keeps the even partitions and a copy of the odd ones; b takes the odd ones
        wa, writer_a, done = _own(cfg, a, "a", parts[::2], standby=a_copies, standby_parts=lost)
        assert sorted(done.handed) == lost and sorted(done.kept) == parts[::2]
        assert all(not partition_state.has_state(a, p, meta=False) for p in lost)
        wb, writer_b, done = _own(cfg, b, "b", lost)
        assert sorted(done.restored) == lost
        f = _follower(cfg, a_copies, lost)
        _commit(writer_a, tiny_world[500:1200], parts[::2])
        _commit(writer_b, tiny_world[500:1000], lost)
        _commit(writer_b, tiny_world[1000:1200], lost)
        _wait_read(f, wb)
        f.close()
        expected = {p: _movable(b, p) for p in lost}
        wb.close()
        wa.close()
        wa, _, done = _own(cfg, a, "a", parts, standby=a_copies)
        wa.close()
        assert sorted(done.promoted) == lost and sorted(done.kept) == parts[::2]
        assert {p: _movable(a, p) for p in lost} == expected


def test_a_copy_that_is_unfinished_or_stale_is_never_promoted(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "owner", cfg.schema, cfg.kafka.partitions) as owner, \
            GraphStore(tmp_path / "copies", cfg.schema, cfg.kafka.partitions) as copies:
        w, writer, _ = _own(cfg, owner, "owner", parts)
        _commit(writer, tiny_world[:400])
        _commit(writer, tiny_world[400:800])     # confirms the first commit: copies apply it
        f = _follower(cfg, copies, parts)
        _wait_read(f, w)
        f.close()
        expected = {p: _movable(owner, p) for p in parts}
        w.close()
        at = partition_state.position(copies, 0)
        partition_state.set_position(copies, 0, Position(at.epoch, -1, at.offset))   # cut short
        wrong = [op for op in partition_state.movable_ops(copies, 1)][:1]
        partition_state.apply(copies, 1, [partition_state.Step(0, [(wrong[0][0], wrong[0][1], b"junk")])])
        partition_state.set_position(copies, 1, Position(at.epoch, 5, 10**9))   # beyond the log
        with GraphStore(tmp_path / "new", cfg.schema, cfg.kafka.partitions) as new:
            wn = _writer(cfg, new, "new")
            done = changelog.settle(cfg.kafka, new, wn, parts, cfg.kafka.partitions, standby=copies)
            wn.close()
            assert {0, 1} <= set(done.restored) and sorted(done.promoted) == parts[2:]
            assert {p: _movable(new, p) for p in parts} == expected
