"""NVIDIA's tritonclient against a serving front and the Triton behind it:
what each encoding a client can ask for must give the same either way."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# (input in binary, outputs named, output in binary): what a tritonclient user can ask for.
ENCODINGS = {
    "json in, json out": (False, True, False),
    "json in, the client's default out": (False, False, None),
    "binary in, binary out": (True, True, True),
    "binary in, json out": (True, True, False),
    "json in, binary out": (False, True, True),
}
REQUEST_ID = "conformance-1"


def ask(url: str, model: str, version: str, rows: np.ndarray, output: str, binary_in: bool, named: bool,
        binary_out: bool | None) -> httpclient.InferResult:
    tensor = httpclient.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(output, binary_data=binary_out)] if named else None
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), connection_timeout=10, network_timeout=10)
    return client.infer(model, [tensor], model_version=version, outputs=outputs, request_id=REQUEST_ID)


def assert_conforms(front: str, model: str, triton: Callable[[str], tuple[str, str]], rows: np.ndarray,
                    output: str) -> list[str]:
    """Every encoding through the front (model: the InferenceService's) and
    straight to the Triton of the version that answered (triton: version ->
    its url and Triton's model name) gives the same tensors, datatypes,
    binary-or-JSON form and request id, and so does the front asked for
    that version by name (/versions/V/infer); a tensor of the wrong shape is the
    same 400 from both. The versions that answered."""
    answered = []
    for encoding, (binary_in, named, binary_out) in ENCODINGS.items():
        through = ask(front, model, "", rows, output, binary_in, named, binary_out)
        version = through.get_response()["model_version"]
        url, name = triton(version)
        direct = ask(url, name, version, rows, output, binary_in, named, binary_out)
        assert through.as_numpy(output).shape[0] == len(rows), encoding
        np.testing.assert_array_equal(through.as_numpy(output), direct.as_numpy(output), err_msg=encoding)
        assert through.as_numpy(output).dtype == direct.as_numpy(output).dtype, encoding
        ours, theirs = through.get_output(output), direct.get_output(output)
        assert (ours["datatype"], ours["shape"]) == (theirs["datatype"], theirs["shape"]), encoding
        binary = ["binary_data_size" in o.get("parameters", {}) for o in (ours, theirs)]
        assert binary[0] == binary[1], (encoding, ours, theirs)
        assert through.get_response()["id"] == direct.get_response()["id"] == REQUEST_ID, encoding
        by_version = ask(front, model, version, rows, output, binary_in, named, binary_out)  # /versions/V/infer
        np.testing.assert_array_equal(by_version.as_numpy(output), direct.as_numpy(output), err_msg=encoding)
        answered.append(version)

    wrong = np.zeros((2, 3), dtype=np.float32)
    errors = []
    for url, name, asked in ((front, model, ""), (*triton(answered[0]), answered[0])):
        with pytest.raises(InferenceServerException) as refused:
            ask(url, name, asked, wrong, output, True, True, True)
        errors.append(refused.value)
    assert [e.status() for e in errors] == ["400", "400"], [str(e) for e in errors]
    return answered
