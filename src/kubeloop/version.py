"""The version of the code, for lineage."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# The image kubeloop's pipeline steps and model pullers run, built from this
# version (images/Dockerfile, --target components); the operator's default.
COMPONENTS_IMAGE = "ghcr.io/kubeloop/components:0.1.0"


def git_sha() -> str:
    """The checkout's commit (with a -dirty suffix for local changes), the
    KUBELOOP_GIT_SHA that images are built with, or "unknown"."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("KUBELOOP_GIT_SHA", "unknown")
