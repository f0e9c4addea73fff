"""The TrainingJob and OptimizedModel a drift-triggered retrain creates (pure)."""

from __future__ import annotations

import hashlib

from kubeloop.api.constants import API_VERSION, LABEL_RETRAIN_OF
from kubeloop.api.promotion import PromotionPolicy
from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.api.times import iso, seconds
from kubeloop.api.children import child_metadata, dns_name

def retrain_name(ref: ObjectRef, alert: str) -> str:
    """One name per alert: a redelivered alert finds the job it started."""
    return dns_name(ref.name, "retrain", hashlib.sha256(alert.encode()).hexdigest()[:8])


def build_retrain_job(ref: ObjectRef, spec: InferenceServiceSpec, name: str, now: float) -> dict:
    retraining = spec.retraining
    template = retraining.template.to_wire()
    template["modelName"] = spec.model.name
    window = template.setdefault("features", {}).setdefault("window", {})
    window["end"] = iso(now)
    if retraining.lookback:
        window["start"] = iso(now - seconds(retraining.lookback))
    # Registered as challenger and gated by this service; it promotes after the canary.
    policy = retraining.promotion
    template["promotion"] = PromotionPolicy(register_as=policy.register_as, gates=policy.gates).to_wire()
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": child_metadata(ref, name, {LABEL_RETRAIN_OF: ref.name}),
        "spec": template,
    }


def build_retrain_optimization(ref: ObjectRef, spec: InferenceServiceSpec, name: str, source_version: str) -> dict:
    optimization = spec.retraining.optimization
    return {
        "apiVersion": API_VERSION,
        "kind": "OptimizedModel",
        "metadata": child_metadata(ref, name, {LABEL_RETRAIN_OF: ref.name}),
        "spec": {
            "source": {"name": spec.model.name, "version": source_version},
            "techniques": list(optimization.techniques),
            "accuracyBudget": optimization.accuracy_budget.to_wire(),
            "latencySLO": optimization.latency_slo.to_wire(),
            "batchSizes": sorted({1, 8, optimization.latency_slo.batch_size}),
            "registeredName": spec.model.name,
            "promotion": {"registerAs": spec.retraining.promotion.register_as},
        },
    }
