"""Kubeflow Trainer on the local platform's real node, installed as its own
manifests install it: the JobSet controller and Trainer's controller manager
(both built from Go modules, tools/trainer) run as Pods in
`kubeflow-system`; their CRDs, RBAC and webhooks come from the same modules'
zips. Both managers' own certificate rotation is turned off: their webhooks
get a self-signed serving certificate, as KServe's do. kubeloop's own
`ClusterTrainingRuntime` (`kubeloop-training`: the dataset initializer and
the torch nodes of the trainer backend's and the kfp backend's TrainJobs)
runs kubeloop's training image."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubeloop.components.trainjob import build_training_runtime
from kubeloop.dev import controllers
from kubeloop.dev.binaries import versions
from kubeloop.dev.controllers import CERT_DIR, FIELD_MANAGER, PROBE_PORT, WEBHOOK_PORT
from kubeloop.dev.pki import webhook_certificates

NAMESPACE = "kubeflow-system"
TRAINER = "kubeflow-trainer-controller-manager"
JOBSET = "jobset-controller-manager"
JOBSET_SERVICE = "jobset-webhook-service"
CONFIG_PATH = "/etc/manager"
JOBSET_POD_LABEL = "jobset.sigs.k8s.io/jobset-name"


class TrainerError(RuntimeError):
    """Trainer or JobSet could not be installed; the message says what their managers reported."""


def trainer_module() -> Path:
    return controllers.module_dir("github.com/kubeflow/trainer/v2", versions()["TRAINER_VERSION"], "trainer")


def jobset_module() -> Path:
    return controllers.module_dir("sigs.k8s.io/jobset", versions()["JOBSET_VERSION"], "trainer")


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _config_map(name: str, configuration: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {"config.yaml": yaml.safe_dump(configuration)}}


def _manager(name: str, role: dict, image: str, configuration: dict, service: str, cert: bytes, key: bytes
             ) -> list[dict]:
    """A manager's identity, permissions, configuration, certificate,
    Deployment and webhook Service. Its configuration has no leader election
    (one replica), no metrics listener and no certificate rotation of its own."""
    secret = f"{name}-webhook-cert"
    volumes = {CERT_DIR: {"secret": {"secretName": secret}}, CONFIG_PATH: {"configMap": {"name": f"{name}-config"}}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}},
        *controllers.cluster_role_for(role, name, name, NAMESPACE),
        _config_map(f"{name}-config", configuration),
        controllers.tls_secret(secret, NAMESPACE, cert, key),
        controllers.manager_deployment(name, NAMESPACE, image, [f"--config={CONFIG_PATH}/config.yaml"], volumes),
        controllers.webhook_service(service, NAMESPACE, name),
    ]


def _common_configuration() -> dict:
    return {"health": {"healthProbeBindAddress": f":{PROBE_PORT}"}, "metrics": {"bindAddress": "0"},
            "webhook": {"port": WEBHOOK_PORT}, "leaderElection": {"leaderElect": False}}


def jobset_objects(module: Path, image: str, cert: bytes, key: bytes) -> list[dict]:
    configuration = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
                     **_common_configuration(), "internalCertManagement": {"enable": False}}
    role = yaml.safe_load((module / "config" / "components" / "rbac" / "role.yaml").read_text())
    return _manager(JOBSET, role, image, configuration, JOBSET_SERVICE, cert, key)


def trainer_objects(module: Path, image: str, cert: bytes, key: bytes) -> list[dict]:
    configuration = {"apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
                     **_common_configuration(), "certManagement": {"enable": False}}
    role = yaml.safe_load((module / "manifests" / "base" / "rbac" / "role.yaml").read_text())
    return _manager(TRAINER, role, image, configuration, TRAINER, cert, key)


def crds(trainer: Path, jobset: Path) -> list[dict]:
    """JobSet's CRD (one served version, so no conversion webhook) and Trainer's."""
    paths = [jobset / "config" / "components" / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml",
             *sorted((trainer / "manifests" / "base" / "crds").glob("trainer.kubeflow.org_*.yaml"))]
    return [doc for path in paths for doc in _documents(path)]


def jobset_webhooks(module: Path, ca: bytes) -> list[dict]:
    """JobSet's webhooks; the Pod ones only for JobSet's own Pods, as its
    release manifests patch them (every other Pod is admitted without it)."""
    docs = _documents(module / "config" / "components" / "webhook" / "manifests.yaml")
    for doc in docs:
        doc["metadata"]["name"] = f"jobset-{doc['metadata']['name']}"
        for hook in doc["webhooks"]:
            if hook["rules"][0]["resources"] == ["pods"]:
                hook["objectSelector"] = {"matchExpressions": [{"key": JOBSET_POD_LABEL, "operator": "Exists"}]}
    return [c for c in (controllers.webhooks_to(doc, JOBSET_SERVICE, NAMESPACE, ca) for doc in docs) if c]


def trainer_webhooks(module: Path, ca: bytes) -> list[dict]:
    docs = _documents(module / "manifests" / "base" / "webhook" / "manifests.yaml")
    names = {"MutatingWebhookConfiguration": "defaulter", "ValidatingWebhookConfiguration": "validator"}
    for doc in docs:
        doc["metadata"]["name"] = f"{names[doc['kind']]}.trainer.kubeflow.org"
    return [c for c in (controllers.webhooks_to(doc, TRAINER, NAMESPACE, ca) for doc in docs) if c]


def install(platform, training_image: str, progress=lambda _: None) -> None:  # noqa: ANN001 - a Platform
    """Install JobSet and Trainer onto the platform's real node, wait until
    both managers answer admission requests, and apply kubeloop's runtime on
    training_image (idempotent)."""
    trainer, jobset = trainer_module(), jobset_module()
    version = versions()["TRAINER_VERSION"]
    images = {name: controllers.binary_image(name, name, version, progress)
              for name in ("trainer-controller-manager", "jobset")}
    for image in images.values():
        platform.import_image(image)
    pki = {name: webhook_certificates(platform.dir / f"{name}-pki", [f"{service}.{NAMESPACE}.svc"])
           for name, service in ((JOBSET, JOBSET_SERVICE), (TRAINER, TRAINER))}
    kube = platform.kube()
    try:
        names = [kube.apply(crd, field_manager=FIELD_MANAGER)["metadata"]["name"] for crd in crds(trainer, jobset)]
        controllers.wait_established(kube, names, "Trainer and JobSet", TrainerError)
        kube.apply(controllers.restricted_namespace(NAMESPACE), field_manager=FIELD_MANAGER)
        objects = [*jobset_objects(jobset, images["jobset"].ref, *pki[JOBSET][1:]),
                   *trainer_objects(trainer, images["trainer-controller-manager"].ref, *pki[TRAINER][1:])]
        for obj in objects:
            kube.apply(obj, field_manager=FIELD_MANAGER)
        progress("waiting for JobSet's and Trainer's controller managers")
        for name in (JOBSET, TRAINER):
            controllers.wait_ready(kube, name, NAMESPACE, TrainerError)
        for obj in [*jobset_webhooks(jobset, pki[JOBSET][0]), *trainer_webhooks(trainer, pki[TRAINER][0])]:
            kube.apply(obj, field_manager=FIELD_MANAGER)
        kube.apply(build_training_runtime(training_image), field_manager=FIELD_MANAGER)
    finally:
        kube.close()
