"""Judged by outcomes, unattended, on the local backend's real parts: Feast,
torch, MLflow, Triton, the front, Prometheus, Alertmanager and the
operator, with callers' labels arriving late. The hops are `kubeloop demo
--story outcomes`'s (kubeloop.story.outcomes): concept drift that data
drift does not see, the live AUC falling, KubeloopConceptDrift, the retrain
rolled out step by step on live metrics and promoted, and a worse
challenger aborted at its first step. (Local backend: the cluster path's
rollouts are tests/e2e/test_real_node.py's.)"""

from __future__ import annotations

import pytest

from kubeloop.api.times import epoch
from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail
from kubeloop.story.outcomes import OutcomeLoop, outcome_docs
from tests.support.stories import story_inputs, timed_steps

pytestmark = pytest.mark.e2e


@pytest.fixture
def story(platform, kube, namespace, start_operator, tmp_path):
    env, repo, docs = story_inputs(platform, namespace, start_operator, tmp_path)
    labels = tmp_path / "labels"
    loop = OutcomeLoop(kube, MlflowRegistry(env["MLFLOW_TRACKING_URI"]), env,
                       outcome_docs(docs, labels, OutcomeLoop.outcome_timings), repo, scale=2.0, labels_dir=labels)
    yield loop
    loop.stop()


@pytest.mark.timeout(2400)  # the story's own waits (scaled for slow machines) should speak first
def test_concept_drift_is_caught_by_outcomes_retrained_rolled_out_and_a_worse_challenger_aborted(story):
    for _ in timed_steps(story):
        pass
    facts = story.facts

    # The inputs stayed put while the labels moved, and the outcomes said so.
    held, fell = facts["baseline_performance"], facts["decayed_performance"]
    assert not held["decayed"] and fell["decayed"]
    before = next(v for v in held["versions"] if v["role"] == "primary")
    after = next(v for v in fell["versions"] if v["role"] == "primary")
    assert after["high"] < before["low"], "the live AUC fell with confidence"
    assert facts["concept_drift_share"] < story.service["spec"]["monitoring"].get("driftShareThreshold", 0.3)
    assert fell["labels"]["matched"] > 0 and sum(fell["labels"].values()) >= fell["labels"]["matched"]

    # The concept-drift alert came after the quality fell, and started the retrain.
    job = facts["retrain_job"]
    assert epoch(facts["alert"]["startsAt"]) <= epoch(job["metadata"]["creationTimestamp"])

    # The retrain's rollout went through every step and was promoted on its analysis.
    rollout = facts["rollout"]
    assert rollout["phase"] == "Promoted" and rollout["challenger"] == facts["challenger"]
    assert facts["promotion"].previous == facts["serving"]

    # Yesterday's model: aborted at the first step, on the same labelled requests, the alias kept.
    aborted = facts["aborted"]
    assert aborted["phase"] == "Aborted" and aborted["step"] == 0 and aborted["weight"] == 0
    assert aborted["analysis"]["verdict"] == "Fail"
    assert story.champion() == facts["challenger"]
    trail = [e for e in audit_trail(story.registry, story.model) if e.version == facts["serving"]]
    assert [e.action for e in trail] == ["promote", "reject"], trail  # trained and promoted once; rejected now
    assert "aborted at step 1" in trail[-1].reason
    condition = next(c for c in story.status("InferenceService")["conditions"] if c["type"] == "RolloutHealthy")
    assert condition["status"] == "False" and condition["reason"] == "Aborted"
