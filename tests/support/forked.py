"""What the platform's fork server (kubeloop.forkserver) ran for a test:
the operators that tests start share the session platform's server."""

from __future__ import annotations

from pathlib import Path


class ForkLog:
    """The server's log from the moment this was made."""

    def __init__(self, platform_dir: Path):
        self.path = Path(platform_dir) / "forkserver" / "server.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def since(self) -> str:
        return self.path.read_bytes()[self.start:].decode() if self.path.exists() else ""
