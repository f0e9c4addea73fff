"""The MLflow client settings the operator and CLI start with
(kubeloop.registry.mlflow.fail_fast; backend-independent: the client is
MLflow's own, the same on the local and cluster paths)."""

from __future__ import annotations

import os

from mlflow.utils.request_utils import _get_request_session

from kubeloop.registry.mlflow import CONNECTIONS_KEPT, fail_fast


def _environment_without(monkeypatch, *names: str) -> None:  # noqa: ANN001
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names})


def test_mlflows_session_keeps_a_connection_for_each_thread_that_asks_at_once(monkeypatch):
    _environment_without(monkeypatch, "MLFLOW_HTTP_POOL_MAXSIZE")
    fail_fast()
    # Arguments no other caller uses: MLflow caches one session per set.
    session = _get_request_session(3, 0.37, 0.0, (503,), False, True)
    assert session.get_adapter("http://127.0.0.1:5000")._pool_maxsize == CONNECTIONS_KEPT


def test_a_pool_size_the_user_set_is_kept(monkeypatch):
    _environment_without(monkeypatch, "MLFLOW_HTTP_POOL_MAXSIZE")
    os.environ["MLFLOW_HTTP_POOL_MAXSIZE"] = "5"
    fail_fast()
    assert os.environ["MLFLOW_HTTP_POOL_MAXSIZE"] == "5"
    assert _get_request_session(3, 0.41, 0.0, (503,), False, True).get_adapter("http://x")._pool_maxsize == 5
