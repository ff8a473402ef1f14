"""The change log on the embedded broker: a claim fences the former owner before it writes
anything locally, a store built before the log enters it as a snapshot and restores byte
for byte, and a partition that never entered the log is never dropped."""
import pytest

from hirflow.state import partition_state
from hirflow.state.graph import GraphStore, IncompatibleStoreError
from hirflow.state.partition_log import NODE_FAMILIES
from hirflow.state.writer import GraphWriter
from hirflow.streams.scaleout import changelog
from hirflow.streams.topics import Topics
from tests.state.helpers import apply_direct


def _events(tiny_world, n=600):
    return tiny_world[:n]


def _movable(store, p):
    return sorted(partition_state.movable_ops(store, p))


def _writer(cfg, store, name):
    return changelog.ChangelogWriter(cfg.kafka, store, Topics(cfg.kafka.topic_prefix).changelog, name)


def _logged_writer(cfg, store, name, parts) -> tuple[changelog.ChangelogWriter, GraphWriter]:
    """A store that owns `parts` through the change log, and a graph writer on it."""
    w = _writer(cfg, store, name)
    changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)
    store.attach_log(parts, w)
    return w, GraphWriter(store, cfg.graph)


def test_a_claim_fences_the_former_owner_before_it_writes_locally(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "old", cfg.schema, cfg.kafka.partitions) as old:
        w_old, writer = _logged_writer(cfg, old, "old", parts)
        for e in _events(tiny_world, 300):
            writer.apply(e)
        writer.commit()
        with GraphStore(tmp_path / "new", cfg.schema, cfg.kafka.partitions) as new:
            w_new = _writer(cfg, new, "new")
            done = changelog.settle(cfg.kafka, new, w_new, parts, cfg.kafka.partitions)
            assert sorted(done.restored) == parts
            before = {p: _movable(old, p) for p in parts}
            for p in parts:        # the new owner has what the old one committed
                assert [op for op in _movable(new, p) if op[0] != NODE_FAMILIES.index("dirty")] == \
                    [op for op in before[p] if op[0] != NODE_FAMILIES.index("dirty")]
            for e in _events(tiny_world, 600)[300:]:
                writer.apply(e)
            with pytest.raises(changelog.Fenced):
                writer.commit()
            assert {p: _movable(old, p) for p in parts} == before    # nothing written locally
            w_new.close()
        w_old.close()


def test_a_store_from_before_the_log_enters_it_as_a_snapshot_and_restores_exactly(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "before", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, _events(tiny_world), cfg.graph)
        w = _writer(cfg, store, "before")
        done = changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)
        assert sorted(done.bootstrapped) == parts
        store.attach_log(parts, w)               # then commits on top of the snapshots
        writer = GraphWriter(store, cfg.graph)
        for e in tiny_world[600:900]:
            writer.apply(e)
        writer.commit()
        w.close()
        expected = {p: _movable(store, p) for p in parts}
    with GraphStore(tmp_path / "after", cfg.schema, cfg.kafka.partitions) as store:
        w = _writer(cfg, store, "after")
        done = changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)
        w.close()
        assert sorted(done.restored) == parts
        dirty = NODE_FAMILIES.index("dirty")     # every restored node is marked for re-encoding
        for p in parts:
            assert [op for op in _movable(store, p) if op[0] != dirty] == \
                [op for op in expected[p] if op[0] != dirty]


def test_a_partition_that_never_entered_the_log_is_not_dropped(cfg, tmp_path, tiny_world):
    with GraphStore(tmp_path / "s", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, _events(tiny_world), cfg.graph)
        w = _writer(cfg, store, "half")
        with pytest.raises(IncompatibleStoreError, match="never entered the change log"):
            changelog.settle(cfg.kafka, store, w, [0], cfg.kafka.partitions)
        w.close()
        assert all(partition_state.has_state(store, p, meta=False) for p in range(1, cfg.kafka.partitions))


def test_a_changed_partition_is_snapshotted_when_due_and_restores_from_there(cfg, tmp_path, tiny_world,
                                                                            monkeypatch):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "owner", cfg.schema, cfg.kafka.partitions) as store:
        w, writer = _logged_writer(cfg, store, "owner", parts)
        for e in tiny_world[:400]:
            writer.apply(e)
        writer.commit()
        w.snapshot_every_s = 0.0
        w.snapshot_due()                         # the first call only starts the clocks
        before = {p: w.positions[p].offset for p in parts}
        w.snapshot_due()
        assert all(w.positions[p].offset == before[p] for p in parts)    # nothing changed since
        touched = {store.keys.partition(e.src) for e in tiny_world[400:410]}
        for e in tiny_world[400:410]:
            writer.apply(e)
        writer.commit()
        w._last_snapshot = {p: (0.0, at) for p, (_, at) in w._last_snapshot.items()}
        before = {p: w.positions[p].offset for p in parts}
        w.snapshot_due()
        assert {p for p in parts if w.positions[p].offset != before[p]} >= touched
        snapshot_at = {p: w.positions[p].offset for p in touched}     # its last part
        w.close()
        expected = {p: _movable(store, p) for p in parts}
    starts = {}
    newest = changelog.newest_snapshot

    def spy(reader, p, end):
        starts[p] = newest(reader, p, end)
        return starts[p]

    monkeypatch.setattr(changelog, "newest_snapshot", spy)
    with GraphStore(tmp_path / "next", cfg.schema, cfg.kafka.partitions) as store:
        w = _writer(cfg, store, "next")
        changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)
        # the replay of a snapshotted partition starts at the snapshot, not at its first commit
        assert all(starts[p] is not None and starts[p] <= snapshot_at[p] for p in touched)
        assert all(starts[p] > 1 for p in touched)
        w.close()
        dirty = NODE_FAMILIES.index("dirty")
        for p in parts:
            assert [op for op in _movable(store, p) if op[0] != dirty] == \
                [op for op in expected[p] if op[0] != dirty]


def test_a_restore_cut_short_is_replayed_again_or_dropped_never_kept(cfg, tmp_path, tiny_world):
    parts = list(range(cfg.kafka.partitions))
    with GraphStore(tmp_path / "owner", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, _events(tiny_world), cfg.graph)
        w = _writer(cfg, store, "owner")
        changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)    # into the log
        w.close()
        expected = {p: _movable(store, p) for p in parts}
    with GraphStore(tmp_path / "next", cfg.schema, cfg.kafka.partitions) as store:
        w = _writer(cfg, store, "next")

        def crash(*a, **k):
            raise KeyboardInterrupt("killed mid-replay")

        real = partition_state.mark_dirty
        partition_state.mark_dirty = crash            # the replay's last step never runs
        try:
            with pytest.raises(KeyboardInterrupt):
                changelog.settle(cfg.kafka, store, w, parts, cfg.kafka.partitions)
        finally:
            partition_state.mark_dirty = real
        w.close()
        assert partition_state.position(store, 0).cseq == -1     # marked unfinished
        w = _writer(cfg, store, "others")          # not owned now: dropped, not refused
        done = changelog.settle(cfg.kafka, store, w, parts[1:], cfg.kafka.partitions)
        w.close()
        assert 0 in done.dropped and not partition_state.has_state(store, 0, meta=False)
        w = _writer(cfg, store, "zero")            # owned again: replayed whole
        done = changelog.settle(cfg.kafka, store, w, [0], cfg.kafka.partitions)
        w.close()
        assert 0 in done.restored
        dirty = NODE_FAMILIES.index("dirty")
        assert [op for op in _movable(store, 0) if op[0] != dirty] == \
            [op for op in expected[0] if op[0] != dirty]
