"""The trainer pipeline backend: a TrainingJob's run as one Kubeflow Trainer
TrainJob, an OptimizedModel's as one Job (the builders, pure, and the
backend against an in-memory API; the real controllers are the real-node
e2e test's)."""

from __future__ import annotations

import json

import pytest

from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainer_run import OPTIMIZATION_ENV, RUN_ENV, STORE_ENV, OptimizationRun, TrainerRun
from kubeloop.operator.builders.pipelines import build_optimization_run, build_training_run
from kubeloop.pipelines.backends.base import BackendUnavailable
from kubeloop.components.trainer_run import DATA_WRONG_EXIT, NO_STORE
from kubeloop.pipelines.backends.trainer import TrainerBackend
from kubeloop.pipelines.optimization_jobs import build_optimization_job, is_optimization_job
from kubeloop.components.trainjob import (INITIALIZER, NAME_LIMIT, RUN_ANNOTATION, TRAINING_RUNTIME, TrainerSettings,
                                          build_training_runtime, trainjob_name)
from kubeloop.pipelines.trainjobs import build_pipeline_trainjob
from tests.unit.fakes import FakeObjects

SETTINGS = TrainerSettings(image="reg/training:1", tracking_uri="http://mlflow.ml:5000", object_store_secret="store",
                           object_store_endpoint="http://10.0.0.1:8333", mlflow_secret="mlflow", git_sha="abc")
REF = ObjectRef("TrainingJob", "team-a", "fraud", uid="u-1", generation=3)


def spec(**fields) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({
        "modelName": "fraud", "distributed": {"nodes": 2},
        "features": {"featureViews": ["card_stats"], "labels": {"source": "transactions", "column": "is_fraud"},
                     "store": {"configMap": {"name": "feast-client"}}},
        "model": {"factory": "team.nets:make", "parameters": {"width": 96}}, **fields})


def request(job: TrainingJobSpec | None = None):  # noqa: ANN201 - RunRequest
    return build_training_run(REF, job or spec(), "d1g35t")


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_the_runtime_runs_the_dataset_initializer_before_the_nodes_restricted():
    jobs = build_training_runtime("reg/training:1")["spec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == [INITIALIZER, "node"]
    assert jobs[1]["dependsOn"] == [{"name": INITIALIZER, "status": "Complete"}]
    initializer = jobs[0]["template"]["spec"]["template"]["spec"]
    assert initializer["containers"][0]["name"] == INITIALIZER  # the container Trainer gives the dataset's settings
    assert initializer["containers"][0]["command"][-1] == "kubeloop.components.initializer"
    # Trainer admits the runtime only with this volume in the initializer
    assert initializer["containers"][0]["volumeMounts"][0]["name"] == "initializer"
    assert initializer["volumes"] == [{"name": "initializer", "emptyDir": {}}]
    for job in jobs:
        pod = job["template"]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the run says why


def test_a_lost_node_restarts_every_job_but_bad_data_fails_the_run():
    """backoffLimit 0: a deleted or failed node Pod fails its Job at once, and
    JobSet starts the whole set again (every node resumes from the published
    checkpoint). An initializer whose data is wrong fails its Job, and so the
    JobSet, at once; one that crashed or was killed is tried again in a new
    Pod (restarted in place, its first restart failed the Job), and an
    evicted one does not count."""
    template = build_training_runtime("reg/training:1")["spec"]["template"]["spec"]
    initializer, node = template["replicatedJobs"]
    assert node["template"]["spec"]["backoffLimit"] == 0
    job = initializer["template"]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never" and job["backoffLimit"] >= 2
    assert job["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": INITIALIZER, "operator": "In", "values": [DATA_WRONG_EXIT]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    policy = template["failurePolicy"]
    assert policy["maxRestarts"] >= 1
    assert policy["rules"] == [{"name": "dataNotPrepared", "action": "FailJobSet", "targetReplicatedJobs": [INITIALIZER]}]


def test_a_run_becomes_one_trainjob_owned_by_its_trainingjob():
    job = build_pipeline_trainjob(request(), spec(), SETTINGS)
    meta = job["metadata"]
    assert meta["namespace"] == "team-a" and len(meta["name"]) <= NAME_LIMIT and meta["name"][0].isalpha()
    assert meta["ownerReferences"] == [{"apiVersion": "kubeloop.dev/v1alpha1", "kind": "TrainingJob", "name": "fraud",
                                        "uid": "u-1", "controller": True}]
    assert job["spec"]["runtimeRef"] == {"name": TRAINING_RUNTIME}
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["image"], trainer["command"][-1]) == (2, "reg/training:1", "--trainer-run")


def test_the_pods_read_the_run_with_the_types_the_manifest_gave():
    job = build_pipeline_trainjob(request(), spec(), SETTINGS)
    run = TrainerRun.from_json(env_of(job["spec"]["trainer"])[RUN_ENV]["value"])
    assert TrainingJobSpec.from_json(run.spec).model.parameters == {"width": 96}  # an int, not 96.0
    assert run.pipeline_run == request().name and run.owner == "team-a/fraud" and run.git_sha == "abc"
    assert run.trainjob == f"team-a/{job['metadata']['name']}"
    assert job["spec"]["initializer"]["dataset"]["storageUri"] == run.data == f"{run.prefix}/data"
    assert run.prefix == f"s3://training/team-a/{request().name}"


def test_the_store_and_every_credential_travel_by_reference():
    job = build_pipeline_trainjob(request(), spec(), SETTINGS)
    initializer = env_of(job["spec"]["initializer"]["dataset"])
    assert initializer[STORE_ENV]["valueFrom"] == {"configMapKeyRef": {"name": "feast-client",
                                                                       "key": "feature_store.yaml"}}
    nodes = env_of(job["spec"]["trainer"])
    assert STORE_ENV not in nodes  # only the initializer reads Feast
    for env in (initializer, nodes):
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "store"
        assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "mlflow", "key": "MLFLOW_TRACKING_PASSWORD", "optional": True}
        assert env["MLFLOW_S3_ENDPOINT_URL"]["value"] == "http://10.0.0.1:8333"
        assert all("value" not in e or e["value"] != "s3cret" for e in env.values())


def test_gpu_nodes_get_the_placement_patch():
    job = build_pipeline_trainjob(request(), spec(resources={"cpu": "8", "memory": "32Gi", "gpu": {
        "count": 1, "product": "NVIDIA-H100-80GB-HBM3"}}), SETTINGS)
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["template"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_long_run_names_keep_distinct_admissible_trainjob_names():
    a, b = trainjob_name("team-" + "x" * 50 + "-g1-aaaa"), trainjob_name("team-" + "x" * 50 + "-g1-bbbb")
    assert a != b and max(len(a), len(b)) <= NAME_LIMIT


def backend(outputs: dict | None = None) -> tuple[TrainerBackend, FakeObjects]:
    objects = FakeObjects()
    return TrainerBackend(objects, SETTINGS, lambda run: dict(outputs or {})), objects


def test_submitting_a_run_twice_creates_one_trainjob():
    trainer, objects = backend()
    first = trainer.submit(request())
    again = trainer.submit(request())
    assert first.run_id == again.run_id and len(objects.objects) == 1
    assert first.phase == "Pending"


def test_phase_and_progress_come_from_the_trainjob():
    trainer, objects = backend(outputs={"model": {"name": "fraud", "version": "4"}})
    run = trainer.submit(request())
    namespace, name = run.run_id.split("/")
    objects.set_status("TrainJob", namespace, name, jobsStatus=[
        {"name": INITIALIZER, "succeeded": 1}, {"name": "node", "active": 2, "ready": 2}])
    running = trainer.status(run.run_id)
    assert running.phase == "Running" and running.progress == "dataset-initializer: 1 succeeded; node: 2 active, 2 ready"
    objects.set_status("TrainJob", namespace, name, conditions=[{"type": "Complete", "status": "True"}])
    done = trainer.status(run.run_id)
    assert done.phase == "Succeeded" and done.outputs["model"]["version"] == "4"


def test_a_trainjob_trainer_could_not_start_says_why_in_progress():
    """Trainer reports a JobSet it could not create only as an Event."""
    trainer, objects = backend()
    run = trainer.submit(request())
    namespace, name = run.run_id.split("/")
    assert trainer.status(run.run_id).progress == "TrainJob created, no Job started yet"
    for n, (kind, reason) in enumerate((("TrainJob", "TrainJobResourcesCreationFailed"), ("Pod", "Unrelated"))):
        objects.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"e{n}", "namespace": namespace},
                        "involvedObject": {"kind": kind, "name": name}, "type": "Warning", "reason": reason,
                        "message": "JobSet is invalid", "lastTimestamp": f"2026-11-27T10:00:0{n}Z"})
    status = trainer.status(run.run_id)
    assert status.phase == "Pending" and status.progress == (
        "no Job started yet: TrainJobResourcesCreationFailed: JobSet is invalid")


def test_a_trainjob_that_completed_without_registering_is_a_failure():
    trainer, objects = backend(outputs={})
    run = trainer.submit(request())
    objects.set_status("TrainJob", *run.run_id.split("/"), conditions=[{"type": "Complete", "status": "True"}])
    assert trainer.status(run.run_id).phase == "Failed" and "registered no version" in trainer.status(run.run_id).error


def test_a_failed_trainjob_says_trainers_reason_and_what_its_failed_pod_said_last():
    trainer, objects = backend()
    run = trainer.submit(request())
    namespace, name = run.run_id.split("/")
    failed_pod(objects, namespace, f"{name}-init", {"jobset.sigs.k8s.io/jobset-name": name}, 0,
               "Traceback ...\nFeastModuleImportError: Could not import module 'feast.infra.online_stores.redis'\n")
    failed_pod(objects, namespace, "other-init", {"jobset.sigs.k8s.io/jobset-name": "other"}, 1, "not this run's")
    objects.set_status("TrainJob", namespace, name, conditions=[
        {"type": "Failed", "status": "True", "message": "jobset failed: dataset-initializer backoff limit"}])
    failed = trainer.status(run.run_id)
    assert failed.phase == "Failed" and "dataset-initializer backoff limit" in failed.error
    assert failed.error.endswith("the Pod said: FeastModuleImportError: Could not import module "
                                 "'feast.infra.online_stores.redis'")


def failed_pod(objects: FakeObjects, namespace: str, name: str, labels: dict, n: int, said: str) -> None:
    """A Pod whose container ended with said as its termination message, n seconds into the minute."""
    objects.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, "labels": labels, "creationTimestamp": f"2026-11-28T10:00:0{n}Z"},
        "status": {"containerStatuses": [{"state": {"terminated": {
            "exitCode": 1, "message": said, "finishedAt": f"2026-11-28T10:01:0{n}Z"}}}]}})


def test_cancel_deletes_the_trainjob_and_the_run_is_gone():
    trainer, objects = backend()
    run = trainer.submit(request())
    trainer.cancel(run.run_id)
    assert objects.objects == {} and trainer.status(run.run_id) is None
    trainer.cancel(run.run_id)  # nothing left: a no-op


def test_a_job_without_a_published_store_fails_saying_what_to_set():
    trainer, objects = backend()
    job = spec(features={"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}})
    run = trainer.submit(request(job))
    assert run.phase == "Failed" and run.error == NO_STORE and "spec.features.store.configMap" in NO_STORE
    assert objects.objects == {} and trainer.status(run.run_id) is None  # nothing made: a resync submits again


def optimization(target: dict | None = None):  # noqa: ANN201 - RunRequest
    from kubeloop.api.optimization import OptimizedModelSpec

    optimized = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "alias": "champion"},
                                                   "target": target or {"device": "cpu"}, "techniques": ["onnx"]})
    return build_optimization_run(ObjectRef("OptimizedModel", "team-a", "fraud-fast", uid="u-2", generation=1),
                                  optimized, "3", "h4sh")


def test_an_optimisation_run_becomes_one_restricted_job_owned_by_its_optimizedmodel():
    """The Pod reads the run (the pinned source version, the spec as JSON)
    from its environment, and every credential by reference."""
    job = build_optimization_job(optimization(), SETTINGS)
    meta, pod = job["metadata"], job["spec"]["template"]["spec"]
    assert (job["kind"], meta["namespace"], job["spec"]["backoffLimit"]) == ("Job", "team-a", 1)
    assert is_optimization_job(meta["name"]) and not is_optimization_job(trainjob_name("team-a-fraud-g1"))
    assert meta["ownerReferences"][0] | {"uid": "u-2", "kind": "OptimizedModel", "name": "fraud-fast"} == \
        meta["ownerReferences"][0]
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == "reg/training:1" and container["command"][-1] == "kubeloop.components.optimizer_pod"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = env_of(container)
    run = OptimizationRun.from_json(env[OPTIMIZATION_ENV]["value"])
    assert (run.source_version, run.owner, run.git_sha) == ("3", "team-a/fraud-fast", "abc")
    assert json.loads(run.spec)["techniques"] == ["onnx"] and run.pipeline_run == meta["annotations"][RUN_ANNOTATION]
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "store", "key": "AWS_SECRET_ACCESS_KEY"}
    assert "nvidia.com/gpu" not in container["resources"]["limits"] and "tolerations" not in pod


def test_a_gpu_target_measures_on_a_gpu_of_its_product():
    pod = build_optimization_job(optimization({"device": "gpu", "gpuProduct": "NVIDIA-H100-80GB-HBM3"}),
                                 SETTINGS)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_an_optimisation_job_is_followed_to_its_registered_winner():
    trainer, objects = backend(outputs={"model": {"name": "fraud", "version": "5"}, "chosen": {"technique": "onnx"}})
    run = trainer.submit(optimization())
    again = trainer.submit(optimization())
    assert run.run_id == again.run_id and len(objects.objects) == 1
    namespace, name = run.run_id.split("/")
    assert run.phase == "Pending" and run.progress == "Job created, no Pod started yet"
    objects.set_status("Job", namespace, name, active=1)
    assert trainer.status(run.run_id).progress == "optimizer: 1 active"
    objects.set_status("Job", namespace, name, conditions=[{"type": "Complete", "status": "True"}], succeeded=1)
    done = trainer.status(run.run_id)
    assert done.phase == "Succeeded" and done.outputs["chosen"]["technique"] == "onnx"
    trainer.cancel(run.run_id)
    assert objects.objects == {} and trainer.status(run.run_id) is None


def test_a_run_whose_pod_no_node_can_take_says_what_the_scheduler_said():
    trainer, objects = backend()
    for run in (trainer.submit(optimization()), trainer.submit(request())):
        namespace, name = run.run_id.split("/")
        labels = {"job-name": name} if name.startswith("optimize-") else {"jobset.sigs.k8s.io/jobset-name": name}
        objects.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-0", "namespace": namespace,
                                                                        "labels": labels},
                        "status": {"phase": "Pending", "conditions": [{
                            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 1 Insufficient cpu."}]}})
        job = "job-name" in labels
        counted = {"active": 1} if job else {"jobsStatus": [{"name": "node", "active": 1}]}
        objects.set_status("Job" if job else "TrainJob", namespace, name, **counted)
        waiting = trainer.status(run.run_id)
        assert waiting.phase == "Running"
        assert waiting.progress.endswith(f"; Pod {name}-0 waits for a node: 0/3 nodes are available: 1 Insufficient "
                                         "cpu."), waiting.progress
        # Every active Pod ready: the run's Pods are not read at each status read (the Pod above is not seen).
        ready = {"active": 1, "ready": 1} if job else {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}
        objects.set_status("Job" if job else "TrainJob", namespace, name, **ready)
        assert "waits for a node" not in trainer.status(run.run_id).progress


def test_a_failed_optimisation_job_repeats_what_its_pod_said_last():
    trainer, objects = backend()
    run = trainer.submit(optimization())
    namespace, name = run.run_id.split("/")
    for n, said in enumerate(("Traceback ...\nValueError: first attempt", "Traceback ...\nValueError: fraud version 3 "
                              "has no exported/state.pt: it is not a network kubeloop trained\n")):
        failed_pod(objects, namespace, f"{name}-{n}", {"job-name": name}, n, said)
    objects.set_status("Job", namespace, name, failed=2, conditions=[
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the "
         "specified backoff limit"}])
    failed = trainer.status(run.run_id)
    assert failed.phase == "Failed" and failed.error.startswith(f"Job {run.run_id}: BackoffLimitExceeded")
    assert failed.error.endswith("the Pod said: ValueError: fraud version 3 has no exported/state.pt: it is not a "
                                 "network kubeloop trained")


def test_an_api_outage_is_retried_not_fatal():
    from kubeloop.kube import KubeError

    class Down(FakeObjects):
        def create(self, obj: dict) -> dict:
            raise KubeError(503, "ServiceUnavailable", "etcd leader changed")

    trainer = TrainerBackend(Down(), SETTINGS, lambda run: {})
    with pytest.raises(BackendUnavailable, match="503"):
        trainer.submit(request())


def test_a_trainjob_the_api_server_refuses_fails_the_run_with_its_reason():
    from kubeloop.kube import KubeError

    class Refusing(FakeObjects):
        def create(self, obj: dict) -> dict:
            raise KubeError(403, "Forbidden", 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied')

    run = TrainerBackend(Refusing(), SETTINGS, lambda run: {}).submit(request())
    assert run.phase == "Failed" and "validator.trainjob" in run.error
    assert json.dumps(build_pipeline_trainjob(request(), spec(), SETTINGS))  # plain data throughout
