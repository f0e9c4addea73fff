"""Monitoring jobs (drift, outcomes) as background processes on the operator's machine; their
results are files the operator's /metrics and the reconciler read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kubeloop.api.refs import ObjectRef
from kubeloop import forkserver, processes
from kubeloop.monitoring.base import DRIFT, DriftMonitor, JobKind, read_latest


class LocalDriftMonitor(DriftMonitor):
    def __init__(self, work_dir: Path, tracking_uri: str, feast_repo: str = "", kind: JobKind = DRIFT,
                 forkserver: Path | None = None):
        """forkserver: the folder whose fork server starts the jobs (None: each
        job a fresh interpreter)."""
        self.kind = kind
        self.forkserver = forkserver
        self.root = Path(work_dir) / kind.folder
        self.where = {"tracking_uri": tracking_uri, "feast_repo": feast_repo}
        """MLflow and the default feature repository, as this machine reaches them."""

    def folder(self, ref: ObjectRef) -> Path:
        return self.root / f"{ref.namespace}-{ref.name}"

    def _record(self, ref: ObjectRef) -> processes.ProcessRecord | None:
        return processes.ProcessRecord.read(self.folder(ref) / "process.json")

    def running(self, ref: ObjectRef) -> bool:
        record = self._record(ref)
        if record is not None:
            processes.reap(record.pid)
        return record is not None and record.running()

    def start(self, ref: ObjectRef, job: dict) -> None:
        if self.running(ref):
            return
        folder = self.folder(ref)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "job.json").write_text(json.dumps({**job, **self.where}, indent=2))
        python, env = forkserver.python(self.forkserver)
        record = processes.start(self.kind.name, [python, "-m", self.kind.module, str(folder)], folder / "logs",
                                 env=env)
        (folder / "process.json").write_text(json.dumps(record.to_dict()))

    def latest(self, ref: ObjectRef) -> dict | None:
        return read_latest(self.folder(ref))

    def forget(self, ref: ObjectRef) -> None:
        record = self._record(ref)
        if record is not None:
            processes.stop(record)
        shutil.rmtree(self.folder(ref), ignore_errors=True)
