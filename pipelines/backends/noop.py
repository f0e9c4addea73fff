"""The no-op backend: every run succeeds at once and trains nothing.

It exists for tests of the operator's own behaviour and for its benchmarks,
where the cost of training would hide the cost of reconciling. It keeps no
record of runs (every name is a run that succeeded), so churning objects
through it leaves nothing behind in the operator.
"""

from __future__ import annotations

from kubeloop.pipelines.backends.base import PipelineBackend, RunRequest, RunStatus


class NoopBackend(PipelineBackend):
    name = "noop"

    def submit(self, request: RunRequest) -> RunStatus:
        return _succeeded(request.name)

    def status(self, run_id: str) -> RunStatus | None:
        # The name is the id, so a restarted operator still finds its runs.
        return _succeeded(run_id)

    def cancel(self, run_id: str) -> None:
        """Nothing runs, so nothing is stopped."""


def _succeeded(run_id: str) -> RunStatus:
    return RunStatus(run_id=run_id, phase="Succeeded", outputs={"noop": True}, progress="noop backend: nothing was run")
