"""The Helm chart: lint, schema, rendering through the real Helm library, Kubernetes schemas.

helm lint runs through helm-sdkpy (the real Helm library). Rendering needs an install, so the
chart is installed into `FakeKube` (a loopback stand-in for the API server) and the manifests
Helm rendered are validated with kubernetes-validate against the oldest Kubernetes the chart
supports and the newest the validator knows.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import helm_sdkpy as helm          # `make setup` installs it (--ignore-requires-python)
import kubernetes_validate
import pytest
import yaml

from hirflow.streams.config import HirflowConfig, load
from tests.helm.config_schema import schema_of
from tests.helm.fake_kube import FakeKube

CHART = Path(__file__).resolve().parents[2] / "helm" / "hirflow"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
BOOTSTRAP = {"kafka": {"bootstrap": "kafka-0.kafka:9092"}}
KUBE_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
CRDS = {"monitoring.coreos.com/v1"}     # no schema for custom resources in kubernetes-validate


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _lint(chart: Path) -> dict:
    return asyncio.run(helm.Lint(helm.Configuration()).run(str(chart)))


def _chart_with_values(tmp_path: Path, values: dict) -> Path:
    """A copy of the chart whose values.yaml is the defaults overlaid with `values` (Lint
    takes no values of its own)."""
    chart = tmp_path / "hirflow"
    shutil.copytree(CHART, chart)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    (chart / "values.yaml").write_text(yaml.safe_dump(_merge(defaults, values)))
    return chart


@pytest.fixture(scope="module")
def kube():
    fake = FakeKube()
    yield fake
    fake.close()


_releases = iter(range(10_000))


def _install(kube: FakeKube, values: dict) -> tuple[list[dict], dict]:
    """Install the chart into the fake API server; returns (rendered objects, release)."""
    cfg = helm.Configuration(namespace="hirflow", kubeconfig=kube.kubeconfig("hirflow"))
    rel = asyncio.run(helm.Install(cfg).run(f"r{next(_releases)}", str(CHART), values=values,
                                            wait=False, timeout=30))
    texts = [rel.get("manifest", "")] + [h["manifest"] for h in rel.get("hooks") or []]
    return [d for t in texts for d in yaml.safe_load_all(t) if d], rel


def _by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def _config_of(objs: list[dict], tmp_path: Path, env: dict | None = None) -> HirflowConfig:
    """The ConfigMap's config.toml as the worker reads it (hirflow's own loader)."""
    (cm,) = _by_kind(objs, "ConfigMap")
    f = tmp_path / "config.toml"
    f.write_text(cm["data"]["config.toml"])
    return load(file=f, env=env or {})


# -- values, schema, docs -------------------------------------------------------------------

def test_schema_spells_out_every_config_key():
    """A typo under `config` fails at install, and a new config key cannot be forgotten here."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["config"] == schema_of(HirflowConfig)
    assert schema["additionalProperties"] is False


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        yield path
        if isinstance(v, dict) and v:
            yield from _leaves(v, path + ".")


def test_every_value_has_a_param_line():
    text = (CHART / "values.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=values.schema.json")
    params = set(re.findall(r"^\s*## @param (\S+)", text, re.M))
    paths = set(_leaves(yaml.safe_load(text)))
    assert params <= paths, f"@param lines naming no value: {sorted(params - paths)}"
    undocumented = [p for p in paths if not any(p == q or p.startswith(q + ".") for q in params)
                    and not any(q.startswith(p + ".") for q in params)]
    assert not undocumented, f"values without a @param line: {undocumented}"


# -- helm lint ----------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", [None, *SCENARIOS], ids=lambda s: s.stem if s else "defaults")
def test_helm_lint(tmp_path, scenario):
    values = yaml.safe_load(scenario.read_text()) if scenario else {}
    result = _lint(_chart_with_values(tmp_path, values))
    assert result["TotalChartsLinted"] == 1
    assert not result["Errors"], [m for m in result["Messages"] if m["Severity"] >= 3]


def test_helm_lint_rejects_a_values_file_the_schema_refuses(tmp_path):
    chart = _chart_with_values(tmp_path, {"workers": {"replicas": "two"}})
    result = _lint(chart)
    assert result["Errors"]
    assert any(m["Path"] == "values.yaml" and m["Severity"] == 3 for m in result["Messages"])


@pytest.mark.parametrize("values, message", [
    ({"workers": {"replicas": "two"}}, "'/workers/replicas': got string, want integer"),
    ({"workers": {"replicas": 0}}, "/workers/replicas"),
    ({"image": {"flavor": "rocm"}}, "/image/flavor"),
    ({"kafka": {"securityProtocol": "SASL"}}, "/kafka/securityProtocol"),
    ({"config": {"refresh": {"batch_maxx": 10}}}, "batch_maxx"),
    ({"trainer": {"schedule": "hourly"}}, "/trainer/schedule"),
    ({"workerz": {}}, "workerz"),
])
def test_install_refuses_values_the_schema_rejects_with_a_clear_message(kube, values, message):
    with pytest.raises(helm.HelmError) as err:
        _install(kube, _merge(BOOTSTRAP, values))
    assert message in str(err.value) and "schema" in str(err.value).lower(), str(err.value)


@pytest.mark.parametrize("values, message", [
    ({"kafka": {"bootstrap": ""}}, "set kafka.bootstrap or kafka.bootstrapSecret.name"),
    ({"kafka": {"securityProtocol": "SASL_SSL"}}, "needs kafka.sasl.existingSecret"),
    ({"workers": {"replicas": 9}}, "replicas (9) > config.kafka.partitions (8)"),
    ({"workers": {"gpu": {"enabled": True}}}, "image.flavor is cpu"),
    ({"config": {"graph": {"path": "/x"}}}, "config.graph.path is set by the chart"),
    ({"config": {"train": {"seed": 1}}}, "config.train.seed is set by the chart"),
    ({"trainer": {"enabled": False}, "workers": {"checkpoint": "ckpt-1"}},
     "workers.checkpoint needs a checkpoint volume"),
])
def test_validate_values_refuses_inconsistent_values(kube, values, message):
    with pytest.raises(helm.HelmError) as err:
        _install(kube, _merge(BOOTSTRAP, values))
    assert "VALUES VALIDATION" in str(err.value) and message in str(err.value), str(err.value)


# -- rendered manifests ---------------------------------------------------------------------

@pytest.mark.parametrize("scenario", [None, *SCENARIOS], ids=lambda s: s.stem if s else "defaults")
def test_rendered_manifests_pass_kubernetes_schemas(kube, scenario):
    values = _merge(BOOTSTRAP, yaml.safe_load(scenario.read_text()) if scenario else {})
    objs, rel = _install(kube, values)
    assert rel["info"]["status"] == "deployed"
    checked = 0
    for obj in objs:
        if obj["apiVersion"] in CRDS:
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
    assert checked >= 2 * 5
    assert _by_kind(objs, "StatefulSet") and _by_kind(objs, "Pod"), "workers and helm test pod"


def test_kubernetes_schemas_catch_a_misplaced_field(kube):
    """The validation above can fail: a field the StatefulSet schema lacks is an error."""
    objs, _ = _install(kube, BOOTSTRAP)
    (sts,) = _by_kind(objs, "StatefulSet")
    sts["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[0], strict=True)


def test_defaults_render_workers_api_trainer_and_config(kube, tmp_path):
    objs, rel = _install(kube, BOOTSTRAP)
    (sts,) = _by_kind(objs, "StatefulSet")
    pod = sts["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HIRFLOW_WORKER__INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert re.fullmatch(r"[0-9a-f]{64}", pod["metadata"]["annotations"]["checksum/config"])
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "state"
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/data", "/etc/hirflow", "/checkpoints"}
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})

    cfg = _config_of(objs, tmp_path, env={"HIRFLOW_WORKER__INDEX": "1"})
    assert cfg.kafka.bootstrap == "kafka-0.kafka:9092" and cfg.kafka.partitions == 8
    assert cfg.worker.count == 2 and cfg.worker.index == 1 and cfg.worker.web_host == "0.0.0.0"
    assert cfg.graph.path == "/data/state" and cfg.worker.log_format == "json"

    (cron,) = _by_kind(objs, "CronJob")
    job = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["train"]          # settings: the [train] section
    assert {m["mountPath"] for m in job["containers"][0]["volumeMounts"]} >= {"/etc/hirflow", "/checkpoints"}
    assert cfg.train.out == "/checkpoints" and cfg.train.announce and cfg.train.train_share == 0.8
    assert cfg.refresh.checkpoints_root == "/checkpoints"     # announced paths must lie there
    claims = {v["persistentVolumeClaim"]["claimName"] for v in job["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {pvc["metadata"]["name"] for pvc in _by_kind(objs, "PersistentVolumeClaim")}
    assert _by_kind(objs, "PodDisruptionBudget") and len(_by_kind(objs, "Service")) == 2
    assert not _by_kind(objs, "ServiceMonitor")
    assert "kubectl --namespace hirflow port-forward" in rel["info"]["notes"]


def test_trainer_values_reach_the_train_section_of_the_shared_config(kube, tmp_path):
    values = _merge(BOOTSTRAP, {"trainer": {"stepsPerChunk": 50, "seed": 3, "trainShare": 0.7},
                                "config": {"train": {"passes": 2}}})
    objs, _ = _install(kube, values)
    cfg = _config_of(objs, tmp_path)
    assert (cfg.train.steps_per_chunk, cfg.train.seed, cfg.train.train_share) == (50, 3, 0.7)
    assert cfg.train.passes == 2 and cfg.train.out == "/checkpoints"


def test_api_token_comes_from_a_secret_to_workers_and_the_test_pod(kube):
    objs, _ = _install(kube, _merge(BOOTSTRAP, {"workers": {"apiTokenSecret": {"name": "api"}}}))
    (sts,) = _by_kind(objs, "StatefulSet")
    pods = [sts["spec"]["template"]["spec"]] + [o["spec"] for o in _by_kind(objs, "Pod")]
    assert len(pods) == 2
    for pod in pods:
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["HIRFLOW_WORKER__API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "api", "key": "token"}


def _scenario(name: str) -> dict:
    return _merge(BOOTSTRAP, yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text()))


def test_gpu_scenario_requests_gpus_on_the_cuda_image(kube, tmp_path):
    objs, _ = _install(kube, _scenario("gpu"))
    (sts,) = _by_kind(objs, "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["image"].endswith("-cuda")
    assert sts["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    (cron,) = _by_kind(objs, "CronJob")
    tc = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert tc["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert _config_of(objs, tmp_path).refresh.device == "cuda"


def test_sasl_scenario_takes_every_credential_from_secrets(kube, tmp_path):
    values = _scenario("sasl")
    values["kafka"]["bootstrap"] = ""
    objs, _ = _install(kube, values)
    (sts,) = _by_kind(objs, "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]
            if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"HIRFLOW_KAFKA__BOOTSTRAP": {"name": "kafka-endpoints", "key": "bootstrap"},
                    "HIRFLOW_KAFKA__CLIENT__SASL__USERNAME": {"name": "kafka-credentials", "key": "username"},
                    "HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD": {"name": "kafka-credentials", "key": "password"}}
    assert c["args"] == ["worker", "--no-create-topics"]
    secrets = {"HIRFLOW_KAFKA__BOOTSTRAP": "b-1:9096", "HIRFLOW_KAFKA__CLIENT__SASL__USERNAME": "svc",
               "HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD": "s3cret"}
    cfg = _config_of(objs, tmp_path, env=secrets)
    assert cfg.kafka.bootstrap == "b-1:9096" and cfg.kafka.topic_prefix == "tenant-a."
    assert cfg.kafka.client == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                "ssl.ca.location": "/etc/hirflow/kafka-ca/ca.crt",
                                "sasl.username": "svc", "sasl.password": "s3cret"}
    assert not _by_kind(objs, "Secret"), "the chart never renders credentials"
    ca = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "kafka-ca"]
    assert ca == [{"name": "kafka-ca", "secret": {"secretName": "kafka-ca"}}]


def test_trainer_off_scenario_serves_an_existing_checkpoint(kube, tmp_path):
    objs, rel = _install(kube, _scenario("trainer-off"))
    assert not _by_kind(objs, "CronJob") and not _by_kind(objs, "PersistentVolumeClaim")
    assert not _by_kind(objs, "PodDisruptionBudget") and not _by_kind(objs, "ServiceAccount")
    (sts,) = _by_kind(objs, "StatefulSet")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in sts["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["hirflow-checkpoints"]
    assert _config_of(objs, tmp_path).refresh.checkpoint == "/checkpoints/ckpt-0cb91c0fc23e02df"
    assert "Trainer disabled" in rel["info"]["notes"]


def test_service_monitor_scrapes_each_worker_once(kube):
    objs, _ = _install(kube, _merge(BOOTSTRAP, {"serviceMonitor": {"enabled": True,
                                                                  "labels": {"release": "prom"}}}))
    (sm,) = _by_kind(objs, "ServiceMonitor")
    selected = [s for s in _by_kind(objs, "Service")
                if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [s["spec"].get("clusterIP") for s in selected] == ["None"]
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]


def test_every_pod_gets_pull_secrets_and_the_security_context(kube):
    objs, _ = _install(kube, _merge(BOOTSTRAP, {"imagePullSecrets": ["regcred", {"name": "other"}]}))
    pods = [_by_kind(objs, "StatefulSet")[0]["spec"]["template"]["spec"],
            _by_kind(objs, "CronJob")[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            _by_kind(objs, "Pod")[0]["spec"]]
    for spec in pods:
        assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
        assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["runAsNonRoot"]
        assert all(c["securityContext"]["allowPrivilegeEscalation"] is False for c in spec["containers"])


def _exported_series() -> set[str]:
    """Every series name the worker's /metrics can carry (histograms as _bucket/_sum/_count)."""
    from hirflow.streams.metrics import REGISTRY
    out = set()
    for m in REGISTRY.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "gauge": ("",)}.get(m.type, ("",))
        out.update(m.name + s for s in suffixes)
    return out


def test_dashboard_ships_as_a_sidecar_configmap_of_exported_metrics(kube):
    objs, _ = _install(kube, _merge(BOOTSTRAP, {"dashboard": {
        "enabled": True, "annotations": {"grafana_folder": "hirflow"}}}))
    (cm,) = [o for o in _by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "hirflow"}
    shipped = json.loads(cm["data"]["hirflow-workers.json"])
    assert shipped == json.loads((CHART / "dashboards" / "hirflow-workers.json").read_text())
    exported, used = _exported_series(), set()
    for panel in shipped["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\bhirflow_[a-z_]+", target["expr"]))
            assert names, f"{panel['title']}: a query that names no hirflow metric"
            assert names <= exported, f"{panel['title']}: not exported: {names - exported}"
            used |= names
    # what an operator looks at first: ingest and lag, freshness, refresh batches, backlog,
    # hot swap, dead letters by reason
    assert {"hirflow_events_applied_total", "hirflow_consumer_lag", "hirflow_freshness_seconds_bucket",
            "hirflow_refresh_batch_seconds_bucket", "hirflow_dirty_nodes",
            "hirflow_hot_swap_progress", "hirflow_events_dead_lettered_total"} <= used


def test_dashboard_is_off_by_default(kube):
    objs, _ = _install(kube, BOOTSTRAP)
    assert not [o for o in _by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_chart_readme_values_table_is_current():
    from tests.helm.values_table import values_table
    text = (CHART / "README.md").read_text()
    table = text.split("<!-- values:start -->\n", 1)[1].split("<!-- values:end -->", 1)[0]
    assert table == values_table(), "regenerate: python -m tests.helm.values_table"
