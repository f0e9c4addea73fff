"""The no-op backend: every run succeeds at once and trains nothing.

It exists for tests of the operator's own behaviour and for its benchmarks,
where the cost of training would hide the cost of reconciling.
"""

from __future__ import annotations

import threading

from kubeloop.pipelines.backends.base import PipelineBackend, RunRequest, RunStatus


class NoopBackend(PipelineBackend):
    name = "noop"

    def __init__(self) -> None:
        self._runs: dict[str, RunStatus] = {}
        self._lock = threading.Lock()
        self.submissions = 0

    def submit(self, request: RunRequest) -> RunStatus:
        with self._lock:
            if request.name not in self._runs:
                self.submissions += 1
                self._runs[request.name] = RunStatus(
                    run_id=request.name, phase="Succeeded",
                    outputs={"noop": True}, progress="noop backend: nothing was run",
                )
            return self._runs[request.name]

    def status(self, run_id: str) -> RunStatus | None:
        # The name is the id, so a restarted operator still finds its runs.
        with self._lock:
            return self._runs.get(run_id) or RunStatus(
                run_id=run_id, phase="Succeeded", outputs={"noop": True},
                progress="noop backend: nothing was run")

    def cancel(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
