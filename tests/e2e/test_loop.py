"""The loop, unattended, on the real parts: Feast, torch, MLflow, Triton,
Evidently, Prometheus, Alertmanager and the operator. The hops are the demo's
(kubeloop.story.loop); this test runs them and then checks their order, the
alert handling's idempotency and cooldown, and that a failed gate leaves the
champion serving."""

from __future__ import annotations

import re
import time

import pytest
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION, LABEL_RETRAIN_OF
from kubeloop.api.times import epoch, instant
from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.story.loop import Loop, wait_until

from tests.support.alerts import post_alert
from tests.support.forked import ForkLog
from tests.support.stories import story_inputs, timed_steps

pytestmark = pytest.mark.e2e


@pytest.fixture
def loop(platform, kube, namespace, start_operator, tmp_path):
    env, repo, docs = story_inputs(platform, namespace, start_operator, tmp_path)
    story = Loop(kube, MlflowRegistry(env["MLFLOW_TRACKING_URI"]), env, docs, repo, scale=2.0, entities=True)
    story.webhook = f"http://127.0.0.1:{env['KUBELOOP_WEBHOOK_PORT']}/hooks/alertmanager"
    story.token = open(env["KUBELOOP_WEBHOOK_TOKEN_FILE"]).read().strip()
    yield story
    story.stop()


def retrain_jobs(story: Loop) -> list[str]:
    return sorted(j["metadata"]["name"] for j in story.kube.list(
        API_VERSION, "TrainingJob", story.namespace, f"{LABEL_RETRAIN_OF}={story.service['metadata']['name']}"))


@pytest.mark.timeout(1800)  # the story's own waits (scaled for slow machines) should speak first
def test_drift_retrains_gates_canaries_and_promotes(loop, platform):
    fork_log = ForkLog(platform.dir)
    for _ in timed_steps(loop):
        pass
    facts = loop.facts
    # Local path: the steps and the drift checks were forked from the
    # platform's warm interpreter, and ended well there.
    forked = fork_log.since()
    assert len(re.findall(r"kfp.dsl.executor_main \(pid \d+\) exited with 0\n", forked)) >= 8, forked
    assert re.search(r"kubeloop.monitoring.job \(pid \d+\) exited with 0\n", forked), forked

    # Each hop happened after the one before it.
    alert, job = facts["alert"], facts["retrain_job"]
    assert job["metadata"]["labels"][LABEL_RETRAIN_OF] == loop.service["metadata"]["name"]
    assert epoch(alert["startsAt"]) <= epoch(job["metadata"]["creationTimestamp"])
    challenger = loop.registry.get_version(loop.model, facts["challenger"])
    assert int(challenger.version) > int(facts["serving"])
    assert challenger.tags["kubeloop.owner"].endswith(f"/{job['metadata']['name']}-opt")
    registered = MlflowClient(loop.urls["MLFLOW_TRACKING_URI"]).get_model_version(
        loop.model, challenger.version).creation_timestamp / 1000
    assert epoch(job["metadata"]["creationTimestamp"]) <= registered <= epoch(facts["promotion"].at) + 1
    assert facts["promotion"].previous == facts["serving"]
    # The gate compared both versions on the retrain's own hold-out.
    assert float(challenger.tags["metric.auc"]) >= float(challenger.tags["gate.champion.auc"]) - 0.005
    print(f"drift injection -> promoted and serving: {facts['injection_to_promoted']:.0f} s")

    # Alertmanager redelivers the same alert, then a second drift alert
    # comes inside the cooldown. The second one set aside is the sign that
    # the operator has handled both: the redelivery started nothing new.
    before = loop.status("InferenceService")
    assert post_alert(loop.webhook, loop.token, alert).status_code == 200
    second = {**alert, "fingerprint": "0" * 16, "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    assert post_alert(loop.webhook, loop.token, second).json() == {"recorded": 1}
    suppressed = wait_until(lambda: next((c for c in loop.status("InferenceService").get("conditions", [])
                                          if c["type"] == "RetrainSuppressed" and c["reason"] == "Suppressed"
                                          and second["fingerprint"] in c["message"]), None),
                            30, "the second alert set aside")
    assert "cooling down" in suppressed["message"]
    assert retrain_jobs(loop) == [job["metadata"]["name"]]
    after = loop.status("InferenceService")
    assert after.get("retrains") == before.get("retrains")
    assert after["handledAlerts"].count(f"{alert['fingerprint']}@{instant(alert['startsAt'])}") == 1

    # A version that fails its gate is not promoted: the champion keeps serving.
    champion = loop.champion()
    strict = {**loop.by_kind["TrainingJob"], "metadata": {"name": "strict", "namespace": loop.namespace}}
    strict["spec"] = {**strict["spec"], "hyperparameters": {"epochs": 1, "batchSize": 512},
                      "features": {**strict["spec"]["features"], "window": {"start": job["spec"]["features"]["window"]["start"]}},
                      "promotion": {"registerAs": "challenger", "promoteTo": "champion",
                                    "gates": {"metrics": [{"metric": "auc", "min": 0.999}]}}}
    loop.kube.apply(strict, field_manager="test")
    status = loop._finished("TrainingJob", "strict")
    promoted = next(c for c in status["conditions"] if c["type"] == "Promoted")
    assert promoted["status"] == "False" and promoted["reason"] == "GateFailed" and "FAIL" in promoted["message"]
    assert loop.champion() == champion
    # The alias did not move, so the service has nothing to follow: the
    # answers that come after the failed gate are all the champion's.
    loop.traffic.use(*loop.traffic_rows_now())
    wait_until(lambda: sum(loop.traffic.recent_versions().values()) >= 50, 30, "answers")
    assert set(loop.traffic.recent_versions()) == {champion}
    assert loop.status("InferenceService")["modelVersion"] == champion
