"""The CLI as a user runs it: synth files, replay of JSONL and of the Taobao format, help."""
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from hirflow.state.events import Validator
from hirflow.state.graph import GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.writer import GraphWriter
from hirflow.streams.tools.cli import cli
from hirflow.streams.ingest.loop import IngestLoop
from hirflow.streams.tools.replay import ReplayError, detect_format, read_events
from hirflow.streams.topics import Topics
from tests.conftest import make_config
from tests.streams.kafka_helpers import run_until

DATA = Path(__file__).parent.parent / "data"


def test_help_reads_well():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    for cmd in ("broker", "topics", "worker", "replay", "synth", "demo", "state"):
        assert cmd in r.output
    for cmd in ("worker", "replay", "synth", "train", "evaluate"):
        r = CliRunner().invoke(cli, [cmd, "--help"])
        assert r.exit_code == 0 and "%%" not in r.output          # click prints help as written


def test_config_masks_kafka_secrets_unless_asked():
    env_like = ["--set", "kafka.client.sasl.password=hunter2", "--set", "kafka.client.sasl.username=svc",
                "--set", "kafka.client.ssl.key.pem=-----BEGIN PRIVATE KEY-----"]
    r = CliRunner().invoke(cli, env_like + ["config"])
    assert r.exit_code == 0, r.output
    client = json.loads(r.output)["kafka"]["client"]
    assert client == {"sasl.password": "***", "sasl.username": "svc", "ssl.key.pem": "***"}
    assert "hunter2" not in r.output and "PRIVATE" not in r.output
    r = CliRunner().invoke(cli, env_like + ["config", "--show-secrets"])
    assert json.loads(r.output)["kafka"]["client"]["sasl.password"] == "hunter2"


def test_unknown_config_key_is_a_usage_error():
    r = CliRunner().invoke(cli, ["--set", "graph.nope=1", "config"])
    assert r.exit_code == 2 and "graph.nope" in r.output


def replay_file(broker, tmp_path, config: str, data: Path, partitions: int) -> tuple[dict, object]:
    """`hirflow --config CONFIG topics create` and `replay DATA` through the broker, as a user
    runs them -> (the replay's JSON stats, the config to ingest them with)."""
    from hirflow.streams.config import load
    cfg = make_config(tmp_path, broker.bootstrap)
    base = ["--config", config, "--bootstrap", broker.bootstrap,
            "--topic-prefix", cfg.kafka.topic_prefix, "--partitions", str(partitions)]
    r = CliRunner().invoke(cli, base + ["topics", "create"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, base + ["replay", "--no-progress", str(data)])
    assert r.exit_code == 0, r.output
    tcfg = load(file=config, env={}, overrides={
        "kafka.bootstrap": broker.bootstrap, "kafka.topic_prefix": cfg.kafka.topic_prefix,
        "kafka.partitions": partitions, "graph.path": str(tmp_path / "st")})
    return json.loads(r.stdout.strip().splitlines()[-1]), tcfg


def ingest_all(tcfg, store, engagements: int) -> None:
    loop = IngestLoop(tcfg, GraphWriter(store, tcfg.graph), Topics(tcfg.kafka.topic_prefix))
    run_until(loop, lambda: loop.applied >= engagements)
    loop.close()


def test_taobao_replay_through_the_broker(broker, tmp_path):
    stats, tcfg = replay_file(broker, tmp_path, "configs/taobao.toml", DATA / "taobao_sample.csv", 4)
    rows = (DATA / "taobao_sample.csv").read_text().splitlines()
    products = {row.split(",")[1] for row in rows}
    assert stats["engagements"] == len(rows) + len(products)     # + one belongs_to per product
    with GraphStore(tcfg.graph.path, tcfg.schema, 4) as store:
        ingest_all(tcfg, store, stats["engagements"])
        u = rows[0].split(",")[0]
        assert store.reader.node(f"user:{u}").events == sum(1 for r in rows if r.split(",")[0] == u)
        cat = store.reader.neighbors(f"product:{rows[0].split(',')[1]}", k=50)
        assert any(e.action == "belongs_to" and e.neighbor.startswith("category:") for e in cat)


def test_synth_files_replay_and_bad_file_is_named(tmp_path):
    r = CliRunner().invoke(cli, ["synth", "--out", str(tmp_path / "w"), "--events", "500",
                                 "--users", "50"])
    assert r.exit_code == 0, r.output
    labels = [json.loads(x) for x in (tmp_path / "w" / "labels.jsonl").read_text().splitlines()]
    assert any("interests" in row for row in labels) and any("fine" in row for row in labels)
    v = Validator(make_config(tmp_path).schema)
    evs = list(read_events(tmp_path / "w" / "engagements.jsonl", "jsonl", v))
    assert len(evs) >= 500 and evs == sorted(evs, key=lambda e: e.ts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"src": "user:1", "dst": "ad:1", "action": "click", "ts": 1767225600000}\n'
                   '{"src": "user:1", "dst": "ad:1", "action": "warp", "ts": 1767225600000}\n')
    with pytest.raises(ReplayError, match="line 2: unknown_action"):
        list(read_events(bad, "jsonl", v))


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(0, 10**6)),
                     min_size=1, max_size=6),
       header=st.booleans(), weight=st.booleans())
def test_a_csv_reads_the_same_with_or_without_its_header(tmp_path_factory, rows, header, weight):
    """Headerless or not, the same events; one row is one event, never a silent zero."""
    v = Validator(SchemaConfig(), now_ms=lambda: 1_767_225_600_000 + 10**7)
    lines = [f"user:{u},ad:{a},click,{1_767_225_600_000 + t}" + (",2.5" if weight else "")
             for u, a, t in rows]
    f = tmp_path_factory.mktemp("csv") / "e.csv"
    f.write_text("\n".join((["src,dst,action,ts" + (",w" if weight else "")] if header else []) + lines) + "\n")
    assert detect_format(f) == "csv"
    evs = list(read_events(f, "csv", v))
    assert [(e.src, e.dst, e.ts, e.w) for e in evs] == \
        [(f"user:{u}", f"ad:{a}", 1_767_225_600_000 + t, 2.5 if weight else 1.0) for u, a, t in rows]


def test_a_csv_with_the_wrong_columns_names_the_expected_ones(tmp_path):
    v = Validator(SchemaConfig())
    f = tmp_path / "e.csv"
    f.write_text("user:1,ad:1,click\n")
    with pytest.raises(ReplayError, match="line 1: expected columns src,dst,action,ts"):
        list(read_events(f, "csv", v))
    f.write_text("src,dst,verb,ts\nuser:1,ad:1,click,1\n")
    with pytest.raises(ReplayError, match="a header names the columns"):
        list(read_events(f, "csv", v))


def test_synth_is_deterministic_by_seed():
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld
    a = list(SynthWorld(SynthConfig(events=800, users=40, seed=4)).stream())
    b = list(SynthWorld(SynthConfig(events=800, users=40, seed=4)).stream())
    c = list(SynthWorld(SynthConfig(events=800, users=40, seed=5)).stream())
    assert a == b and a != c


def test_synth_locality_plants_the_coarse_level_in_users_interests():
    """With locality 1 every user's interests share its first one's coarse interest; the
    rest of the world (ads, texts, which users drift) is the same as with locality 0."""
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld
    plain = SynthWorld(SynthConfig(users=300, seed=4))
    local = SynthWorld(SynthConfig(users=300, seed=4, locality=1.0))
    per_coarse = plain.cfg.mid * plain.cfg.fine
    spread = [len({f // per_coarse for f in ints}) for ints in plain.user_interests]
    assert max(spread) > 1
    assert all(len({f // per_coarse for f in ints}) == 1 for ints in local.user_interests)
    assert [len(i) for i in local.user_interests] == [len(i) for i in plain.user_interests]
    assert [i[0] for i in local.user_interests] == [i[0] for i in plain.user_interests]
    assert np.array_equal(local.ad_fine, plain.ad_fine) and local.user_drift == plain.user_drift
    with pytest.raises(ValueError, match="locality"):
        SynthConfig(locality=1.5)


def test_online_retail_replay_through_the_broker_reports_skipped_rows(broker, tmp_path):
    stats, tcfg = replay_file(broker, tmp_path, "configs/online_retail.toml",
                              DATA / "online_retail_sample.csv", 2)
    assert stats["skipped_rows"] == {"no_customer": 2, "not_a_product": 4, "zero_quantity_or_price": 1}
    assert stats["entities"] > 0 and stats["engagements"] > 300
    with GraphStore(tcfg.graph.path, tcfg.schema, 2) as store:
        ingest_all(tcfg, store, stats["engagements"])
        edges = store.reader.neighbors("user:17850", k=100)
        assert any(e.neighbor == "country:United_Kingdom" for e in edges)
        assert any(e.neighbor == "product:85123A" and e.action == "purchase" for e in edges)


def test_online_retail_train_and_evaluate_from_the_file(tmp_path):
    """`hirflow train` / `evaluate` read the format from the file; evaluate reports the
    protocol's tasks with intervals and the tuned baselines."""
    base = ["--config", "configs/online_retail.toml"]
    data = str(DATA / "online_retail_sample.csv")
    r = CliRunner().invoke(cli, base + ["train", "--input", data, "--format", "online-retail",
                                        "--out", str(tmp_path / "ck"), "--levels", "2,4",
                                        "--steps-per-chunk", "1", "--no-knowledge", "--no-announce",
                                        "--no-progress", "--cutoff", "2011-01-01"])
    assert r.exit_code == 0, r.output
    ck = json.loads(r.stdout.strip().splitlines()[-1])["checkpoint"]
    r = CliRunner().invoke(cli, base + ["evaluate", ck, "--input", data, "--no-knowledge",
                                        "--quick-baselines", "--out", str(tmp_path / "ev")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert m["windows"]["start"] < m["windows"]["train_end"] <= m["windows"]["val_end"]
    assert "deep_funnel" in m and "usage_entropy" in m
    manifest = json.loads((Path(ck) / "manifest.json").read_text())
    assert manifest["quantizer"]["nbits"] < 8       # a few hundred nodes: smaller codebooks, no crash


def test_an_expected_error_is_one_line_and_exit_code_2_without_a_traceback(tmp_path):
    """A store another process holds: one clear line, exit 2; --debug adds the traceback."""
    import subprocess
    import sys
    from hirflow.state.graph import GraphStore
    held = GraphStore(tmp_path / "st", SchemaConfig(), 8)
    try:
        cmd = [sys.executable, "-m", "hirflow.streams.tools.cli", "--state", str(tmp_path / "st"),
               "state", "--node", "user:1"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("hirflow: error: state store")
        assert "locked by another process" in r.stderr
        r = subprocess.run(cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "Traceback" in r.stderr and "StoreLockedError" in r.stderr
    finally:
        held.close()
