"""The local backend's worker: runs one pipeline with kfp's local runner and
keeps the run's state file current (phase, the step being run, outputs, and
the failing step's error)."""

from __future__ import annotations

import io
import json
import re
import sys
import traceback
from pathlib import Path

from kubeloop import forkserver
from kubeloop.processes import single_process_metrics
from kubeloop.pipelines.backends.local import write_state

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TASK_STARTED = re.compile(r"Executing task '([^']+)'")
ERROR_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)):\s*(.*)$")


def pipeline_function(name: str):  # noqa: ANN201 - a kfp pipeline
    if name == "training":
        from kubeloop.pipelines.training import training_pipeline

        return training_pipeline
    if name == "optimization":
        from kubeloop.pipelines.optimization import optimization_pipeline

        return optimization_pipeline
    raise ValueError(f"unknown pipeline {name}")


class ProgressTee(io.TextIOBase):
    """stdout that also turns kfp's "Executing task 'x'" lines into the run's
    progress (kfp replaces the root logger's handlers, so a handler would not
    see them)."""

    def __init__(self, stream, run_dir: Path):  # noqa: ANN001 - a text stream
        self.stream, self.run_dir = stream, run_dir

    def write(self, text: str) -> int:
        match = TASK_STARTED.search(ANSI.sub("", text))
        if match:
            write_state(self.run_dir, progress=f"running step {match.group(1)}")
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def step_error(log_text: str, failed_task: str | None) -> str:
    """The failing step and the last exception line it printed."""
    text = ANSI.sub("", log_text)
    marker = f"Task '{failed_task}' finished with status FAILURE" if failed_task else None
    if marker and marker in text:
        text = text[: text.index(marker)]
    lines = [m.group(0).strip() for line in text.splitlines() if (m := ERROR_LINE.match(line))]
    detail = lines[-1] if lines else "see the worker log"
    return f"step {failed_task}: {detail}" if failed_task else detail


def main(run_dir: Path) -> int:
    from kfp import local

    request = json.loads((run_dir / "request.json").read_text())
    write_state(run_dir, phase="Running", progress="starting the pipeline")
    sys.stdout = ProgressTee(sys.stdout, run_dir)
    # kfp starts each step as `sys.executable -m kfp.dsl.executor_main ...`:
    # kubeloop-python forks it from the platform's warm interpreter instead.
    sys.executable = forkserver.client_executable() or sys.executable
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(run_dir / "root"),
               raise_on_error=True)
    pipeline = pipeline_function(request["pipeline"])
    # The steps start in prometheus-client's single-process mode, whatever the
    # imports above set (each step that imports feast then owns its own folder).
    single_process_metrics()
    try:
        task = pipeline(**request["arguments"])
    except Exception as exc:  # the pipeline, or kfp's runner, failed
        sys.stdout.flush()
        message = ANSI.sub("", str(exc))
        failed = re.search(r"Inner task failed: '([^']+)'", message)
        log_text = (run_dir / "worker.log").read_text(errors="replace")
        error = step_error(log_text, failed.group(1) if failed else None) if failed else message
        traceback.print_exc()
        write_state(run_dir, phase="Failed", error=error, progress=None)
        return 1
    write_state(run_dir, phase="Succeeded", outputs=task.output, progress="finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
