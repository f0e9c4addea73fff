"""MLflow's request-header plugins as kubeloop's processes load them
(kubeloop.registry.headers), with the real MLflow client and Feast's real
plugin, each case in an interpreter of its own (what a process has imported
is the point). A process that asks MLflow through kubeloop's registry no
longer imports Feast; where Feast opens its token scope, its token still
reaches MLflow. Proves the local operator's, the model puller's and the
outcome Job's processes alike: none depends on the backend."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import EntryPoint

import pytest

from kubeloop.registry.headers import FEAST_AUTH, GROUP, FeastHeaders, standing_in


@pytest.fixture
def mlflow_server():
    """An HTTP server that answers MLflow's registered-model searches with none
    and keeps the headers of every request it got."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(dict(self.headers))
            body = json.dumps({"registered_models": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_that_asks_mlflow_through_the_registry_does_not_import_feast(mlflow_server):
    url, seen = mlflow_server
    found = run(f"""
import json, sys
from kubeloop.registry.mlflow import MlflowRegistry
from mlflow import MlflowClient
MlflowClient({url!r}).search_registered_models()
from mlflow.tracking.request_header.registry import _request_header_provider_registry as registry
print(json.dumps({{"feast": sorted(m for m in sys.modules if m == "feast" or m.startswith("feast.")),
                   "torch": "torch" in sys.modules,
                   "providers": [type(p).__name__ for p in registry]}}))
""")
    assert found["feast"] == [] and not found["torch"], found
    assert "FeastHeaders" in found["providers"], found
    assert "FeastMLflowHeaderProvider" not in found["providers"], found
    assert len(seen) == 1 and "Authorization" not in seen[0]


def test_feasts_token_still_reaches_mlflow_inside_its_scope_and_only_there(mlflow_server):
    url, seen = mlflow_server
    run(f"""
import json
from kubeloop.registry.headers import defer_feast_headers
defer_feast_headers()
from mlflow import MlflowClient
client = MlflowClient({url!r})
client.search_registered_models()
from {FEAST_AUTH} import mlflow_token_scope
with mlflow_token_scope("team-token"):
    client.search_registered_models()
client.search_registered_models()
print(json.dumps({{}}))
""")
    assert [h.get("Authorization") for h in seen] == [None, "Bearer team-token", None]


def test_only_feasts_plugin_is_stood_in_for():
    points = [EntryPoint("feast", f"{FEAST_AUTH}:FeastMLflowHeaderProvider", GROUP),
              EntryPoint("team", "team_headers:Provider", GROUP)]
    stood = standing_in(points)
    assert [p.name for p in stood] == ["feast", "team"]
    assert stood[0].load() is FeastHeaders
    assert stood[1] == points[1]
