"""Score rows with a registered version's ONNX export (every version kubeloop
registers has one, trained or optimised): one score or value per row, or a
probability per class for multiclass models."""

from __future__ import annotations

import tempfile

import numpy as np

from kubeloop.registry.base import ModelVersion


def score_version(tracking_uri: str, version: ModelVersion, x: np.ndarray) -> np.ndarray:
    import mlflow
    import onnxruntime as ort

    mlflow.set_tracking_uri(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        path = mlflow.artifacts.download_artifacts(f"runs:/{version.run_id}/exported/model.onnx", dst_path=tmp)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out = np.concatenate([session.run(None, {"features": x[i:i + 8192].astype(np.float32)})[0]
                              for i in range(0, len(x), 8192)])
        return out if out.ndim == 2 and out.shape[1] > 1 else out.reshape(-1)
