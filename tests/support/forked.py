"""What the platform's fork server (kubeloop.forkserver) ran for a test:
the operators that tests start share the session platform's server."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kubeloop.processes import RECORD_SUFFIX, ProcessRecord


class ForkLog:
    """The server's log from the moment this was made."""

    def __init__(self, platform_dir: Path):
        self.path = Path(platform_dir) / "forkserver" / "server.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def since(self) -> str:
        return self.path.read_bytes()[self.start:].decode() if self.path.exists() else ""


def forked_steps(platform_dir: Path) -> list:
    """What the platform's fork server runs now (its children), as psutil Processes."""
    import psutil

    record = ProcessRecord.read(Path(platform_dir) / "forkserver" / f"server{RECORD_SUFFIX}")
    if record is None or not record.running():
        return []
    return psutil.Process(record.pid).children(recursive=True)


@contextmanager
def held(processes: list) -> Iterator[None]:
    """Stop the processes (SIGSTOP) for the block, and let them go on after it."""
    import psutil

    for process in processes:
        process.suspend()
    try:
        yield
    finally:
        for process in processes:
            try:
                process.resume()
            except psutil.NoSuchProcess:
                pass
