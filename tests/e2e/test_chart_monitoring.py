"""The chart's Prometheus Operator objects (PrometheusRule, ServiceMonitor,
PodMonitor) under the real schemas.

Backend proven: the cluster path's API server (the live control plane of
tests/conftest.py) with the Prometheus Operator v0.93 CRDs installed, taken
from its Go module zip by tools/fetch-crds.sh. The API server validates what
the chart renders against those CRDs' OpenAPI schemas, stores it and serves
it back; it rejects objects that break the schemas. No Prometheus Operator
controller runs here, so nothing turns these objects into a Prometheus
configuration or scrapes a Pod: what they select is the contract of
tests/unit/test_chart.py, and the stored rule groups are checked by
promtool, Prometheus' own checker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kubeloop.dev.binaries import binary, versions
from tests.support.promtool import check_rules

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeloop"
GROUP = "monitoring.coreos.com"
PLURALS = {"PrometheusRule": "prometheusrules", "ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors"}


@pytest.fixture(scope="module")
def monitoring_crds(kubectl):
    """The Prometheus Operator's CRDs for the chart's kinds, installed (and
    left installed: cluster-wide, and harmless to the other tests)."""
    fetched = subprocess.run([str(ROOT / "tools" / "fetch-crds.sh")], capture_output=True, text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    kubectl("apply", "--server-side", "--field-manager=kubeloop-tests", "-f", fetched.stdout.strip())
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{plural}.{GROUP}" for plural in PLURALS.values()))


def rendered_monitors(namespace: str) -> list[dict]:
    """The chart's Prometheus Operator objects, monitoring switched on (the
    lint values switch every optional part on), in the given namespace."""
    result = subprocess.run([str(binary("helm")), "template", "kubeloop", str(CHART), "--namespace", namespace,
                             "--kube-version", versions()["KUBERNETES_VERSION"],
                             "-f", str(CHART / "ci" / "lint-values.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d and d["apiVersion"].startswith(f"{GROUP}/")]


def test_the_charts_monitors_are_stored_and_served_back_under_the_real_crds(monitoring_crds, kubectl, namespace,
                                                                           tmp_path):
    docs = rendered_monitors(namespace)
    assert sorted(d["kind"] for d in docs) == sorted(PLURALS)
    # Created (not a dry run), with unknown fields an error rather than pruned.
    kubectl("create", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(docs))
    stored = json.loads(kubectl("get", "-f", "-", "-o", "json", input=yaml.safe_dump_all(docs)).stdout)["items"]
    assert {(s["kind"], s["metadata"]["name"]): s["spec"] for s in stored} == \
        {(d["kind"], d["metadata"]["name"]): d["spec"] for d in docs}
    rule = next(s for s in stored if s["kind"] == "PrometheusRule")
    checked = check_rules(rule["spec"]["groups"], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def _for_as_a_number(doc: dict) -> None:
    doc["spec"]["groups"][0]["rules"][0]["for"] = 30


def _interval_in_words(doc: dict) -> None:
    doc["spec"]["endpoints"][0]["interval"] = "30 seconds"


def _misspelt_port(doc: dict) -> None:
    endpoint = doc["spec"]["podMetricsEndpoints"][0]
    endpoint["prot"] = endpoint.pop("port")


@pytest.mark.parametrize("kind, breakage, error", [
    ("PrometheusRule", _for_as_a_number, "spec.groups[0].rules[0].for in body must be of type string"),
    ("ServiceMonitor", _interval_in_words, "spec.endpoints[0].interval in body should match"),
    ("PodMonitor", _misspelt_port, 'unknown field "spec.podMetricsEndpoints[0].prot"'),
], ids=["rule-for-not-a-string", "interval-not-a-duration", "unknown-field"])
def test_a_monitor_that_breaks_the_schema_is_refused(monitoring_crds, kubectl, namespace, kind, breakage, error):
    doc = next(d for d in rendered_monitors(namespace) if d["kind"] == kind)
    breakage(doc)
    refused = kubectl("create", "--validate=strict", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert refused.returncode != 0 and error in refused.stderr, refused.stderr
    missing = kubectl("get", f"{PLURALS[kind]}.{GROUP}", doc["metadata"]["name"], "-n", namespace, check=False)
    assert "NotFound" in missing.stderr
