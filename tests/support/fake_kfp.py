"""A small in-memory Kubeflow Pipelines v2beta1 REST API, enough for
kfp.Client to create experiments and runs, list, get and terminate them.

Used only by the unit test of the kfp backend; no KFP server runs here.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class FakeKfp:
    def __init__(self):
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.down = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeKfp":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()

    def set_state(self, run_id: str, state: str, error: str | None = None) -> None:
        self.runs[run_id]["state"] = state
        if error:
            self.runs[run_id]["error"] = {"message": error}

    def _handler(self):  # noqa: ANN202
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(("GET", self.path))
                if fake.down:
                    return self._reply(503, {"error": "unavailable"})
                url = urlparse(self.path)
                query = parse_qs(url.query)
                if url.path.endswith("/healthz"):
                    return self._reply(200, {"multi_user": False})
                if url.path == "/apis/v2beta1/experiments":
                    items = list(fake.experiments.values())
                    name = _filter_value(query)
                    if name is not None:
                        items = [e for e in items if e["display_name"] == name]
                    return self._reply(200, {"experiments": items, "total_size": len(items)})
                if url.path == "/apis/v2beta1/runs":
                    items = list(fake.runs.values())
                    name = _filter_value(query)
                    if name is not None:
                        items = [r for r in items if r["display_name"] == name]
                    return self._reply(200, {"runs": items, "total_size": len(items)})
                match = re.fullmatch(r"/apis/v2beta1/runs/([^/]+)", url.path)
                if match and match.group(1) in fake.runs:
                    return self._reply(200, fake.runs[match.group(1)])
                return self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                fake.requests.append(("POST", self.path))
                if fake.down:
                    return self._reply(503, {"error": "unavailable"})
                body = self._body()
                if self.path == "/apis/v2beta1/experiments":
                    exp = {"experiment_id": str(uuid.uuid4()), "display_name": body["display_name"]}
                    fake.experiments[exp["experiment_id"]] = exp
                    return self._reply(200, exp)
                if self.path == "/apis/v2beta1/runs":
                    run = {"run_id": str(uuid.uuid4()), "display_name": body["display_name"],
                           "experiment_id": body.get("experiment_id"), "state": "PENDING",
                           "pipeline_spec": body.get("pipeline_spec"),
                           "runtime_config": body.get("runtime_config")}
                    fake.runs[run["run_id"]] = run
                    return self._reply(200, run)
                match = re.fullmatch(r"/apis/v2beta1/runs/([^/:]+):terminate", self.path)
                if match:
                    fake.set_state(match.group(1), "CANCELED")
                    return self._reply(200, {})
                return self._reply(404, {"error": "not found"})

        return Handler


def _filter_value(query: dict) -> str | None:
    if "filter" not in query:
        return None
    predicates = json.loads(query["filter"][0]).get("predicates", [])
    for p in predicates:
        if p.get("key") in ("display_name", "name"):
            return p.get("string_value") or p.get("stringValue")
    return None
