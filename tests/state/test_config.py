import pytest

from hirflow.state.config import ConfigError
from hirflow.streams.config import HirflowConfig, load


def test_defaults_file_env_flags_precedence(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[graph]\ntop_k = 100\ntrim_slack = 5\n[kafka]\npartitions = 3\n')
    env = {"HIRFLOW_GRAPH__TOP_K": "120", "HIRFLOW_KAFKA__PARTITIONS": "5"}
    cfg = load(file=f, env=env, overrides={"kafka.partitions": 7})
    assert cfg.graph.top_k == 120          # env beats file
    assert cfg.graph.trim_slack == 5       # file beats default
    assert cfg.kafka.partitions == 7       # flag beats env
    assert cfg.graph.cache_nodes == HirflowConfig().graph.cache_nodes   # default


def test_unknown_keys_are_named(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[graph]\ntop_kk = 1\n')
    with pytest.raises(ConfigError, match="graph.top_kk"):
        load(file=f, env={})
    with pytest.raises(ConfigError, match="kafka.bootstrapp"):
        load(env={"HIRFLOW_KAFKA__BOOTSTRAPP": "x"})
    with pytest.raises(ConfigError, match="nosuch"):
        load(env={}, overrides={"nosuch.key": 1})


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="graph.top_k"):
        load(env={"HIRFLOW_GRAPH__TOP_K": "many"})
    with pytest.raises(ConfigError, match="top_k"):
        load(env={}, overrides={"graph.top_k": 0})
    with pytest.raises(ConfigError, match="standby_replicas needs worker.changelog"):
        load(env={"HIRFLOW_WORKER__STANDBY_REPLICAS": "1"})
    assert load(env={"HIRFLOW_WORKER__STANDBY_REPLICAS": "1",
                     "HIRFLOW_WORKER__CHANGELOG": "true"}).worker.standby_replicas == 1


def test_extra_actions_and_types_from_file():
    cfg = load(file="configs/taobao.toml", env={})
    assert "category" in cfg.schema.all_node_types
    acts = cfg.schema.all_actions
    assert acts["belongs_to"].structural and acts["buy"].funnel_weight == 4.0
    assert "click" in acts                 # defaults are kept, not replaced


def test_one_table_entry_per_env_var(tmp_path):
    """Kubernetes passes each credential as its own variable from a Secret."""
    f = tmp_path / "c.toml"
    f.write_text('[kafka.client]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n')
    env = {"HIRFLOW_KAFKA__CLIENT__SASL__USERNAME": "svc", "HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD": "p=\"w"}
    client = load(file=f, env=env).kafka.client
    assert client == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                      "sasl.username": "svc", "sasl.password": 'p="w'}
    assert load(env={"HIRFLOW_KAFKA__CLIENT": '{"a.b": "c"}'}).kafka.client == {"a.b": "c"}
    with pytest.raises(ConfigError, match="kafka.partitions.x"):
        load(env={"HIRFLOW_KAFKA__PARTITIONS__X": "1"})
