"""NVIDIA's own clients against an InferenceService's front and against
the Triton behind it. HTTP: every encoding tritonclient sends (JSON or the
binary tensor data extension in; JSON, binary, or the client's default of
binary when it names no outputs, out) gets the same tensors, the request's
id and the same datatypes through the front as from Triton direct, so do
bodies and answers compressed (gzip, deflate), a bad tensor gets the same
refusal, and the version's statistics have the same form. gRPC (the
status's grpcAddress): raw and typed tensors, outputs named or not, gzip,
a stream, the refusal, health, metadata, config and statistics, the same
way. Backend: local (the router process and real tritonserver)."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from tests.e2e.test_serving_local import get, isvc
from tests.support.conformance import assert_conforms, assert_grpc_conforms
from tests.support.models import register_model, synthetic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_tritonclient_gets_the_same_answers_and_refusals_from_the_front_as_from_triton_in_every_encoding(
        platform, kube, namespace, start_operator):
    env = platform.env()
    operator = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                              KUBELOOP_SERVING_BACKENDS="local", KUBELOOP_SERVING_BACKEND="local")
    model = f"{namespace}-fraud"
    version = register_model(env["MLFLOW_TRACKING_URI"], model, seed=1)
    MlflowClient(env["MLFLOW_TRACKING_URI"]).set_registered_model_alias(model, "champion", version)
    kube.create(isvc(namespace, model))
    status = wait_for(lambda: (s := (get(kube, namespace) or {}).get("status", {})).get("phase") == "Ready" and s,
                      timeout=120, what="the service Ready")
    folder = next((operator.log_dir.parent / "work" / "serving").glob("*/router.json")).parent
    config = json.loads((folder / "router.json").read_text())
    rows = synthetic(rows=4, seed=3)[0]
    answered = assert_conforms(status["url"], model, lambda _: (config["triton_url"], config["triton_model"]),
                               rows, config["output"])
    triton_grpc = f"127.0.0.1:{json.loads((folder / 'state.json').read_text())['ports']['grpc']}"
    answered += assert_grpc_conforms(status["grpcAddress"], model, lambda _: (triton_grpc, config["triton_model"]),
                                     rows, config["output"])
    assert set(answered) == {version}
