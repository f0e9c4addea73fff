"""The API permissions the operator needs, derived from what its code touches.

The Helm chart's Roles are generated from this module (`kubeloop rbac`), and
an end-to-end test runs the operator with nothing but the chart's
ServiceAccount token, so a request added to the code without a rule here
fails there, and a rule kept here that nothing uses shows up in the audit
comparison.

Rules come in two scopes. Namespaced rules cover the objects the operator
reconciles and the children it owns; the chart grants them cluster-wide or
only in the watched namespaces. Cluster rules are the read-only fleet view
the GPU placement needs: every node, and the GPU requests of every Pod on
them, whichever namespace they run in.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeloop.api.constants import GROUP
from kubeloop.api.resources import INFERENCE_SERVICE, KINDS, OPTIMIZED_MODEL, TRAINING_JOB
from kubeloop.kube import resource_type
from kubeloop.serving.cluster import CLAIM_TEMPLATES, OWNED
from kubeloop.serving.kubernetes import ROUTES

# Server-side apply creates an object that is missing, which RBAC authorises
# as create as well as patch.
APPLY = ("create", "patch")


@dataclass(frozen=True)
class Rule:
    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def policy(self) -> dict:
        """The rule as a Role's PolicyRule."""
        return {"apiGroups": [self.api_group], "resources": list(self.resources), "verbs": list(self.verbs)}


@dataclass(frozen=True)
class Permissions:
    namespaced: tuple[Rule, ...]
    cluster: tuple[Rule, ...]
    gateway: tuple[Rule, ...]
    """Namespaced rules needed only when canaries split traffic through a Gateway (KUBELOOP_GATEWAY)."""
    kserve: tuple[Rule, ...]
    """Namespaced rules of the kserve serving backend."""
    kserve_cluster: tuple[Rule, ...]
    """Cluster rules of the kserve serving backend."""
    dra: tuple[Rule, ...]
    """Namespaced rules needed only when GPUs are claimed through DRA (KUBELOOP_GPU_ALLOCATION=dra)."""
    dra_cluster: tuple[Rule, ...]
    """Cluster rules needed only with DRA: the fleet's partitionable devices and what claims hold."""
    materialize: tuple[Rule, ...]
    """Rules in the operator's own namespace, needed only when online stores
    are materialised by Jobs (KUBELOOP_MATERIALIZER=kubernetes)."""
    trainer: tuple[Rule, ...]
    """Namespaced rules of the trainer pipeline backend (a TrainJob per training run)."""
    pools: tuple[Rule, ...]
    """Rules in the operator's own namespace, needed only with pools on the
    kubernetes backend (KUBELOOP_SERVING_POOLS): each pool's Pod, Service
    and ConfigMaps run there, owned by no InferenceService."""

    def to_wire(self) -> dict:
        return {scope: [r.policy() for r in rules]
                for scope, rules in (("namespaced", self.namespaced), ("cluster", self.cluster),
                                     ("gateway", self.gateway), ("kserve", self.kserve),
                                     ("kserveCluster", self.kserve_cluster), ("dra", self.dra),
                                     ("draCluster", self.dra_cluster), ("materialize", self.materialize),
                                     ("trainer", self.trainer), ("pools", self.pools))}


def _group_and_plural(api_version: str, kind: str) -> tuple[str, str]:
    rtype = resource_type(api_version, kind)
    return (rtype.api_version.rpartition("/")[0], rtype.plural)


def _owned(kinds: tuple[tuple[str, str], ...], verbs: tuple[str, ...], why: str) -> tuple[Rule, ...]:
    return tuple(Rule(group, (plural,), verbs, why) for group, plural in
                 (_group_and_plural(api_version, kind) for api_version, kind in kinds))


def operator_permissions() -> Permissions:
    """Everything the operator's requests need, and nothing more."""
    # kopf watches each kind and patches finalizers and progress annotations;
    # each reconcile reads the latest object and writes its status; retraining
    # applies TrainingJobs and OptimizedModels; the Alertmanager webhook
    # annotates InferenceServices.
    namespaced = (
        Rule(GROUP, (TRAINING_JOB.plural, OPTIMIZED_MODEL.plural), ("get", "list", "watch", "create", "patch"),
             "reconcile; retraining creates the TrainingJob and OptimizedModel of a new version"),
        Rule(GROUP, (INFERENCE_SERVICE.plural,), ("get", "list", "watch", "patch"),
             "reconcile; the alert webhook records alerts on the InferenceService"),
        Rule(GROUP, tuple(f"{k.plural}/status" for k in KINDS), ("patch",), "status and conditions"),
        Rule("", ("events",), ("create",), "events on the reconciled objects"),
        *_owned(OWNED, ("get", "list", "delete", *APPLY),
                "serving: the Triton Deployments, Services and HPA an InferenceService owns (read back: "
                "a rollout's progress, and whether a child is still as last applied)"),
        Rule("", ("configmaps",), ("get",), "training: the feature_store.yaml a TrainingJob names"),
        Rule("batch", ("jobs",), ("list", "create", "delete"),
             "drift: each check is a Job in the InferenceService's namespace (KUBELOOP_DRIFT_MONITOR=kubernetes)"),
    )
    cluster = (
        Rule("", ("nodes",), ("list", "watch"), "GPU placement: the fleet's GPUs, MIG and MPS slices (watched)"),
        Rule("", ("pods",), ("list", "watch"), "GPU placement: what each node's Pods already hold (watched)"),
    )
    gateway = _owned((ROUTES,), ("get", "list", "delete", *APPLY), "canary traffic split by HTTPRoute weights")
    kserve = (
        Rule("serving.kserve.io", ("inferenceservices",), ("get", "list", "delete", *APPLY),
             "kserve serving: a KServe InferenceService per served version, and its readiness"),
        Rule("serving.kserve.io", ("servingruntimes",), ("get", *APPLY),
             "kserve serving: kubeloop's Triton ServingRuntime"),
    )
    kserve_cluster = (Rule("serving.kserve.io", ("clusterstoragecontainers",), APPLY,
                           "kserve serving: the storage initializer for models:/ URIs"),)
    dra = _owned((CLAIM_TEMPLATES,), ("get", "list", "delete", *APPLY),
                 "serving: the GPU claim templates of the Pods (DRA)")
    dra_cluster = (
        Rule("resource.k8s.io", ("resourceslices",), ("list", "watch"),
             "GPU placement (DRA): the partitionable GPUs NVIDIA's DRA driver publishes"),
        Rule("resource.k8s.io", ("resourceclaims",), ("list", "watch"),
             "GPU placement (DRA): the devices every namespace's claims hold"),
    )
    # The Pods' termination messages are read through the cluster rule on Pods.
    materialize = (Rule("batch", ("jobs",), ("get", "list", "create", "delete"),
                        "online stores: each materialisation is a Job in the operator's namespace, polled until "
                        "it finishes; older ones deleted"),)
    trainer = (Rule("trainer.kubeflow.org", ("trainjobs",), ("get", "create", "delete"),
                    "trainer pipeline backend: a TrainJob per training run, read until it finishes; deleted when "
                    "its spec changed or its TrainingJob was deleted"),
               Rule("batch", ("jobs",), ("get", "create", "delete"),
                    "trainer pipeline backend: a Job per optimisation run, read until it finishes; deleted when "
                    "its spec changed or its OptimizedModel was deleted"),
               Rule("", ("events",), ("list",), "trainer pipeline backend: why a TrainJob or Job runs nothing yet "
                                                "(Trainer and the Job controller say so only in Events)"))
    pools = (Rule("apps", ("deployments",), ("get", "delete", *APPLY), "pools: each pool's Pods (a Deployment)"),
             Rule("", ("services", "configmaps"), ("list", "delete", *APPLY),
                  "pools: each pool's Service, its config, and its routes (a key per pooled InferenceService)"),
             Rule("", ("pods/proxy",), ("get",),
                  "pools: whether each pool Pod's front answers a pooled InferenceService's model ready"))
    return Permissions(namespaced=namespaced, cluster=cluster, gateway=gateway, kserve=kserve,
                       kserve_cluster=kserve_cluster, dra=dra, dra_cluster=dra_cluster, materialize=materialize,
                       trainer=trainer, pools=pools)
