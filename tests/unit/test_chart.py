"""The Helm chart, rendered by the pinned helm: lint, golden output, the
restricted Pod profile, RBAC generated from the code, and the images'
Dockerfile. The chart installed into the live control plane is
tests/e2e/test_chart.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import Autoscaling, InferenceServiceSpec
from kubeloop.cli.api import render_rbac
from kubeloop.dev.binaries import binary
from kubeloop.gpu.placement import CPU
from kubeloop.serving.builders.workloads import ServingImages, build_autoscaler, build_children
from kubeloop.operator.permissions import operator_permissions
from kubeloop.registry.base import ModelVersion
from kubeloop.version import COMPONENTS_IMAGE
from tests.support.promtool import check_rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeloop"
CI_VALUES = CHART / "ci" / "lint-values.yaml"
GOLDEN = ROOT / "tests" / "golden"
# Regenerate the golden files with KUBELOOP_UPDATE_GOLDEN=1 after a deliberate change.
UPDATE = os.environ.get("KUBELOOP_UPDATE_GOLDEN") == "1"

RENDERINGS = {
    "cluster-wide": [],
    "namespaced": ["--set", "watchNamespaces={ml-team-a,ml-team-b}", "--set", "serving.gateway.name="],
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    helm_bin = binary("helm")  # missing, it fails naming the fix: every test target builds helm
    result = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def render(*extra: str) -> list[dict]:
    out = helm("template", "kubeloop", str(CHART), "--namespace", "kubeloop-system", "--kube-version", "1.36.3",
               "-f", str(CI_VALUES), *extra).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_charts_generated_files_match_the_code():
    assert (CHART / "files" / "operator-rules.yaml").read_text() == render_rbac(), "run `make crds`"
    rules = (ROOT / "monitoring" / "rules" / "kubeloop.rules.yaml").read_text()
    assert (CHART / "files" / "kubeloop.rules.yaml").read_text() == rules, "run `make crds`"


def test_helm_lint_passes_with_the_required_values():
    result = helm("lint", str(CHART), "--strict", "-f", str(CI_VALUES))
    assert "0 chart(s) failed" in result.stdout


def test_missing_required_values_are_named():
    result = helm("lint", str(CHART), check=False)
    assert result.returncode != 0
    assert "/mlflow/trackingUri" in result.stdout and "/webhooks/tokenSecret/name" in result.stdout
    no_endpoint = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                       "--set", "pipelines.kfp.endpoint=", check=False)
    assert no_endpoint.returncode != 0
    assert "pipelines.kfp.endpoint is required with pipelines.backend=kfp" in no_endpoint.stderr
    typo = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                "--set", "watchNamespace=ml", check=False)
    assert typo.returncode != 0 and "watchNamespace" in typo.stderr


def test_alertmanagers_token_and_mlflows_signing_secret_are_two_secrets():
    """Cluster: each secret comes from its own Secret, mounted as a volume (not a
    subPath), so kubelet updates the file when the Secret is rotated."""
    spec = _pod_specs(render())[0]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {"webhook-token": "kubeloop-webhook", "mlflow-webhook-secret": "kubeloop-mlflow-webhook"}
    assert env["KUBELOOP_WEBHOOK_TOKEN_FILE"].startswith(mounts["webhook-token"]["mountPath"] + "/")
    assert env["KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE"].startswith(mounts["mlflow-webhook-secret"]["mountPath"] + "/")
    assert not any("subPath" in m for m in mounts.values())
    missing = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                   "--set", "webhooks.mlflowSecret.name=", check=False)
    assert missing.returncode != 0 and "webhooks.mlflowSecret.name is required" in missing.stderr


def test_the_pipeline_steps_settings_reach_the_operator_by_name():
    """Cluster: the components image, the MLflow and object-store Secrets'
    names and the endpoint become the operator's settings (the kfp backend
    puts them on every submitted step); unset, no variable is set."""
    env = {e["name"]: e.get("value") for e in _pod_specs(render())[0]["containers"][0]["env"]}
    assert env["KUBELOOP_COMPONENTS_IMAGE"] == COMPONENTS_IMAGE
    assert env["KUBELOOP_MLFLOW_SECRET"] == "mlflow-credentials"
    assert env["KUBELOOP_OBJECT_STORE_SECRET"] == "artifact-store"
    assert env["KUBELOOP_OBJECT_STORE_ENDPOINT"] == "http://minio.minio.svc:9000"
    bare = render("--set", "mlflow.credentialsSecret=", "--set", "objectStore.credentialsSecret=",
                  "--set", "objectStore.endpoint=", "--set", "pipelines.componentsImage=registry.example/c:1")
    env = {e["name"]: e.get("value") for e in _pod_specs(bare)[0]["containers"][0]["env"]}
    assert env["KUBELOOP_COMPONENTS_IMAGE"] == "registry.example/c:1"
    assert not {"KUBELOOP_MLFLOW_SECRET", "KUBELOOP_OBJECT_STORE_SECRET", "KUBELOOP_OBJECT_STORE_ENDPOINT"} & set(env)


def test_the_object_store_reaches_the_operator_by_reference():
    """Cluster: objectStore's Secret becomes the operator's S3 credentials
    through secretKeyRef (never a value in the chart), its endpoint boto3's
    AWS_ENDPOINT_URL_S3 and requestLogUrl the request log; unset, none is set."""
    env = {e["name"]: e for e in _pod_specs(render())[0]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[key]
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "artifact-store", "key": key}
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://minio.minio.svc:9000"
    assert env["KUBELOOP_REQUEST_LOG"]["value"] == "s3://kubeloop-requests/logs"
    bare = render("--set", "objectStore.credentialsSecret=", "--set", "objectStore.endpoint=",
                  "--set", "objectStore.requestLogUrl=")
    names = {e["name"] for e in _pod_specs(bare)[0]["containers"][0]["env"]}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "KUBELOOP_REQUEST_LOG"} & names
    refused = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                   "--set", "objectStore.requestLogUrl=/var/log/requests", check=False)
    assert refused.returncode != 0 and "requestLogUrl" in refused.stderr


def test_the_router_image_puts_the_front_in_front_only_when_set():
    """Cluster: serving.routerImage becomes KUBELOOP_ROUTER_IMAGE (the
    kubernetes backend then runs a router per InferenceService); empty, none."""
    env = {e["name"]: e.get("value") for e in _pod_specs(render())[0]["containers"][0]["env"]}
    assert env["KUBELOOP_ROUTER_IMAGE"] == "ghcr.io/kubeloop/runtime:0.1.0"
    bare = render("--set", "serving.routerImage=")
    assert "KUBELOOP_ROUTER_IMAGE" not in {e["name"] for e in _pod_specs(bare)[0]["containers"][0]["env"]}


def test_the_webhooks_service_takes_a_named_node_port_only_as_a_node_port_service():
    """Cluster: an Alertmanager and MLflow outside the cluster (the local
    platform's, on the host) call the webhooks through a NodePort Service;
    by default the Service is ClusterIP, and a nodePort without NodePort is
    refused naming both values."""
    (service,) = [d for d in render() if d["kind"] == "Service"]
    assert service["spec"]["type"] == "ClusterIP" and "nodePort" not in service["spec"]["ports"][0]
    (exposed,) = [d for d in render("--set", "service.type=NodePort", "--set", "service.nodePort=30042")
                  if d["kind"] == "Service"]
    assert exposed["spec"]["type"] == "NodePort"
    assert exposed["spec"]["ports"][0]["nodePort"] == 30042 and exposed["spec"]["ports"][0]["targetPort"] == "http-webhooks"
    refused = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                   "--set", "service.nodePort=30042", check=False)
    assert refused.returncode != 0 and "service.type=NodePort" in refused.stderr
    out_of_range = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                        "--set", "service.type=NodePort", "--set", "service.nodePort=8080", check=False)
    assert out_of_range.returncode != 0 and "nodePort" in out_of_range.stderr


def test_the_charts_components_image_is_the_operators_default():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["pipelines"]["componentsImage"] == COMPONENTS_IMAGE


@pytest.mark.parametrize("name", RENDERINGS)
def test_helm_template_matches_the_golden_file(name):
    extra = RENDERINGS[name]
    out = helm("template", "kubeloop", str(CHART), "--namespace", "kubeloop-system", "--kube-version", "1.36.3",
               "-f", str(CI_VALUES), *extra).stdout
    golden = GOLDEN / f"chart-{name}.yaml"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out)
    assert out == golden.read_text(), "the chart's output changed; check it and rerun with KUBELOOP_UPDATE_GOLDEN=1"


def _pod_specs(docs: list[dict]) -> list[dict]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_pod_meets_the_restricted_profile_with_a_read_only_root(name):
    specs = _pod_specs(render(*RENDERINGS[name]))
    assert specs
    for spec in specs:
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
        assert pod["seccompProfile"]["type"] == "RuntimeDefault"
        assert not any(k in spec for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert all("hostPath" not in v for v in spec.get("volumes", []))
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
            # Secrets by reference only: no literal credentials in the environment.
            for env in container.get("env", []):
                assert not re.search(r"PASSWORD|_TOKEN$|_KEY$", env["name"]) or "value" not in env, env


def _rules(docs: list[dict], kind: str) -> dict[str, list[dict]]:
    return {f"{d['metadata'].get('namespace', '')}/{d['metadata']['name']}": d["rules"]
            for d in docs if d["kind"] == kind}


def _materialize_role(wanted) -> dict[str, list[dict]]:  # noqa: ANN001 - operator_permissions()
    """Materialisation Jobs (the renderings set a router image): their rules
    in the release's own namespace only."""
    return {"kubeloop-system/kubeloop-materialize": [r.policy() for r in wanted.materialize]}


def test_the_charts_roles_are_the_operators_permissions():
    wanted = operator_permissions()
    namespaced = [r.policy() for r in wanted.namespaced]
    own = _materialize_role(wanted)
    docs = render(*RENDERINGS["cluster-wide"])
    cluster_roles = _rules(docs, "ClusterRole")
    # Cluster-wide with a Gateway: the namespaced rules and the HTTPRoutes' in one ClusterRole.
    assert cluster_roles == {"/kubeloop": namespaced + [r.policy() for r in wanted.gateway],
                             "/kubeloop-fleet": [r.policy() for r in wanted.cluster]}
    assert _rules(docs, "Role") == own
    docs = render(*RENDERINGS["namespaced"])
    assert _rules(docs, "ClusterRole") == {"/kubeloop-fleet": [r.policy() for r in wanted.cluster]}
    assert _rules(docs, "Role") == {"ml-team-a/kubeloop": namespaced, "ml-team-b/kubeloop": namespaced, **own}
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {d["roleRef"]["name"] for d in bindings} == {"kubeloop", "kubeloop-fleet", "kubeloop-materialize"}
    assert all(s == {"kind": "ServiceAccount", "name": "kubeloop", "namespace": "kubeloop-system"}
               for d in bindings for s in d["subjects"])


def test_serving_backend_kserve_enables_the_backend_and_grants_kserves_kinds():
    """Cluster path (chart): serving.backend=kserve makes kserve the default
    with kubernetes still enabled, and adds KServe's rules to the Roles and
    the ClusterStorageContainer's to the fleet ClusterRole; the default
    (kubernetes) grants none of them."""
    wanted = operator_permissions()
    docs = render(*RENDERINGS["namespaced"], "--set", "serving.backend=kserve")
    env = {e["name"]: e.get("value") for e in _pod_specs(docs)[0]["containers"][0]["env"]}
    assert (env["KUBELOOP_SERVING_BACKENDS"], env["KUBELOOP_SERVING_BACKEND"]) == ("kserve,kubernetes", "kserve")
    namespaced = [r.policy() for r in wanted.namespaced + wanted.kserve]
    assert _rules(docs, "Role") == {"ml-team-a/kubeloop": namespaced, "ml-team-b/kubeloop": namespaced,
                                    **_materialize_role(wanted)}
    assert _rules(docs, "ClusterRole") == {
        "/kubeloop-fleet": [r.policy() for r in wanted.cluster + wanted.kserve_cluster]}
    default = json.dumps(render(*RENDERINGS["namespaced"]))
    assert "serving.kserve.io" not in default
    refused = helm("template", "kubeloop", str(CHART), "-f", str(CI_VALUES), "--set", "serving.backend=kfserving",
                   check=False)
    assert refused.returncode != 0 and "backend" in refused.stderr


def test_gpu_allocation_dra_reaches_the_operator_and_grants_claim_templates_only_then():
    """Cluster path (chart): serving.gpuAllocation=dra sets KUBELOOP_GPU_ALLOCATION, adds the
    ResourceClaimTemplates' rules to the Roles and the read of ResourceSlices and claims to the
    fleet's ClusterRole; the default grants none of them."""
    wanted = operator_permissions()
    docs = render(*RENDERINGS["namespaced"], "--set", "serving.gpuAllocation=dra")
    env = {e["name"]: e.get("value") for e in _pod_specs(docs)[0]["containers"][0]["env"]}
    assert env["KUBELOOP_GPU_ALLOCATION"] == "dra"
    namespaced = [r.policy() for r in wanted.namespaced + wanted.dra]
    assert _rules(docs, "Role") == {"ml-team-a/kubeloop": namespaced, "ml-team-b/kubeloop": namespaced,
                                    **_materialize_role(wanted)}
    assert _rules(docs, "ClusterRole") == {"/kubeloop-fleet": [r.policy() for r in wanted.cluster + wanted.dra_cluster]}
    default = json.dumps(render(*RENDERINGS["namespaced"]))
    assert "resourceclaimtemplates" not in default and "resourceslices" not in default


def test_materialisation_jobs_are_switched_on_with_a_router_image_and_granted_only_in_the_releases_namespace():
    """Cluster path (chart): with a router image the operator materialises
    online stores as Jobs (KUBELOOP_MATERIALIZER=kubernetes) in its own
    namespace, which it learns from the downward API, and may manage Jobs
    there; feast.materializeJobs=false, or no router image, grants nothing
    and switches nothing on."""
    def env(docs: list[dict]) -> dict:
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in _pod_specs(docs)[0]["containers"][0]["env"]}

    on = render(*RENDERINGS["namespaced"])
    assert env(on)["KUBELOOP_MATERIALIZER"] == "kubernetes"
    assert env(on)["KUBELOOP_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "kubeloop-system/kubeloop-materialize" in _rules(on, "Role")
    for values in (["--set", "feast.materializeJobs=false"], ["--set", "serving.routerImage="]):
        off = render(*RENDERINGS["namespaced"], *values)
        assert "KUBELOOP_MATERIALIZER" not in env(off)
        assert "kubeloop-system/kubeloop-materialize" not in _rules(off, "Role")


def test_the_trainer_backend_needs_the_training_image_and_is_granted_trainjobs_only_then():
    """Cluster path (chart): pipelines.backend=trainer gives the operator the
    training image and bucket, and adds the TrainJobs' rule to the Roles;
    without an image it fails naming the value; other backends grant nothing
    of Trainer's."""
    wanted = operator_permissions()
    docs = render(*RENDERINGS["namespaced"], "--set", "pipelines.backend=trainer",
                  "--set", "pipelines.trainer.image=reg/kubeloop/training:1")
    env = {e["name"]: e.get("value") for e in _pod_specs(docs)[0]["containers"][0]["env"]}
    assert (env["KUBELOOP_PIPELINE_BACKEND"], env["KUBELOOP_TRAINING_IMAGE"], env["KUBELOOP_TRAINING_BUCKET"]) == (
        "trainer", "reg/kubeloop/training:1", "training")
    namespaced = [r.policy() for r in wanted.namespaced + wanted.trainer]
    assert _rules(docs, "Role") == {"ml-team-a/kubeloop": namespaced, "ml-team-b/kubeloop": namespaced,
                                    **_materialize_role(wanted)}
    assert "trainjobs" not in json.dumps(render(*RENDERINGS["namespaced"]))
    refused = helm("template", "kubeloop", str(CHART), "--kube-version", "1.36.3", "-f", str(CI_VALUES),
                   "--set", "pipelines.backend=trainer", check=False)
    assert refused.returncode != 0 and "pipelines.trainer.image is required" in refused.stderr


def test_the_permissions_are_least_privilege():
    wanted = operator_permissions()
    every = (wanted.namespaced + wanted.cluster + wanted.gateway + wanted.kserve + wanted.kserve_cluster + wanted.dra
             + wanted.dra_cluster + wanted.materialize + wanted.trainer)
    for rule in every:
        assert "*" not in rule.verbs and "*" not in rule.resources and rule.api_group != "*"
        assert not {"secrets", "serviceaccounts", "roles", "rolebindings", "clusterroles",
                    "clusterrolebindings", "pods/exec"} & set(rule.resources), rule
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule.verbs), rule
    # Cluster-wide, only reads (and applying kubeloop's one storage container with KServe).
    assert all(set(rule.verbs) <= {"get", "list", "watch"} for rule in wanted.cluster + wanted.dra_cluster)


def test_the_prometheus_rule_carries_the_alert_templates_verbatim():
    docs = render()
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    source = yaml.safe_load((ROOT / "monitoring" / "rules" / "kubeloop.rules.yaml").read_text())
    assert rule["spec"] == source
    drift = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "KubeloopDataDrift")
    assert "{{ $labels.inferenceservice }}" in drift["annotations"]["summary"]


def _serving_spec(**fields) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"}, **fields})


SERVING = ObjectRef("InferenceService", "ml", "fraud", "uid-1")


def _hpa_metric_names() -> set[str]:
    """The custom metric every autoscaling choice's HPA asks for, as the
    operator builds it."""
    names = set()
    for choice in typing.get_args(Autoscaling.model_fields["metric"].annotation):
        hpa = build_autoscaler(SERVING, _serving_spec(autoscaling={"metric": choice}))
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods"
        names.add(metric["pods"]["metric"]["name"])
    return names


def _adapter_rules(docs: list[dict]) -> list[dict]:
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kubeloop-adapter-rules")
    return yaml.safe_load(config["data"]["config.yaml"])["rules"]


def _series(rule: dict) -> str:
    return re.match(r"'?([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)


def _exposed_name(rule: dict) -> str:
    """The metric name prometheus-adapter serves for a rule: name.matches
    applied to the series' name, rewritten by name.as ($N: a capture group)."""
    name = rule["name"]
    assert re.search(name["matches"], _series(rule)), rule
    return re.sub(name["matches"], re.sub(r"\$(\d)", r"\\g<\1>", name["as"]), _series(rule))


def _filled_query(rule: dict) -> str:
    """A rule's metricsQuery with the adapter's template fields filled in as
    it fills them for a Pods request."""
    query = rule["metricsQuery"]
    for field, value in (("<<.Series>>", _series(rule)), ("<<.GroupBy>>", "namespace,pod"),
                         ("<<.LabelMatchers>>", 'namespace="ml",pod=~"fraud-predictor-.*"')):
        query = query.replace(field, value)
    assert "<<" not in query, query
    return query


def test_the_adapter_serves_exactly_the_metrics_the_hpas_ask_for():
    """Cluster contract: prometheus-adapter's per-Pod metric names are the
    names build_autoscaler puts in the HPAs; renaming either side fails here."""
    rules = _adapter_rules(render())
    assert {_exposed_name(rule) for rule in rules} == _hpa_metric_names()
    for rule in rules:
        # Pods metrics: each series is attributed to its namespace and Pod.
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}


def test_the_adapters_queries_are_valid_promql(tmp_path):
    """Each filled-in metricsQuery parses as PromQL (promtool)."""
    rules = [{"record": f"adapter:{_exposed_name(rule)}", "expr": _filled_query(rule)}
             for rule in _adapter_rules(render())]
    result = check_rules([{"name": "prometheus-adapter", "rules": rules}], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A label selector's verdict (matchLabels, and In/Exists expressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(e["key"] in labels and (e["operator"] == "Exists" or labels[e["key"]] in e["values"])
               for e in selector.get("matchExpressions", []))


def _scraped_ports(monitor: dict, pod: dict) -> list[str]:
    """The ports Prometheus scrapes on a Pod: each endpoint whose port the
    Pod names and whose keep relabelings its labels pass."""
    labels = pod["metadata"]["labels"]
    meta = {f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v for k, v in labels.items()}
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    scraped = []
    for endpoint in monitor["podMetricsEndpoints"]:
        relabelings = endpoint.get("relabelings", [])
        assert {s for r in relabelings for s in r["sourceLabels"]} <= meta.keys()
        keep = all(re.fullmatch(r["regex"], ";".join(meta[s] for s in r["sourceLabels"]))
                   for r in relabelings if r["action"] == "keep")
        if endpoint["port"] in ports and keep:
            scraped.append(endpoint["port"])
    return scraped


def test_the_pod_monitor_scrapes_tritons_metrics_port_and_the_routers_metrics():
    """Cluster contract: the PodMonitor selects every serving Pod the
    operator builds (Triton per version, and the router in front), scrapes
    Triton on its metrics port and the router on its one port, never
    Triton's inference port, and its relabelings read labels the Pods carry."""
    versions = {"primary": (ModelVersion("fraud", "1", "s3://m/1"), 80),
                "canary": (ModelVersion("fraud", "2", "s3://m/2"), 20)}
    images = ServingImages(router="kubeloop/runtime:1")
    children = build_children(SERVING, _serving_spec(autoscaling={}), versions, CPU, images, {"routes": []})
    pods = {c["metadata"]["name"]: c["spec"]["template"] for c in children if c["kind"] == "Deployment"}
    monitor = next(d for d in render() if d["kind"] == "PodMonitor")["spec"]
    assert monitor["namespaceSelector"] == {"any": True}
    assert all(_selects(monitor["selector"], pod["metadata"]["labels"]) for pod in pods.values())
    assert {name: _scraped_ports(monitor, pod) for name, pod in pods.items()} == {
        "fraud-predictor": ["metrics"], "fraud-predictor-canary": ["metrics"], "fraud-router": ["http"]}
    watched = next(d for d in render(*RENDERINGS["namespaced"]) if d["kind"] == "PodMonitor")["spec"]
    assert watched["namespaceSelector"] == {"matchNames": ["ml-team-a", "ml-team-b"]}


def _stages(dockerfile: str) -> dict[str, dict]:
    """Each build stage's base and the last USER it sets."""
    stages: dict[str, dict] = {}
    current = None
    for line in dockerfile.splitlines():
        if m := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = m.group(2) or f"stage{len(stages)}"
            base = m.group(1)
            stages[current] = {"base": base, "user": stages.get(base, {}).get("user")}
        elif (m := re.match(r"USER\s+(\S+)", line)) and current:
            stages[current]["user"] = m.group(1)
    return stages


def test_the_images_use_pinned_bases_and_run_as_a_numeric_non_root_user():
    stages = _stages((ROOT / "images" / "Dockerfile").read_text())
    for name, stage in stages.items():
        base = stage["base"]
        if base in stages:
            continue
        # An exact version, never a floating tag.
        assert re.match(r"^[\w./-]+:\d+\.\d+\.\d+[\w.-]*(@sha256:[0-9a-f]{64})?$", base), (name, base)
    for target in ("operator", "runtime", "components", "training", "triton"):
        user = stages[target]["user"]
        assert user and re.match(r"^\d+(:\d+)?$", user) and int(user.split(":")[0]) != 0, (target, user)


def test_pools_reach_the_operator_as_sized_with_their_rules_in_the_releases_namespace_only():
    """Cluster path (chart): serving.pools becomes the operator's
    KUBELOOP_SERVING_POOLS (read by its settings as written) and a Role in
    the release's namespace with the pools' rules; without pools, no such
    Role and no variable."""
    from kubeloop.operator.settings import OperatorConfig

    wanted = operator_permissions()
    pools = {"shared": {"members": 2, "memoryMiB": 4096, "spreadAt": 3}}
    docs = render("--set-json", f"serving.pools={json.dumps(pools)}")
    env = {e["name"]: e.get("value") for e in _pod_specs(docs)[0]["containers"][0]["env"]}
    assert json.loads(env["KUBELOOP_SERVING_POOLS"]) == pools
    sized = OperatorConfig.from_env({"KUBELOOP_SERVING_POOLS": env["KUBELOOP_SERVING_POOLS"]}).serving_pools
    assert sized["shared"].members == 2 and sized["shared"].memory_mib == 4096 and sized["shared"].spread_at == 3
    assert _rules(docs, "Role")["kubeloop-system/kubeloop-pools"] == [r.policy() for r in wanted.pools]
    plain = render()
    assert "kubeloop-system/kubeloop-pools" not in _rules(plain, "Role")
    assert "KUBELOOP_SERVING_POOLS" not in {e["name"] for e in _pod_specs(plain)[0]["containers"][0]["env"]}


def test_the_charts_pool_sizes_are_the_operators():
    """values.schema.json refuses unknown keys of a pool: it must name every
    field the operator's KUBELOOP_SERVING_POOLS reads, and nothing else."""
    from kubeloop.serving.base import PoolSize

    schema = json.loads((CHART / "values.schema.json").read_text())
    pools = next(found for found in _walk(schema) if "pools" in found)["pools"]
    fields = {field.alias or name for name, field in PoolSize.model_fields.items()}
    assert set(pools["additionalProperties"]["properties"]) == fields


def _walk(node):  # noqa: ANN001, ANN202
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)


def test_the_charts_job_resources_reach_the_operator_as_its_setting():
    """Cluster (chart): jobResources becomes KUBELOOP_JOB_RESOURCES, which
    the operator reads as the chart wrote it (the defaults are the
    operator's own); values.schema.json names the same purposes and refuses
    a quantity Kubernetes would not take."""
    from kubeloop.api.jobs import JobResources
    from kubeloop.operator.settings import OperatorConfig

    def setting(*extra: str) -> JobResources:
        env = {e["name"]: e.get("value") for e in _pod_specs(render(*extra))[0]["containers"][0]["env"]}
        return OperatorConfig.from_env({"KUBELOOP_JOB_RESOURCES": env["KUBELOOP_JOB_RESOURCES"]}).job_resources

    assert setting() == JobResources()
    small = setting("--set", "jobResources.monitoring.requests.cpu=100m")
    assert small.monitoring.container() == {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert small.materialize == JobResources().materialize
    whole = setting("--set", "jobResources.materialize.requests.cpu=2")  # a number, as Kubernetes takes it
    assert whole.materialize.container()["requests"]["cpu"] == 2
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["jobResources"]
    assert set(schema["properties"]) == set(JobResources.model_fields)
    refused = helm("template", "kubeloop", str(CHART), "-f", str(CI_VALUES), "--set",
                   "jobResources.monitoring.requests.cpu=half", check=False)
    assert refused.returncode != 0 and "jobResources" in refused.stderr
