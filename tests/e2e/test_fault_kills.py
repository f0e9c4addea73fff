"""The operator SIGKILLed at random points while a TrainingJob trains, an
OptimizedModel optimises its model and an InferenceService serves it (local
backends: local pipelines, local Triton; the cluster backends are not
exercised here).

Scale: 8 kills, each after a random 3-20 s (seed printed), during a run of
the three examples shrunk to fit a shared two-core machine (2 epochs, two
optimisation techniques, batch sizes 1 and 8). The same three objects run at
the same time in a second namespace under an operator nobody kills; both runs
must end in the same state (final_state says what is compared).

A kill point no timing can aim at (after a promotion, before the status
write) is made deterministic by leaving the state such a kill leaves: the
status the object had before the write, written back while the operator is
down."""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.operator.converging import status_changes
from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail
from tests.support.faults import served_processes, status_of, training_job
from tests.support.namespaces import create_namespace, delete_namespace
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KILLS = 8
OPTIMIZED = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "optimizedmodel.yaml").read_text())


def examples(namespace: str, own_model: bool = True) -> tuple[dict, dict, dict]:
    """The three examples shrunk to fit; own_model: the OptimizedModel registers
    under a model of its own (else, as the shipped example, under its
    source's, promoting its winner to champion)."""
    job = training_job(namespace, "fraud")
    model = job["spec"]["modelName"]
    job["spec"]["promotion"] = {"registerAs": "challenger", "promoteTo": "champion",
                                "gates": {"metrics": [{"metric": "auc", "min": 0.5}]}}
    om = copy.deepcopy(OPTIMIZED)
    om["metadata"] = {"name": "fraud-cpu", "namespace": namespace}
    om["spec"].update(source={"name": model, "alias": "champion"}, techniques=["onnx", "dynamic-int8"],
                      batchSizes=[1, 8], latencySLO={"percentile": "p99", "milliseconds": 1000, "batchSize": 8},
                      promotion={"registerAs": "challenger"})
    if own_model:
        om["spec"]["registeredName"] = f"{model}-cpu"
    else:  # gates that pass whatever the shared machine measures
        om["spec"]["promotion"] = {"registerAs": "challenger", "promoteTo": "champion",
                                   "gates": {"notWorseThanChampion": False}}
    isvc = {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": "fraud", "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "local"}}
    return job, om, isvc


@pytest.fixture
def undisturbed_namespace(kube):
    name = create_namespace(kube)
    yield name
    delete_namespace(kube, name)


def test_the_operator_killed_at_random_points_converges_without_duplicates(platform, kube, namespace,
                                                                          undisturbed_namespace, local_operator,
                                                                          tmp_path):
    """Local: after 8 SIGKILLs, the examples end as an undisturbed run of the
    same examples ends (before, only invariants were checked)."""
    seed = random.SystemRandom().randrange(2**32)
    print(f"operator kill seed: {seed}")
    rng = random.Random(seed)
    reference = local_operator(watch=undisturbed_namespace, work=tmp_path / "undisturbed")
    op = local_operator()
    for ns in (namespace, undisturbed_namespace):
        for obj in examples(ns):
            kube.create(obj)
    for _ in range(KILLS):
        _pause(op, rng.uniform(3, 20))  # the kill lands wherever the operator happens to be
        op.kill()
        op.start().wait_for_log("Initial authentication has finished", timeout=60)

    wait_for(lambda: finished(kube, namespace) and finished(kube, undisturbed_namespace), timeout=900, interval=2,
             what="every object of both runs finished")
    assert reference.running() and reference.starts == 1, "the reference run was not disturbed"
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    killed = final_state(kube, uri, namespace, op.work)
    undisturbed = final_state(kube, uri, undisturbed_namespace, reference.work)
    print(f"final state of both runs: {undisturbed}")
    assert killed == undisturbed
    # What the undisturbed run itself must show (else both could agree on a broken end).
    assert [s["phase"] for s in undisturbed["objects"].values()] == ["Succeeded", "Succeeded", "Ready"]
    assert undisturbed["models"]["<ns>-fraud"]["versions"] == ["1"]
    assert undisturbed["models"]["<ns>-fraud-cpu"]["versions"] == ["1"]
    assert undisturbed["runs"] == 2 and undisturbed["served"] == {"tritonserver": 1, "router": 1}


def test_a_kill_between_promoting_its_own_source_alias_and_the_status_write_leaves_it_succeeded(
        platform, kube, namespace, local_operator):
    """The kill point the random kills once hit, made deterministic: the
    shipped example optimises champion and promotes its winner to champion.
    A SIGKILL lands after the promotion and before the status write, which
    no timing can aim at; the test leaves the same state behind instead: it
    lets the run finish and promote, kills the operator, and writes back the
    status the object had while its run was going (so the write is lost).
    The restarted operator resolves champion at the object's own output, and
    must find the same run, not start a second for that output (which fails:
    an optimised version cannot be optimised again)."""
    op = local_operator()
    job, om, _ = examples(namespace, own_model=False)
    model = job["spec"]["modelName"]
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    kube.create(job)
    wait_for(lambda: status_of(kube, "TrainingJob", namespace, "fraud").get("phase") in ("Succeeded", "Failed"),
             timeout=400, interval=1, what="training")
    assert client.get_registered_model(model).aliases["champion"] == "1"

    kube.create(om)
    running = copy.deepcopy(wait_for(
        lambda: (s := status_of(kube, "OptimizedModel", namespace, "fraud-cpu")).get("runId")
        and s.get("phase") == "Running" and s, timeout=120, interval=0.2, what="the optimisation run started"))
    done = wait_for(lambda: (s := status_of(kube, "OptimizedModel", namespace, "fraud-cpu")).get("phase")
                    in ("Succeeded", "Failed") and s, timeout=600, interval=1, what="the optimisation finished")
    assert done["phase"] == "Succeeded" and done["model"]["version"] == "2", done
    assert client.get_registered_model(model).aliases["champion"] == "2"

    op.kill()
    kube.merge_patch(API_VERSION, "OptimizedModel", "fraud-cpu", {"status": status_changes(done, running)},
                     namespace, subresource="status")
    assert status_of(kube, "OptimizedModel", namespace, "fraud-cpu").get("phase") == "Running"
    op.start().wait_for_log("Initial authentication has finished", timeout=60)

    after = wait_for(lambda: (s := status_of(kube, "OptimizedModel", namespace, "fraud-cpu")).get("phase")
                     in ("Succeeded", "Failed") and s, timeout=120, interval=1, what="the rewound object converged")
    assert after["phase"] == "Succeeded", after
    assert (after["runId"], after["model"]["version"], after["sourceVersion"]) == (running["runId"], "2", "1")
    assert client.get_registered_model(model).aliases["champion"] == "2"
    assert sorted(v.version for v in client.search_model_versions(f"name = '{model}'")) == ["1", "2"]
    assert len(list((op.work / "runs").iterdir())) == 2, "the training run and one optimisation run"
    moves = [(e.action, e.version) for e in audit_trail(MlflowRegistry(platform.env()["MLFLOW_TRACKING_URI"]), model)
             if e.alias == "champion"]
    assert moves == [("promote", "1"), ("promote", "2")]


OBJECTS = (("TrainingJob", "fraud"), ("OptimizedModel", "fraud-cpu"), ("InferenceService", "fraud"))


def finished(kube, namespace: str) -> bool:
    phases = [status_of(kube, kind, namespace, name).get("phase") for kind, name in OBJECTS]
    return all(p in ("Succeeded", "Failed", "Ready", "Degraded") for p in phases)


def final_state(kube, tracking_uri: str, namespace: str, work: Path) -> dict:
    """What two runs of the same examples must agree on, with the namespace
    taken out of names: each object's phase, conditions (type, status, reason)
    and the versions it points at; each registered model's versions, aliases
    and audit trail; how many pipeline runs and serving processes exist.
    Measurements (metrics, latencies, the variant that won, messages quoting
    them) are left out: two runs on a shared machine measure differently."""
    client = MlflowClient(tracking_uri)
    objects = {}
    for kind, name in OBJECTS:
        status = status_of(kube, kind, namespace, name)
        objects[f"{kind}/{name}"] = {
            "phase": status.get("phase"),
            "conditions": sorted((c["type"], c["status"], c["reason"]) for c in status.get("conditions", [])),
            "model": (status.get("model") or {}).get("version"), "source": status.get("sourceVersion"),
            "served": (status.get("modelVersion"), status.get("canaryVersion"), status.get("readyReplicas")),
        }
    models = {}
    for name in (f"{namespace}-fraud", f"{namespace}-fraud-cpu"):
        aliases = client.get_registered_model(name).aliases
        models[name.replace(namespace, "<ns>")] = {
            "versions": sorted(v.version for v in client.search_model_versions(f"name = '{name}'")),
            "aliases": dict(sorted(aliases.items())),
            "audit": [(e.action, e.alias, e.version, e.previous) for e in audit_trail(MlflowRegistry(tracking_uri), name)],
        }
    return {"objects": objects, "models": models, "runs": len(list((work / "runs").iterdir())),
            "served": served_processes(work)}


def _pause(op, seconds: float) -> None:  # noqa: ANN001 - OperatorProcess
    """Let the operator work for a while (chooses a kill point; nothing is checked after it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and op.running():
        time.sleep(0.2)
