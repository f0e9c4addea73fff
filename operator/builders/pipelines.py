"""Pipeline run requests of TrainingJobs and OptimizedModels (pure)."""

from __future__ import annotations

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec
from kubeloop.api.children import content_hash, dns_name
from kubeloop.pipelines.backends.base import RunRequest


def spec_hash(spec: TrainingJobSpec | OptimizedModelSpec) -> str:
    """What identifies a spec's run: the same spec never trains twice, a changed one does."""
    return content_hash(spec.to_wire())


def run_name(ref: ObjectRef, digest: str) -> str:
    """Deterministic, so a restarted operator finds the run it started before;
    tied to the object's uid and generation, so a re-created object, or a spec
    reverted to an earlier one, never takes up (cancelled) runs of the past."""
    return dns_name(ref.namespace, ref.name, f"g{ref.generation}", content_hash([ref.uid, digest], 10))


def owner(ref: ObjectRef) -> str:
    """namespace/name: the pipeline tags each version it registers with it
    (kubeloop.owner), so the operator knows the versions an object made."""
    return f"{ref.namespace}/{ref.name}"


def _labels(ref: ObjectRef) -> dict[str, str]:
    return {"kubeloop.dev/owner-kind": ref.kind.lower(), "kubeloop.dev/owner-namespace": ref.namespace,
            "kubeloop.dev/owner-name": ref.name, "kubeloop.dev/owner-uid": ref.uid}


def build_training_run(ref: ObjectRef, spec: TrainingJobSpec, digest: str, feature_store: str = "") -> RunRequest:
    """The spec travels as JSON text (KubeModel.to_json), so the steps get
    spec.model.parameters with the types the manifest gave them. feature_store:
    the job's own store (StoreLocation JSON), empty for the operator's default
    repository."""
    return RunRequest(
        name=run_name(ref, digest), pipeline="training",
        arguments={"spec": spec.to_json(), "owner": owner(ref), "spec_hash": digest,
                   "feature_store": feature_store},
        labels=_labels(ref),
    )


def build_optimization_run(ref: ObjectRef, spec: OptimizedModelSpec, source_version: str,
                           digest: str) -> RunRequest:
    return RunRequest(
        name=run_name(ref, digest), pipeline="optimization",
        arguments={"spec": spec.to_json(), "source_version": source_version,
                   "owner": owner(ref), "spec_hash": digest},
        labels=_labels(ref),
    )
