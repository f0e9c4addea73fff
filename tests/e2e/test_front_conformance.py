"""NVIDIA's own HTTP client against an InferenceService's front and against
the Triton behind it: every encoding tritonclient sends (JSON or the binary
tensor data extension in; JSON, binary, or the client's default of binary
when it names no outputs, out) gets the same tensors, the request's id and
the same datatypes through the front as from Triton direct, and a bad
tensor the same refusal. Backend: local
(the router process and real tritonserver)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from mlflow import MlflowClient
from tritonclient.utils import InferenceServerException

from tests.e2e.test_serving_local import get, isvc
from tests.support.models import register_model, synthetic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

# (input in binary, outputs named, output in binary): what a tritonclient user can ask for.
ENCODINGS = {
    "json in, json out": (False, True, False),
    "json in, the client's default out": (False, False, None),
    "binary in, binary out": (True, True, True),
    "binary in, json out": (True, True, False),
    "json in, binary out": (False, True, True),
}


@pytest.fixture
def served(platform, kube, namespace, start_operator):
    """A champion served by the local backend: (front url, model, Triton url,
    Triton's model name, the version, its output)."""
    env = platform.env()
    operator = start_operator([namespace], KUBELOOP_REGISTRY="mlflow", MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"],
                              KUBELOOP_SERVING_BACKENDS="local", KUBELOOP_SERVING_BACKEND="local")
    model = f"{namespace}-fraud"
    version = register_model(env["MLFLOW_TRACKING_URI"], model, seed=1)
    MlflowClient(env["MLFLOW_TRACKING_URI"]).set_registered_model_alias(model, "champion", version)
    kube.create(isvc(namespace, model))
    status = wait_for(lambda: (s := (get(kube, namespace) or {}).get("status", {})).get("phase") == "Ready" and s,
                      timeout=120, what="the service Ready")
    config = json.loads(next((operator.log_dir.parent / "work" / "serving").glob("*/router.json")).read_text())
    return status["url"], model, config["triton_url"], config["triton_model"], version, config["output"]


def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url.removeprefix("http://"), connection_timeout=10, network_timeout=10)


def ask(url: str, model: str, version: str, rows: np.ndarray, output: str, binary_in: bool, named: bool,
        binary_out: bool | None) -> httpclient.InferResult:
    tensor = httpclient.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(output, binary_data=binary_out)] if named else None
    return client(url).infer(model, [tensor], model_version=version, outputs=outputs, request_id="conformance-1")


def test_tritonclient_gets_the_same_answers_and_refusals_from_the_front_as_from_triton_in_every_encoding(served):
    front, model, triton, triton_model, version, output = served
    rows = synthetic(rows=4, seed=3)[0]
    for encoding, (binary_in, named, binary_out) in ENCODINGS.items():
        through = ask(front, model, "", rows, output, binary_in, named, binary_out)
        direct = ask(triton, triton_model, version, rows, output, binary_in, named, binary_out)
        assert through.as_numpy(output).shape[0] == 4, encoding
        np.testing.assert_array_equal(through.as_numpy(output), direct.as_numpy(output), err_msg=encoding)
        assert through.as_numpy(output).dtype == direct.as_numpy(output).dtype, encoding
        theirs, ours = direct.get_output(output), through.get_output(output)
        assert (ours["datatype"], ours["shape"]) == (theirs["datatype"], theirs["shape"]), encoding
        binary = ["binary_data_size" in o.get("parameters", {}) for o in (ours, theirs)]
        assert binary[0] == binary[1], (encoding, ours, theirs)
        assert through.get_response()["id"] == direct.get_response()["id"] == "conformance-1", encoding
        assert through.get_response()["model_version"] == version, encoding

    # A tensor of the wrong shape: the caller sees the same refusal either way.
    errors = []
    for url, name, asked in ((front, model, ""), (triton, triton_model, version)):
        with pytest.raises(InferenceServerException) as refused:
            ask(url, name, asked, np.zeros((2, 3), dtype=np.float32), output, True, True, True)
        errors.append(refused.value)
    assert [e.status() for e in errors] == ["400", "400"], [str(e) for e in errors]
