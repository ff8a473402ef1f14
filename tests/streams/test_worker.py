"""The real worker process: kill -9 mid-stream, a broker cut off and back, a broker that is
not there yet: nothing lost, nothing applied twice, bounded stops;
health, readiness, metrics and the entity agent answer."""
import json
import random
import time

import pytest

from hirflow.state.events import Engagement, Entity, encode_entity
from hirflow.state.graph import GraphStore
from hirflow.state.index import TokenIndex
from hirflow.streams import changes, clients
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics
from hirflow.streams.worker.worker_process import WorkerProcess, peer_ports, wait_http
from tests.state.helpers import apply_direct, assert_same_state, digest
from tests.streams.kafka_helpers import committed_total
from tests.streams.view_helpers import assert_same_view, direct_view


@pytest.fixture
def workers(cfg, tmp_path):
    """Starts worker processes (`workers(env)`); kills any still running at teardown."""
    started: list[WorkerProcess] = []

    def start(env: dict | None = None) -> WorkerProcess:
        fast_metrics = {"HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}    # gauges the tests poll
        started.append(WorkerProcess(cfg, tmp_path / "worker.log", {**fast_metrics, **(env or {})}).start())
        return started[-1]

    yield start
    for w in started:
        w.close()


def _wait_refreshed(w, timeout=120.0):
    """Until the worker reports no dirty node and no neighbour backlog."""
    deadline = time.monotonic() + timeout
    while True:
        m = w.metrics()
        if m and m.get("hirflow_dirty_nodes", 1) == 0 and m.get("hirflow_neighbor_refresh_backlog", 1) == 0:
            return
        assert time.monotonic() < deadline, f"refresh did not catch up: {m.get('hirflow_dirty_nodes')}"
        time.sleep(0.3)


def _changes_by_seq(cfg) -> dict:
    from tests.streams.kafka_helpers import drain
    topic = Topics(cfg.kafka.topic_prefix).token_changes
    seen: dict[tuple[str, int], set[bytes]] = {}
    for m in drain(cfg, topic, 10**9, timeout=8):
        c = changes.decode(m.value())
        seen.setdefault((c.node, c.seq), set()).add(m.value())
    return seen


def test_kill_9_at_random_moments_loses_nothing_and_applies_nothing_twice(cfg, tmp_path, tiny_checkpoints,
                                                                         workers):
    """Ingest and refresh both run in the killed process: state equals a direct apply, no
    dirty node is lost, no seq is reused for different content, index agrees with state."""
    world = SynthWorld(SynthConfig(events=30_000, users=300, advertisers=8, seed=11))
    items = list(world.stream())
    evs = [e for e in items if isinstance(e, Engagement)]
    produce(cfg, items, progress=False)
    rnd = random.Random(5)
    env = {"HIRFLOW_INGEST__BATCH_MAX": "700", "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k),
           "HIRFLOW_WORKER__KNOWLEDGE": "false",     # restarts stay quick without MiniLM
           "HIRFLOW_REFRESH__CHECKPOINT": str(tiny_checkpoints[0])}   # many commits, so kills land between and in them
    topic = Topics(cfg.kafka.topic_prefix).engagements
    for round_ in range(3):
        w = workers(env)
        remaining = len(evs) - committed_total(cfg, topic)
        target = rnd.randint(300, max(400, remaining // 4))    # kill well before the end
        w.wait_metric("hirflow_events_applied_total", target)
        time.sleep(rnd.random() * 0.05)
        w.kill9()
    w = workers(env)
    deadline = time.monotonic() + 90
    while committed_total(cfg, topic) < len(evs):
        assert time.monotonic() < deadline, "worker did not finish the stream"
        time.sleep(0.3)
    _wait_refreshed(w)
    assert w.stop() == 0
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        after_crashes = digest(store)
        assert not store.reader.dirty()
        ix = TokenIndex(store)
        gen, model, _ = ix.active()
        assert model == tiny_checkpoints[0].name
        recs = {r.node: r for r in ix.iter_records(gen)}
        assert set(store.reader.node_ids()) <= set(recs)            # no refresh was lost
        want = sorted((t, store.keys.key(n)) for n, r in recs.items() for t in r.tokens)
        have = sorted((int.from_bytes(k[2:6], "big"), k[-10:]) for k, _ in ix._scan("postings", b""))
        assert have == want                                          # index agrees with state
        published = dict(zip(recs, ix.published(list(recs))))
        assert not list(ix.outbox())
    seen = _changes_by_seq(cfg)
    assert all(len(v) == 1 for v in seen.values()), "a seq was reused for different content"
    for node, pub in published.items():                              # subscribers saw the latest
        assert pub is not None and (node, pub[0]) in seen
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        assert_same_state(after_crashes, digest(store))


def test_worker_endpoints_and_entity_agent(cfg, tmp_path, workers):
    topics = Topics(cfg.kafka.topic_prefix)
    now = int(time.time() * 1000)
    p = clients.producer(cfg.kafka)
    p.produce(topics.entities, encode_entity(Entity("ad:7", now, "trail running shoes")), b"ad:7")
    p.produce(topics.entities, b"\x00junk", b"ad:8")
    p.produce(topics.engagements, json.dumps({"src": "user:1", "dst": "ad:7", "action": "click",
                                              "ts": now}).encode(), b"user:1")
    for dst in ("ad:7", "ad:9"):             # user:2 shares ad:7 with user:1 and also took ad:9
        p.produce(topics.engagements, json.dumps({"src": "user:2", "dst": dst, "action": "click",
                                                  "ts": now}).encode(), b"user:2")
    assert p.flush(30) == 0
    w = workers({"HIRFLOW_WORKER__API_TOKEN": "s3cret"})
    auth = {"Authorization": "Bearer s3cret"}
    try:
        w.wait_metric("hirflow_events_applied_total", 4)      # 3 engagements + 1 entity
        deadline = time.monotonic() + 30
        while w.get("/ready")[0] != 200:
            assert time.monotonic() < deadline, w.get("/ready")
            time.sleep(0.2)
        status, body = w.get("/health")
        assert status == 200 and json.loads(body)["ok"]
        w.wait_metric("hirflow_events_dead_lettered_total", 1)
        deadline = time.monotonic() + 10          # the lag gauge is sampled every
        while "hirflow_consumer_lag" not in (m := w.metrics()):   # metrics_interval_s
            assert time.monotonic() < deadline, "hirflow_consumer_lag never exported"
            time.sleep(0.1)
        for name in ("hirflow_events_consumed_total", "hirflow_ingest_batch_seconds_count",
                     "hirflow_state_bytes", "hirflow_dirty_nodes", "hirflow_consumer_lag"):
            assert name in m, name
        w.wait_metric("hirflow_index_nodes", 2)   # the gauges can read 0 before the commit
        _wait_refreshed(w)                        # marks the nodes dirty
        expect = {"/v1/nodes/user:1": 200, "/v1/nodes/ad:7": 200, "/v1/nodes/nonsense": 400,
                  "/v1/nodes/user:404": 404, "/v1/retrieve?user=user:1": 200,
                  "/v1/retrieve?user=user:1&k=abc": 400, "/v1/retrieve?user=user:1&k=0": 400,
                  "/v1/retrieve?user=user:1&types=spaceship": 400, "/v1/retrieve": 400,
                  "/v1/similar?node=ad:7&k=5": 200, "/v1/similar?node=ad:999": 404,
                  "/v1/primitives/0/0": 409, "/v1/primitives/x/0": 400,
                  "/v1/proximity?node=user:1&level=0&prim=0": 409, "/v1/status": 200,
                  "/openapi.json": 200}
        got = {path: w.get(path, auth)[0] for path in expect}
        assert got == expect
        assert w.get("/v1/status")[0] == 401                      # the API needs the token
        assert w.get("/v1/status", {"Authorization": "Bearer wrong"})[0] == 401
        node = json.loads(w.get("/v1/nodes/ad:7", auth)[1])
        assert node["model"] == "cold-start" and len(node["tokens"]) == 8
        got = json.loads(w.get("/v1/retrieve?user=user:1&k=5", auth)[1])
        # no checkpoint yet: what user:1's co-user took, never its own ad; the answer says how
        assert got["method"] == "neighbourhood" and [h["node"] for h in got["results"]] == ["ad:9"]
        assert got["quality"]["checkpoint"] is None and "hirflow train" in got["quality"]["retrieve"]
        status = json.loads(w.get("/v1/status", auth)[1])
        assert status["model"] == "cold-start" and status["model_quality"] == got["quality"]
        sim = json.loads(w.get("/v1/similar?node=ad:7&k=5", auth)[1])["results"]
        assert all(h["node"] != "ad:7" for h in sim)
        assert set(json.loads(w.get("/openapi.json")[1])["paths"]) >= {"/v1/retrieve", "/v1/nodes/{node}"}
        m = w.metrics()
        for name in ("hirflow_freshness_seconds_count", "hirflow_refresh_batch_seconds_count",
                     "hirflow_index_nodes", "hirflow_model_info", "hirflow_model_encoder_collapsed",
                     "hirflow_hot_swap_progress"):
            assert name in m, name
    finally:
        assert w.stop() == 0
    assert "\x1b" not in (tmp_path / "worker.log").read_text()      # a redirected log: no terminal codes
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        assert store.reader.entity("ad:7").text == "trail running shoes"
        vec = store.reader.knowledge(["ad:7"])["ad:7"]             # MiniLM world knowledge
        assert vec.shape == (384,) and abs(float(vec @ vec) - 1.0) < 1e-3
        assert store.reader.entity("ad:8") is None
        recs = TokenIndex(store).records(0, ["user:1", "ad:7"])       # refreshed (cold start)
        assert all(r is not None and r.model == "cold-start" for r in recs)


def test_kill_9_during_a_hot_swap_and_its_announce_pass(cfg, tmp_path, tiny_checkpoints, tiny_world, workers):
    """A worker killed while building the new generation, and again while announcing it,
    ends serving the new model with every node re-encoded and announced, the index agreeing
    with state, and no seq reused for other content."""
    from hirflow.trainer.publish import announce
    a, b = tiny_checkpoints
    produce(cfg, tiny_world, progress=False)
    env = {"HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__CHECKPOINT": str(a),
           "HIRFLOW_REFRESH__SWAP_RATE": "150", "HIRFLOW_REFRESH__BATCH_MAX": "64",
           "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k)}
    w = workers(env)
    _wait_refreshed(w)
    announce(clients.connection(cfg.kafka), Topics(cfg.kafka.topic_prefix).checkpoints, b)
    deadline = time.monotonic() + 60
    while not 0.0 < w.metrics().get("hirflow_hot_swap_progress", 1.0) < 0.5:   # building
        assert time.monotonic() < deadline, "the hot swap did not start"
        time.sleep(0.05)
    w.kill9()
    w = workers(env)                                  # restarts the swap, then announces
    deadline = time.monotonic() + 120
    while w.metrics().get("hirflow_index_switches_total", 0) < 1:
        assert time.monotonic() < deadline, "the resumed hot swap did not switch"
        time.sleep(0.05)
    w.kill9()                                         # in (or just after) the announce pass
    w = workers(env)
    deadline = time.monotonic() + 120
    while True:
        try:
            code, body = w.get("/v1/status")
            st = json.loads(body) if code == 200 else {}
        except OSError:                               # not listening yet
            st = {}
        if st.get("model") == b.name and st.get("hot_swap") is None and \
                w.metrics().get("hirflow_dirty_nodes", 1) == 0:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.3)
    time.sleep(2)                                     # the announce pass runs behind the switch
    assert w.stop() == 0
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        ix = TokenIndex(store)
        gen, model, _ = ix.active()
        assert model == b.name and ix.building() is None and ix.announce_pending() is None
        recs = {r.node: r for r in ix.iter_records(gen)}
        assert set(store.reader.node_ids()) <= set(recs) and {r.model for r in recs.values()} == {b.name}
        want = sorted((t, store.keys.key(n)) for n, r in recs.items() for t in r.tokens)
        have = sorted((int.from_bytes(k[2:6], "big"), k[-10:]) for k, _ in ix._scan("postings", gen.to_bytes(2, "big")))
        assert have == want
        published = dict(zip(recs, ix.published(list(recs))))
        assert all(p is not None and p[1] == b.name for p in published.values())
    seen = _changes_by_seq(cfg)
    assert all(len(v) == 1 for v in seen.values()), "a seq was reused for different content"



def test_kill_9_during_entity_batches_keeps_the_newest_entity_of_every_node(cfg, workers):
    """Entities (several versions per node, hostile records among them) through a worker
    killed twice mid-stream: every node ends with its newest entity, each hostile record is
    dead-lettered, and the entity offsets are durable with the entities."""
    import hashlib

    from tests.streams.kafka_helpers import drain
    topics = Topics(cfg.kafka.topic_prefix)
    now = int(time.time() * 1000) - 3_600_000
    rnd = random.Random(3)
    newest: dict[str, Entity] = {}
    p = clients.producer(cfg.kafka)
    hostile = 0
    for i in range(3000):
        if i % 250 == 7:
            p.produce(topics.entities, b'{"node": "ad:1", "ts": 1, "text": "\\ud800"}', b"ad:1")
            hostile += 1
            continue
        node = f"ad:{rnd.randrange(400)}"
        e = Entity(node, now + rnd.randrange(10**6), f"text {hashlib.md5(str(i).encode()).hexdigest()}")
        if node not in newest or e.ts > newest[node].ts:
            newest[node] = e
        p.produce(topics.entities, encode_entity(e), node.encode())
    assert p.flush(30) == 0
    env = {"HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__ENABLED": "false"}
    for _ in range(2):                   # killed soon after it starts reading entities
        w = workers(env)
        w.wait_metric("hirflow_events_consumed_total", 1, timeout=90)
        time.sleep(rnd.random() * 0.5)
        w.kill9()
    w = workers(env)
    deadline, last, still = time.monotonic() + 120, -1.0, 0
    while still < 10:                    # until nothing more arrives for 3 s
        m = w.metrics()
        seen = m.get("hirflow_events_consumed_total", 0) + m.get("hirflow_events_skipped_total", 0)
        still = still + 1 if seen == last and seen > 0 else 0
        last = seen
        assert time.monotonic() < deadline, "the entity stream was not finished"
        time.sleep(0.3)
    assert w.stop() == 0
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        for node, e in newest.items():
            got = store.reader.entity(node)
            assert got is not None and (got.ts, got.text) == (e.ts, e.text), node
    from hirflow.streams.ingest.deadletter import parse_headers
    dead = drain(cfg, topics.dead_letter, 10**9, timeout=5)   # a crash may duplicate one,
    origins = {parse_headers(m.headers())["hirflow.origin.offset"] + "@" +   # never lose one
               parse_headers(m.headers())["hirflow.origin.partition"] for m in dead}
    assert len(origins) == hostile


def test_kill_9_of_one_of_two_workers_loses_no_forwarded_side(cfg, tmp_path, workers):
    """Two workers, each owning half the partitions and forwarding the other half's sides on
    the reverse topic; one is killed twice mid-stream. The merged state equals a direct
    apply of the stream: no side lost, none applied twice. The stream is done when both
    groups' committed offsets reach the topics' true ends (`end_total` reads to the end:
    the embedded broker's high watermark can be a batch short)."""
    world = SynthWorld(SynthConfig(events=12_000, users=200, advertisers=6, seed=13))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    produce(cfg, evs, progress=False)

    def env(i):
        return {"HIRFLOW_WORKER__COUNT": "2", "HIRFLOW_WORKER__INDEX": str(i),
                "HIRFLOW_GRAPH__PATH": str(tmp_path / f"w{i}"), "HIRFLOW_INGEST__BATCH_MAX": "500",
                "HIRFLOW_INGEST__GROUP_ID": f"ingest-w{i}", "HIRFLOW_WORKER__APP_ID": f"hirflow-w{i}",
                "HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__ENABLED": "false",
                "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k)}
    steady = workers(env(0))
    for target in (1000, 2500):
        w = workers(env(1))
        w.wait_metric("hirflow_events_applied_total", target, timeout=90)
        w.kill9()
    w = workers(env(1))
    from tests.streams.kafka_helpers import end_total
    topics = Topics(cfg.kafka.topic_prefix)
    deadline = time.monotonic() + 120
    while True:                          # each partition is one group's: sums add up
        done = [sum(committed_total(cfg, t, f"ingest-w{i}") for i in range(2)) >= end_total(cfg, t)
                for t in (topics.engagements, topics.reverse)]
        if all(done):
            break
        assert time.monotonic() < deadline, f"the workers did not finish the stream: {done}"
        time.sleep(0.5)
    assert steady.stop() == 0 and w.stop() == 0
    merged = {}
    for i in range(2):
        with GraphStore(tmp_path / f"w{i}", cfg.schema, cfg.kafka.partitions, create=False) as store:
            merged.update(digest(store))
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        assert_same_state(merged, digest(store))


def test_a_query_about_another_workers_node_is_forwarded_to_its_owner(cfg, tmp_path, workers,
                                                                     tiny_checkpoints):
    """Two workers, each owning half the partitions, with `worker.peer_url` pointing at each
    other: either answers for every node (the owner's answer, passed on), a retrieval ranks
    both workers' items, each reports its assignment, a request that was forwarded
    already is never forwarded again, a node's view, sampled through the other worker's
    nodes, equals the one a single store of every event gives, and neighbour refreshes of
    the other worker's nodes go to it."""
    from hirflow.streams.scaleout.routing import FORWARDED, NodeRouter
    now = int(time.time() * 1000)
    users = [f"user:{i}" for i in range(12)]
    evs = [Engagement(u, f"ad:{(i + k) % 12}", "click" if k == 0 else "impression", now - 1000 * k)
           for i, u in enumerate(users) for k in (0, 1)]      # two users per ad: two-hop views
    p = clients.producer(cfg.kafka)
    for e in evs:
        p.produce(Topics(cfg.kafka.topic_prefix).engagements,
                  json.dumps({"src": e.src, "dst": e.dst, "action": e.action, "ts": e.ts}).encode(),
                  e.src.encode())
    assert p.flush(30) == 0
    router = NodeRouter(0, 2, cfg.kafka.partitions)
    assert {router.owner(u) for u in users} == {0, 1}              # both workers own some
    ports, peer_url = peer_ports(2)

    def env(i):
        return {"HIRFLOW_WORKER__COUNT": "2", "HIRFLOW_WORKER__INDEX": str(i),
                "HIRFLOW_WORKER__WEB_PORT": str(ports[i]), "HIRFLOW_WORKER__PEER_URL": peer_url,
                "HIRFLOW_GRAPH__PATH": str(tmp_path / f"w{i}"), "HIRFLOW_INGEST__GROUP_ID": f"ingest-w{i}",
                "HIRFLOW_WORKER__APP_ID": f"hirflow-w{i}", "HIRFLOW_WORKER__KNOWLEDGE": "false",
                # its 16 first-codebook cells are all probed: every ad is a candidate
                "HIRFLOW_REFRESH__CHECKPOINT": str(tiny_checkpoints[1])}
    ws = [workers(env(i)) for i in range(2)]
    try:
        for i, w in enumerate(ws):
            mine = [u for u in users if router.owner(u) == i]
            w.wait_metric("hirflow_index_nodes", len(mine), timeout=90)
            _wait_refreshed(w)
        for w in ws:
            got = {u: w.get(f"/v1/nodes/{u}") for u in users}
            assert {u: s for u, (s, _) in got.items()} == {u: 200 for u in users}
            assert all(json.loads(b)["node"] == u for u, (_, b) in got.items())
            # retrieval ranks every worker's items: the user's owner merges the others' best
            status, body = w.get(f"/v1/retrieve?user={users[0]}&k=12")
            got = json.loads(body)
            assert status == 200 and got["workers"] == {"asked": 2, "answered": 2}
            ads = [r["node"] for r in got["results"]]
            assert len(ads) == len(set(ads)) == 12 and {router.owner(a) for a in ads} == {0, 1}
            assert [r["score"] for r in got["results"]] == sorted((r["score"] for r in got["results"]), reverse=True)
            assert "query" not in got
            # so does `similar`: the other 11 users, from both workers
            status, body = w.get(f"/v1/similar?node={users[0]}&k=20&types=user")
            got = json.loads(body)
            assert status == 200 and got["workers"] == {"asked": 2, "answered": 2}
            assert sorted(r["node"] for r in got["results"]) == sorted(users[1:])
        model = json.loads(ws[0].get("/v1/status")[1])["model"]
        assert ws[0].get(f"/v1/internal/search?q=AAAA&tokens=1&model={model}x")[0] == 409
        status = [json.loads(w.get("/v1/status")[1])["assignment"] for w in ws]
        assert [s["index"] for s in status] == [0, 1] and all(s["count"] == 2 for s in status)
        assert sorted(p for s in status for p in s["partitions"]) == list(range(cfg.kafka.partitions))
        other = next(u for u in users if router.owner(u) == 1)
        assert ws[0].get(f"/v1/nodes/{other}", {FORWARDED: "1"})[0] == 404     # not bounced back
        # views read the other worker's nodes from it: the same as one store of everything
        cutoff = now + 1000
        with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
            apply_direct(store, evs, cfg.graph)
            want = {n: direct_view(cfg, store, n, cutoff) for n in users + [f"ad:{i}" for i in range(12)]}
        for w in ws:
            for n, view in want.items():
                status, body = w.get(f"/v1/nodes/{n}/view?cutoff={cutoff}&seed=0")
                assert status == 200, body
                assert_same_view(json.loads(body), view)
            m = w.metrics()
            assert m.get('hirflow_peer_reads_total{result="read"}', 0) > 0   # refresh too
            # neighbour refreshes of the other worker's nodes were asked of it, and it took them
            assert m.get('hirflow_neighbor_requests_total{direction="sent"}', 0) > 0
            assert m.get('hirflow_neighbor_requests_total{direction="received"}', 0) > 0
        assert any(router.owner(x["node"]) != router.owner(n) for n, v in want.items() for x in v["nodes"][1:]
                   if x["hop"] == 2)
    finally:
        for w in ws:
            assert w.stop() == 0


def test_sigterm_with_the_broker_gone_ends_the_worker_within_twenty_seconds(tmp_path):
    """The broker killed under a running worker: SIGTERM still ends it within 20 s (the
    graceful stop cannot get its acknowledgements; past its deadline the worker exits as
    a kill -9 would, which loses nothing)."""
    import os
    import signal

    from hirflow.streams.broker import EmbeddedBroker
    from hirflow.streams.worker.shutdown import FORCED_EXIT
    from hirflow.streams.topics import ensure_topics
    from tests.conftest import make_config
    b = EmbeddedBroker().start()
    cfg = make_config(tmp_path, bootstrap=b.bootstrap, partitions=1)
    ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
    world = SynthWorld(SynthConfig(events=600, users=40, advertisers=3, seed=5))
    produce(cfg, [e for e in world.stream() if isinstance(e, Engagement)], progress=False)
    w = WorkerProcess(cfg, tmp_path / "worker.log", {"HIRFLOW_WORKER__KNOWLEDGE": "false",
                                                      "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}).start()
    try:
        w.wait_metric("hirflow_events_applied_total", 100, timeout=90)
        at_kill = (tmp_path / "worker.log").read_bytes().count(b"\n")
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
        time.sleep(2)
        t = time.monotonic()
        code = w.terminate(timeout=40)
        took = time.monotonic() - t
        assert took <= 20, f"SIGTERM took {took:.1f} s"
        assert code in (0, FORCED_EXIT), code
        # the outage's lines: about one a second at most (clients' repeats held back)
        outage = (tmp_path / "worker.log").read_bytes().splitlines()[at_kill:]
        assert len(outage) <= 20, (f"{len(outage)} log lines in ~20 s of outage:\n"
                                   + "\n".join(x.decode(errors="replace")[:200] for x in outage))
    finally:
        w.close()
        b.stop()


def _applied_once_then_stopped(cfg, w: WorkerProcess, evs: list, tmp_path) -> None:
    """The worker applies `evs` (every one, once: its state equals a direct apply), then
    SIGTERM ends it within 20 s."""
    deadline = time.monotonic() + 120
    while committed_total(cfg, Topics(cfg.kafka.topic_prefix).engagements) < len(evs):
        assert time.monotonic() < deadline, "the worker did not apply the stream"
        time.sleep(0.3)
    assert w.metrics().get("hirflow_events_applied_total") == len(evs)
    t = time.monotonic()
    assert w.terminate(timeout=40) == 0
    assert time.monotonic() - t <= 20
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        state = digest(store)
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        assert_same_state(state, digest(store))


def test_a_worker_started_before_the_broker_applies_every_event_once_it_answers(tmp_path):
    """`hirflow worker` started while nothing listens on its bootstrap port: it waits, alive
    (/health 200, /ready 503), and once the broker starts and its topics are created it
    applies every event produced, once (its state equals a direct apply); SIGTERM then ends
    it within 20 s."""
    from hirflow.streams.broker import EmbeddedBroker
    from hirflow.streams.topics import ensure_topics
    from tests.conftest import make_config
    b = EmbeddedBroker()                                   # its port chosen, not started yet
    cfg = make_config(tmp_path, bootstrap=b.bootstrap, partitions=2)
    w = WorkerProcess(cfg, tmp_path / "worker.log", {"HIRFLOW_WORKER__KNOWLEDGE": "false",
                                                      "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}).start()
    try:
        assert wait_http(w.url("/health"), timeout=90)     # alive while it waits
        time.sleep(3)
        assert w.proc.poll() is None, "the worker exited without a broker"
        status, body = w.get("/ready")
        assert status == 503 and b"waiting for the Kafka cluster" in body
        b.start()
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
        world = SynthWorld(SynthConfig(events=600, users=40, advertisers=3, seed=5))
        evs = [e for e in world.stream() if isinstance(e, Engagement)]
        produce(cfg, evs, progress=False)
        _applied_once_then_stopped(cfg, w, evs, tmp_path)
    finally:
        w.close()
        b.stop()


def test_a_broker_away_and_back_with_its_state_loses_nothing_and_applies_nothing_twice(tmp_path):
    """The broker cut off for 20 s under a running worker (every connection closed, its port
    refusing: a network outage, or a durable broker's restart) and back with its state,
    events produced before, during and after: every event applied once (state equal to a
    direct apply), token changes flowing again within 10 s of its return, at most a line a
    second logged through the outage, SIGTERM within 20 s."""
    import threading

    from hirflow.streams.topics import ensure_topics
    from tests.conftest import make_config
    from tests.streams.outage import RelayedBroker
    b = RelayedBroker().start()
    cfg = make_config(tmp_path, bootstrap=b.bootstrap, partitions=2)
    topics = Topics(cfg.kafka.topic_prefix)
    ensure_topics(cfg.kafka, topics)
    world = SynthWorld(SynthConfig(events=1500, users=60, advertisers=4, seed=9))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    before, during, after = evs[:500], evs[500:1000], evs[1000:]
    w = WorkerProcess(cfg, tmp_path / "worker.log", {"HIRFLOW_WORKER__KNOWLEDGE": "false",
                                                      "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}).start()
    try:
        produce(cfg, before, progress=False)
        w.wait_metric("hirflow_events_applied_total", len(before), timeout=120)
        w.wait_metric("hirflow_token_changes_total", 1, timeout=60)
        lines_at_cut = (tmp_path / "worker.log").read_bytes().count(b"\n")
        b.cut()
        sent = threading.Thread(target=produce, args=(cfg, during), kwargs={"progress": False})
        sent.start()                                # waits in the producer's queue
        time.sleep(20)
        outage = (tmp_path / "worker.log").read_bytes().splitlines()[lines_at_cut:]
        changes_at_return = w.metrics().get("hirflow_token_changes_total", 0)
        b.restore()
        back = time.monotonic()
        assert len(outage) <= 20, b"\n".join(outage).decode(errors="replace")
        assert any(b"Kafka unreachable" in x for x in outage)
        w.wait_metric("hirflow_token_changes_total", changes_at_return + 1, timeout=60)
        assert time.monotonic() - back <= 10, "token changes did not resume within 10 s"
        sent.join(90)
        produce(cfg, after, progress=False)
        _applied_once_then_stopped(cfg, w, evs, tmp_path)
    finally:
        w.close()
        b.stop()
