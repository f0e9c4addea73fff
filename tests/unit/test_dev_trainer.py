"""Kubeflow Trainer's and JobSet's install on the real node, as plain data
from their modules' manifests (the install itself is proven on the real
node: tests/e2e/test_real_node.py)."""

from __future__ import annotations

import re

import pytest

from kubeloop.dev import trainer
from kubeloop.dev.binaries import GROUPS, versions
from kubeloop.paths import repo_root
from tests.support.makefile import prebuild

CA = b"-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def modules():
    return trainer.trainer_module(), trainer.jobset_module()


def test_both_controllers_are_pinned_once_and_built_in_make_tests_prebuild():
    """tools/versions.env pins them; the tools module requires those versions
    (Trainer's release requires that JobSet); make test builds the group
    beside the unit tests and the training image after it."""
    group, key = GROUPS["trainer-controller-manager"]
    assert GROUPS["jobset"] == (group, key)
    gomod = (repo_root() / "tools" / group / "go.mod").read_text()
    assert re.search(rf"^\tgithub\.com/kubeflow/trainer/v2 {re.escape(versions()[key])}$", gomod, re.M)
    assert re.search(rf"^\tsigs\.k8s\.io/jobset {re.escape(versions()['JOBSET_VERSION'])}$", gomod, re.M)
    assert f" {group}" in prebuild().split(";")[0] and "training" in prebuild()


def test_jobsets_pod_webhooks_admit_only_jobset_pods(modules):
    """failurePolicy Fail on every Pod would stop the cluster whenever JobSet's
    manager is down; its release manifests select JobSet's own Pods."""
    configurations = trainer.jobset_webhooks(modules[1], CA)
    hooks = [h for c in configurations for h in c["webhooks"]]
    pod_hooks = [h for h in hooks if h["rules"][0]["resources"] == ["pods"]]
    assert len(pod_hooks) == 2
    assert all(h["objectSelector"]["matchExpressions"][0]["key"] == trainer.JOBSET_POD_LABEL for h in pod_hooks)
    assert all(h["clientConfig"]["service"] == {"name": trainer.JOBSET_SERVICE, "namespace": trainer.NAMESPACE,
                                                "path": h["clientConfig"]["service"]["path"]} for h in hooks)
    assert all(c["metadata"]["name"].startswith("jobset-") for c in configurations)


def test_trainers_webhooks_trust_the_installs_ca_and_reach_its_service(modules):
    configurations = trainer.trainer_webhooks(modules[0], CA)
    assert {c["metadata"]["name"] for c in configurations} == {"defaulter.trainer.kubeflow.org",
                                                               "validator.trainer.kubeflow.org"}
    hooks = [h for c in configurations for h in c["webhooks"]]
    assert {h["clientConfig"]["service"]["name"] for h in hooks} == {trainer.TRAINER}
    assert all(h["clientConfig"]["caBundle"] for h in hooks)


@pytest.mark.parametrize("objects", ["jobset_objects", "trainer_objects"])
def test_each_manager_runs_restricted_with_its_own_rotation_and_election_off(modules, objects):
    module = modules[1] if objects == "jobset_objects" else modules[0]
    found = {o["kind"]: o for o in getattr(trainer, objects)(module, "img:1", b"cert", b"key")}
    config = found["ConfigMap"]["data"]["config.yaml"]
    assert "leaderElect: false" in config and "enable: false" in config and "bindAddress: '0'" in config
    pod = found["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert found["ClusterRoleBinding"]["subjects"][0]["name"] == pod["serviceAccountName"]
    assert found["ClusterRole"]["rules"]


def test_crds_are_jobsets_and_trainers(modules):
    names = {c["metadata"]["name"] for c in trainer.crds(*modules)}
    assert names == {"jobsets.jobset.x-k8s.io", "trainjobs.trainer.kubeflow.org",
                     "trainingruntimes.trainer.kubeflow.org", "clustertrainingruntimes.trainer.kubeflow.org"}
