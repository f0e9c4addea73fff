"""Run `kubeloop operator` as a real process against the local platform."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from kubeloop import processes


class OperatorProcess:
    """The operator in a subprocess, started and stopped (or killed) at will."""

    def __init__(self, kubeconfig: Path, log_dir: Path, env: dict[str, str] | None = None,
                 namespaces: list[str] | None = None):
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.namespaces = namespaces or []
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> "OperatorProcess":
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "kubeloop.cli", "operator"]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        # As a Deployment starts it: nothing that an import in this test process
        # (feast's prometheus-client folder) put in the environment.
        env = processes.child_env({"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.env})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to clean up, as in a node failure."""
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_mib(self) -> float:
        """Resident memory of the operator and its children."""
        if not self.running():
            return 0.0
        root = psutil.Process(self.proc.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.running():
                raise RuntimeError(f"operator exited:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"'{text}' not in the operator log after {timeout} s:\n{self.log()[-3000:]}")
